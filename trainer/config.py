"""The typed top-level config. Hydra (trainer/command_line.py) composes YAML onto these
dataclasses, so a misspelt key or a wrong type fails when the config is composed, before anything
runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from data import DataConfig
from model import GPTConfig
from optim import ScheduleConfig
from runtime.attention import check_sdpa_backend
from trainer.nonfinite import NonFiniteConfig

WANDB_MODES = ("online", "offline", "disabled")
CHECKPOINT_FORMATS = ("auto", "file", "dcp")
PARALLEL_MODES = ("ddp", "fsdp")


@dataclass
class WandbConfig:
    mode: str = "disabled"  # online | offline | disabled (online needs network and a key)
    project: str = "mars-gpt2"
    entity: str | None = None
    name: str | None = None  # default: the run directory's name
    group: str | None = None  # runs shown together (experiments: their table, e.g. owt)
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(f"unknown wandb.mode {self.mode!r}; valid modes: {list(WANDB_MODES)}")


@dataclass
class TrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: Any = None  # a registered optimizer's config dataclass (optim.registry)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    nonfinite: NonFiniteConfig = field(default_factory=NonFiniteConfig)  # trainer/nonfinite.py

    name: str | None = None  # the run's name (an experiment's, or the optimizer's): run dir, wandb
    out_dir: str | None = None  # the run directory; None: runs/<name>[_<overrides>] (train.py)
    resume: str = "auto"  # auto | never | PATH (a checkpoint file or a run directory)
    seed: int = 1337
    max_steps: int = 1000
    batch_tokens: int = 491_520  # global batch in tokens (all ranks, all micro-steps)
    micro_batch_size: int = 16  # sequences per rank per forward/backward
    seq_len: int | None = None  # None: model.block_size
    grad_clip: float = 1.0  # global grad-norm clip; 0 disables
    # The gradient is the mean over micro-batches times grad_scale. The official scripts sum
    # their per-rank micro-batch losses: grad_scale = their grad accumulation (4 for GPT-2
    # small/medium, 12 for large/XL) reproduces them on any number of GPUs.
    grad_scale: float = 1.0
    eval_every: int = 1000  # 0 disables periodic eval (the final eval still runs)
    eval_tokens: int | None = None  # validation budget in tokens; None: the whole split
    ckpt_every: int = 5000  # 0: only the final checkpoint
    keep_checkpoints: int = 2  # newest N step checkpoints kept; 0 keeps all
    # file: rank 0 writes step_N.pt; dcp: every rank writes its share of the directory step_N/
    # (torch.distributed.checkpoint, docs/checkpoints.md); auto: dcp with several processes or
    # parallel=fsdp, else file (``checkpointing``). async_checkpoint (dcp only): the loop waits
    # only for a CPU copy of the state while a background thread writes it; None (auto): on
    # where auto chose dcp for several processes. The choice is logged and in meta.jsonl.
    checkpoint_format: str = "auto"
    async_checkpoint: bool | None = None
    log_every: int = 10
    # How several processes share the work (docs/fsdp.md): ddp replicates the model and the
    # optimizer state on every rank; fsdp shards parameters, gradients and optimizer state over
    # the ranks (torch FSDP2) and writes DCP checkpoints (checkpoint_format file becomes dcp).
    parallel: str = "ddp"
    compile: bool = False
    # Execution choices of the model (GPT's attributes of the same names, model/gpt.py): the loss
    # over this many tokens at a time without the full logits tensor (0: the plain head and
    # F.cross_entropy), and recomputing each block's activations in the backward pass.
    loss_chunk_tokens: int = 4096
    activation_checkpointing: bool = False
    # The attention kernel (runtime/attention.py): auto measures flash, cuDNN and memory-efficient
    # at the run's shapes on CUDA and keeps the fastest that agrees with a float32 reference;
    # torch: torch's own order; flash | cudnn | efficient | math: only that one.
    sdpa_backend: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16
    # float32 matmuls on CUDA in TF32 (runtime.device.configure_backends); false: true float32
    # (the study's runs, configs/experiment/study.yaml). No effect on a CPU.
    tf32: bool = True
    progress: bool = True  # tqdm progress bar on rank 0

    def __post_init__(self) -> None:
        positive = ("max_steps", "batch_tokens", "micro_batch_size", "log_every")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("eval_every", "ckpt_every", "keep_checkpoints", "loss_chunk_tokens"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        check_sdpa_backend(self.sdpa_backend)
        if self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(
                f"unknown checkpoint_format {self.checkpoint_format!r}; valid: {CHECKPOINT_FORMATS}"
            )
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(
                f"unknown parallel {self.parallel!r}; valid: {list(PARALLEL_MODES)} "
                "(parallel=fsdp shards the model over the ranks, docs/fsdp.md)"
            )
        if self.parallel == "fsdp" and self.checkpoint_format == "file":
            # Every rank writes its own shards: a single file would gather the whole state.
            self.checkpoint_format = "dcp"
        if self.async_checkpoint and self.checkpoint_format == "file":
            raise ValueError("async_checkpoint=true needs checkpoint_format=dcp (or auto)")
        if self.grad_scale <= 0:
            raise ValueError(f"grad_scale must be > 0, got {self.grad_scale}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables it), got {self.grad_clip}")
        if self.seq_len is not None and not 1 <= self.seq_len <= self.model.block_size:
            raise ValueError(
                f"seq_len={self.seq_len} must be between 1 and model.block_size "
                f"({self.model.block_size})"
            )
        self._check_ranges()

    @property
    def sequence_length(self) -> int:
        return self.seq_len or self.model.block_size

    def _check_ranges(self) -> None:
        """Upper bounds that a typo crosses (a count that overflows the int64 of a tensor or
        a step counter, a micro-batch larger than the whole batch), each with its fix."""
        for key in ("max_steps", "batch_tokens"):
            if getattr(self, key) > MAX_COUNT:
                raise ValueError(f"{key} must be at most {MAX_COUNT:,} (10^12), got "
                                 f"{getattr(self, key)}")  # fmt: skip
        per_micro = self.micro_batch_size * self.sequence_length
        if per_micro > self.batch_tokens:
            most = max(1, self.batch_tokens // self.sequence_length)
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} sequences of {self.sequence_length} "
                f"tokens is more than the whole batch (batch_tokens={self.batch_tokens}): lower "
                f"micro_batch_size to at most {most}"
            )


MAX_COUNT = 10**12  # steps or tokens: far beyond any run, far below int64


def checkpointing(cfg: TrainConfig, world_size: int) -> dict:
    """How this run checkpoints with ``world_size`` processes: ``{"format", "asynchronous",
    "why"}``. ``checkpoint_format=auto`` (the default): the sharded DCP directory where there
    are several processes or ``parallel=fsdp`` (each rank writes its share; rank 0 alone would
    gather and write everything), the single file for one process; ``async_checkpoint=true``
    asks for DCP too. ``async_checkpoint`` unset: asynchronous where auto chose DCP for several
    processes (the loop waits only for the copy to CPU memory; under FSDP too), synchronous
    otherwise. An explicit value of either is kept (docs/checkpoints.md)."""
    fmt, why = cfg.checkpoint_format, [f"checkpoint_format={cfg.checkpoint_format}"]
    if fmt == "auto":
        several = world_size > 1 or cfg.parallel == "fsdp" or bool(cfg.async_checkpoint)
        fmt = "dcp" if several else "file"
        why.append(f"{world_size} process{'es' if world_size > 1 else ''}, "
                   f"parallel={cfg.parallel}")  # fmt: skip
    asynchronous = cfg.async_checkpoint
    if asynchronous is None:
        asynchronous = fmt == "dcp" and world_size > 1
        why.append(f"async_checkpoint unset: {'on' if asynchronous else 'off'}")
    return {"format": fmt, "asynchronous": bool(asynchronous), "why": "; ".join(why)}


# Keys that may change between a run and its continuation without making it a different run.
RESUMABLE_KEYS = frozenset(
    {
        "out_dir",
        "resume",
        "max_steps",
        "eval_every",
        "ckpt_every",
        "keep_checkpoints",
        "checkpoint_format",  # resume reads either format
        "parallel",  # the same numbers (bf16: but the blocks' LN gains, docs/fsdp.md); reshards
        "async_checkpoint",
        "log_every",
        "compile",
        "loss_chunk_tokens",  # the loss and gradients do not depend on it (beyond rounding)
        "activation_checkpointing",
        "sdpa_backend",  # every kernel computes the same attention (within bf16 rounding)
        "progress",
        "wandb",
        "device",
        "micro_batch_size",  # the gradient does not depend on it (accumulation adapts)
        "nonfinite",  # what a NaN step does, not what a finite one computes
    }
)


def config_differences(old: dict, new: dict, prefix: str = "", optimizer: Any = None,
                       ) -> list[str]:  # fmt: skip
    """Human-readable ``key: old -> new`` lines for keys that make two configs different runs.

    A key the old run's config lacks (it was written by an earlier version) is no difference
    when the new value is that key's default: the earlier version behaved as the default
    (``optimizer``: the new config's optimizer config class, found from its name)."""
    if not prefix:
        optimizer = _optimizer_class(new.get("optimizer"))
    diffs = []
    for key in sorted(set(old) | set(new)):
        if not prefix and key in RESUMABLE_KEYS:
            continue
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, f"{prefix}{key}.", optimizer)
        elif a == "<absent>" and _is_default(f"{prefix}{key}", b, optimizer):
            continue
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


