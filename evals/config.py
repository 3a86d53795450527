"""The typed config of eval.py (composed by Hydra from configs/eval.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from evals.tasks import TASKS


def expand_tasks(names: list[str]) -> list[str]:
    """Task names in order, ``all`` = val and every downstream task; unknown names raise."""
    out: list[str] = []
    for name in names:
        group = ["val", *TASKS] if name == "all" else [name]
        for t in group:
            if t != "val" and t not in TASKS:
                raise ValueError(f"unknown task {t!r}; valid tasks: val, {', '.join(TASKS)}, all")
            if t not in out:
                out.append(t)
    return out


ALL = "all"  # val_tokens=all: the whole validation split


@dataclass
class EvalConfig:
    checkpoint: str | None = None  # a step_N.pt file, a run directory, or an HF GPT-2 directory
    tasks: list[str] = field(default_factory=lambda: ["val", "hellaswag"])  # or [all]
    limit: int | None = None  # first N examples of each downstream task; None: all
    batch_size: int = 32  # (context, continuation) requests per forward pass
    data_dir: str = "data/eval"  # the cache of scripts/get_eval_data.py
    # None: the run's eval_tokens; "all": the whole validation split; N: the first N tokens
    val_tokens: int | str | None = None
    val_batch_size: int | None = None  # None: the run's micro_batch_size
    val_data_dir: str | None = None  # None: the run's data.dir
    out: str | None = None  # results JSON; None: <run>/eval/step_N.json
    name: str | None = None  # the row label of the printed table; None: optimizer, model, step
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | float32 | bfloat16
    progress: bool = True  # tqdm progress bars on rank 0

    def __post_init__(self) -> None:
        self.tasks = expand_tasks(list(self.tasks))
        if not self.tasks:
            raise ValueError("tasks is empty; name at least one of val, hellaswag, ..., all")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for every example), got {self.limit}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        v = self.val_tokens
        if v is not None and v != ALL and (isinstance(v, (bool, str)) or v < 1):
            # 0 once meant the whole split here while train.py refuses eval_tokens=0: one
            # meaning for both, and a word for the whole split (null is the run's own budget)
            raise ValueError(f"val_tokens must be a number of tokens >= 1, got {v!r}: "
                             "val_tokens=all evaluates the whole validation split, null (the "
                             "default) the run's eval_tokens")  # fmt: skip
        if self.val_batch_size is not None and self.val_batch_size < 1:
            raise ValueError(f"val_batch_size must be >= 1, got {self.val_batch_size}")

    def val_budget(self, run_eval_tokens: int | None) -> int | None:
        """The validation's number of tokens (None: the whole split): ``val_tokens``, or the
        run's ``eval_tokens`` where it is null."""
        if self.val_tokens is None:
            return run_eval_tokens
        return None if self.val_tokens == ALL else int(self.val_tokens)