def _optimizer_class(section: Any) -> type | None:
    """The registered config class of an ``optimizer`` section, or None (unknown name)."""
    import optim

    name = section.get("name") if isinstance(section, dict) else None
    return optim.get_spec(name).config_cls if name in optim.available() else None


def _is_default(dotted: str, value: Any, optimizer: type | None = None) -> bool:
    """Whether ``value`` is the default of the TrainConfig field ``dotted`` (``model.arch``);
    ``optimizer.*`` fields are those of the class ``optimizer``."""
    cls: Any = TrainConfig
    *sections, name = dotted.split(".")
    if sections[:1] == ["optimizer"] and optimizer is not None:
        cls, sections = optimizer, sections[1:]
    for section in sections:
        fields = (
            {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        )
        if section not in fields or fields[section].default_factory is dataclasses.MISSING:
            return False
        cls = type(fields[section].default_factory())
    if not dataclasses.is_dataclass(cls):
        return False
    field_ = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    if field_ is None:
        return False
    if field_.default_factory is not dataclasses.MISSING:
        return value == field_.default_factory()
    return value == field_.default


def grad_accum_steps(cfg: TrainConfig, world_size: int) -> int:
    """Micro-steps per optimizer step: ``batch_tokens`` over micro-batch x seq_len x world size,
    which must divide it."""
    per_micro = cfg.micro_batch_size * cfg.sequence_length * world_size
    if cfg.batch_tokens % per_micro:
        raise SystemExit(
            f"batch_tokens={cfg.batch_tokens} is not a multiple of micro_batch_size "
            f"({cfg.micro_batch_size}) x seq_len ({cfg.sequence_length}) x world size "
            f"({world_size}) = {per_micro}; pick batch_tokens as a multiple of {per_micro}"
        )
    return cfg.batch_tokens // per_micro
