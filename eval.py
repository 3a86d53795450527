"""Evaluate a checkpoint: validation loss and the MARS paper's zero-shot downstream tasks.

    python -m scripts.get_eval_data                            # once: cache the tasks' data
    python eval.py checkpoint=runs/NAME limit=200              # val loss + 200 HellaSwag rows
    python eval.py checkpoint=runs/NAME tasks=[all] limit=500  # every task, 500 examples each
    python eval.py checkpoint=out/hf-gpt2 tasks=[hellaswag]    # a Hugging Face GPT-2 directory
    torchrun --nproc_per_node=8 eval.py checkpoint=runs/NAME tasks=[all]

``val`` is the validation loss over the run's validation shards with the run's number of
validation tokens (``eval_tokens``), micro-batch and sequence length, through the same code as
training, so it equals the ``val_loss`` that training logged for that checkpoint
(``val_tokens=all``: the whole split; 0 is refused, as train.py refuses ``eval_tokens=0``). The downstream tasks are scored as lm-evaluation-harness does (``evals/tasks.py``,
``evals/scoring.py``). Results are merged into ``<run>/eval/step_N.json`` and printed as a row
of the paper's table. Before it starts it says how many rows each task scores and about how
long that takes here (``evals/estimate.py``); Ctrl-C keeps the tasks finished, written as partial.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import math
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from trainer.cli_checks import check_eval_overrides, from_parsed, override_args, stray_words

if __name__ == "__main__":  # before the slow imports below: a misspelt key is refused at once
    from trainer.cli_checks import EVAL_PATH_KEYS, quote_paths

    sys.argv[1:] = quote_paths(sys.argv[1:], EVAL_PATH_KEYS)  # run dirs hold '=' and ','
    if stray := stray_words(sys.argv[1:]):  # the rest of a path the shell split at a space
        raise SystemExit(f"config error: {stray}")
    try:
        parsed = OverridesParser.create().parse_overrides(override_args(sys.argv[1:]))
        check_eval_overrides(from_parsed(parsed))
    except (ValueError, HydraException) as exc:
        raise SystemExit(f"config error: {str(exc).strip().splitlines()[0]}") from None

from data import ensure_prepared, find_shards, num_val_windows, val_batches  # noqa: E402
from evals.config import EvalConfig  # noqa: E402
from evals.data import load_rows  # noqa: E402
from evals.estimate import plan_lines, seconds_per_token, task_tokens  # noqa: E402
from evals.loading import LoadedModel, bad_checkpoint_line, load_model  # noqa: E402
from evals.scoring import evaluate_examples  # noqa: E402
from evals.tasks import TASKS, Example, build_examples, table  # noqa: E402
from runtime import runfiles  # noqa: E402
from runtime.device import resolve_dtype, tune_host_allocator  # noqa: E402
from runtime.distributed import DistInfo, broadcast_object, destroy, init_distributed  # noqa: E402
from runtime.files import atomic_open, check_writable, storage_problem  # noqa: E402
from trainer import checks  # noqa: E402
from trainer.evaluation import validation_loss  # noqa: E402
from trainer.logs import setup_logging  # noqa: E402

log = logging.getLogger("eval")


def _val_files(loaded: LoadedModel, cfg: EvalConfig, dist: DistInfo) -> list[Path]:
    """The run's validation shards (prepared by rank 0 when the source prepares itself)."""
    data = loaded.run_config.get("data")
    if data is None and cfg.val_data_dir is None:
        raise SystemExit(
            f"{loaded.source} carries no training config: give the validation shards with "
            "val_data_dir=DIR, or leave val out of tasks"
        )
    data = data or {}
    directory = cfg.val_data_dir or data["dir"]
    pattern = data.get("val_pattern", "*_val_*.bin")
    error = None
    if dist.is_main and cfg.val_data_dir is None:
        try:
            ensure_prepared(data.get("name", ""), directory)  # the embedded corpus, as in train
        except (FileNotFoundError, ValueError) as exc:
            error = str(exc)
    error = broadcast_object(error)
    if error:
        raise SystemExit(f"error: {error}")
    try:
        return find_shards(directory, pattern)
    except FileNotFoundError as exc:
        raise SystemExit(f"error: {exc}; set val_data_dir=DIR") from None


def validation(loaded: LoadedModel, cfg: EvalConfig, dist: DistInfo, dtype) -> dict:
    """Validation loss and perplexity, computed exactly as the training loop computes them."""
    run = loaded.run_config
    files = _val_files(loaded, cfg, dist)
    seq_len = run.get("seq_len") or loaded.model.config.block_size
    val_tokens = cfg.val_budget(run.get("eval_tokens"))
    micro = cfg.val_batch_size or run.get("micro_batch_size") or 8
    batches = val_batches(
        files,
        batch_size=micro,
        seq_len=seq_len,
        rank=dist.rank,
        world_size=dist.world_size,
        max_tokens=val_tokens,
        device=dist.device,
    )
    loss = validation_loss(loaded.model, batches, dist.device, dtype)
    tokens = num_val_windows(files, seq_len=seq_len, max_tokens=val_tokens) * seq_len
    return {
        "loss": loss,
        "ppl": math.exp(min(loss, 50.0)),
        "tokens": tokens,
        "seq_len": seq_len,
        "data_dir": str(files[0].parent),
    }


def load_examples(cfg: EvalConfig) -> dict[str, list[Example]]:
    """Every downstream task's examples, read before any model runs (fail fast)."""
    return {
        t: build_examples(TASKS[t], load_rows(cfg.data_dir, t), cfg.limit)
        for t in cfg.tasks
        if t != "val"
    }


def downstream(
    name: str, examples: list[Example], loaded: LoadedModel, cfg: EvalConfig, dist: DistInfo, dtype
) -> dict:
    task = TASKS[name]
    result = evaluate_examples(
        loaded.model,
        examples,
        block_size=loaded.model.config.block_size,
        batch_size=cfg.batch_size,
        device=dist.device,
        dtype=dtype,
        rank=dist.rank,
        world_size=dist.world_size,
        progress=cfg.progress and dist.is_main,
        desc=name,
    )
    keep = ("n", *task.metrics, *(f"{m}_stderr" for m in task.metrics))
    out = {k: result[k] for k in keep}
    out.update(metric=task.metric, split=task.split, paper_split=task.paper_split, limit=cfg.limit)
    return out


def run_task(
    name: str, examples: list[Example] | None, loaded: LoadedModel, cfg: EvalConfig, dist, dtype
) -> dict:
    """One task's results, with the seconds it took."""
    t0 = time.perf_counter()
    if name == "val":
        r = validation(loaded, cfg, dist, dtype)
        log.info("val loss %.4f | ppl %.2f | %s tokens", r["loss"], r["ppl"], f"{r['tokens']:,}")
    else:
        r = downstream(name, examples, loaded, cfg, dist, dtype)
        log.info("%s: %s = %.4f over %d examples", name, r["metric"], r[r["metric"]], r["n"])
    return {**r, "seconds": round(time.perf_counter() - t0, 2)}


def default_label(loaded: LoadedModel) -> str:
    run = loaded.run_config
    if not run:
        return loaded.source.name
    optimizer = (run.get("optimizer") or {}).get("name", "?")
    return f"{optimizer} {run['model'].get('name', '')} step {loaded.step}"


def write_results(path: Path, header: dict, results: dict) -> dict:
    """Merge ``results`` into the JSON at ``path`` (earlier tasks are kept) and write it."""
    record = json.loads(path.read_text()) if path.exists() else {}
    merged = {**record.get("results", {}), **results}
    record.update(header, results=merged)
    with atomic_open(path, "w") as f:  # whole or not at all: the earlier tasks are never lost
        f.write(json.dumps(record, indent=2) + "\n")
    return record


def check_results_path(path: Path, dist: DistInfo) -> None:
    """One line, before any task is computed, where the results file cannot be written (a
    read-only mount, no permission): rank 0 tries, every rank stops."""
    error = None
    if dist.is_main:
        try:
            check_writable(path)
        except OSError as exc:
            error = (f"error: {storage_problem(path.parent, exc)}: the results ({path.name}) "
                     "could not be written there; nothing was computed. Give out=FILE on "
                     "writable storage")  # fmt: skip
    error = broadcast_object(error)
    if error:
        raise SystemExit(error)


def write_results_or_say(path: Path, header: dict, results: dict) -> dict:
    """``write_results``; where the storage refuses it after all (a disk filled meanwhile), the
    results go to stdout as JSON, so that nothing computed is lost, and one line says so."""
    try:
        return write_results(path, header, results)
    except OSError as exc:
        print(json.dumps({**header, "results": results}, indent=2))
        raise SystemExit(f"error: {storage_problem(path, exc)}: the results were not written "
                         "there (printed above as JSON); give out=FILE on writable storage and "
                         "run again, or keep the JSON printed above") from None  # fmt: skip


def evaluate(cfg: EvalConfig) -> dict:
    """Run the configured tasks; returns the merged results record (also written as JSON)."""
    if not cfg.checkpoint:
        raise SystemExit(
            "checkpoint=PATH is required (a step_N.pt or DCP step_N dir, a run dir or an HF dir)"
        )
    if not Path(cfg.checkpoint).exists():  # before the task data: the first thing to fix
        raise SystemExit(
            f"error: checkpoint={cfg.checkpoint} does not exist; give a step_N.pt file or DCP "
            "step_N directory, a run directory (runs/NAME), or a Hugging Face GPT-2 directory"
        )
    dist = init_distributed(cfg.device)
    setup_logging(dist.is_main)
    try:
        with logging_redirect_tqdm():
            return _evaluate(cfg, dist)
    finally:
        destroy()


def announce(cfg: EvalConfig, examples: dict, loaded: LoadedModel, dist: DistInfo, dtype) -> None:
    """Say, before any task runs, how many rows each will score and about how long that takes
    here (evals/estimate.py), and what ``limit=`` makes of a long one. Every rank calls it
    (finding the validation shards is a collective); rank 0 says it."""
    block, run = loaded.model.config.block_size, loaded.run_config
    rows, tokens, per_token = {}, {}, {}
    timed = functools.partial(seconds_per_token, loaded.model, dist.device, dtype)
    for name in cfg.tasks:
        if name == "val":
            seq_len = run.get("seq_len") or block
            val_tokens = cfg.val_budget(run.get("eval_tokens"))
            try:
                files = _val_files(loaded, cfg, dist)
            except SystemExit:
                continue  # said again, with its fix, when the task runs
            tokens[name] = num_val_windows(files, seq_len=seq_len, max_tokens=val_tokens) * seq_len
            rows[name] = tokens[name] // seq_len
            per_token[name] = timed(seq_len, cfg.val_batch_size or run.get("micro_batch_size") or 8)
        else:
            rows[name] = len(examples[name])
            requests, tokens[name] = task_tokens(examples[name], block)
            per_token[name] = timed(tokens[name] // max(1, requests), cfg.batch_size)
    if not rows:
        return
    device = runfiles.cpu_name() if dist.device.type == "cpu" else str(dist.device)
    shares = {k: v / dist.world_size for k, v in per_token.items()}  # each rank scores 1/N
    if dist.is_main:
        for line in plan_lines(rows, tokens, shares, device, cfg.limit):
            log.info("%s", line)


def _evaluate(cfg: EvalConfig, dist: DistInfo) -> dict:
    try:
        examples = load_examples(cfg)
        loaded = load_model(cfg.checkpoint, dist.device)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {bad_checkpoint_line(exc, cfg.checkpoint)}") from None
    path = Path(cfg.out) if cfg.out else loaded.default_results_path()
    check_results_path(path, dist)  # before any task: results that cannot be written are lost
    dtype = resolve_dtype(cfg.dtype, dist.device)
    if dist.device.type == "cpu":
        tune_host_allocator()  # large logits tensors: see runtime/device.py
    announce(cfg, examples, loaded, dist, dtype)  # every rank: it reads the shards collectively
    results, interrupted, signame = {}, None, "Ctrl-C"
    # a scheduler's stop (SIGTERM: Slurm's time limit, a preemption) as Ctrl-C: the tasks done
    # are kept; the caller's handler back afterwards
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        for name in cfg.tasks:
            try:
                results[name] = run_task(name, examples.get(name), loaded, cfg, dist, dtype)
            except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: keep what is done, as partial
                interrupted, signame = name, getattr(exc, "signame", "Ctrl-C")
                break
            except (FileNotFoundError, ValueError) as exc:
                raise SystemExit(f"error in task {name}: {exc}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    header = {
        "checkpoint": str(loaded.source),
        "kind": loaded.kind,
        "step": loaded.step,
        "model": asdict(loaded.model.config),
        "world_size": dist.world_size,
        "device": str(dist.device),
        "dtype": str(dtype).removeprefix("torch."),
        "updated": datetime.datetime.now().isoformat(timespec="seconds"),
        # Ctrl-C: the tasks done are kept; the one interrupted, and those after it, are not
        "partial": interrupted is not None,
        "interrupted": interrupted,
    }
    record = {**header, "results": results}
    if interrupted is not None:
        raise SystemExit(stop_partial(dist, path, header, results, interrupted, signame))
    if dist.is_main:
        record = write_results_or_say(path, header, results)
        log.info("results: %s", path)
        if any(t in record["results"] for t in TASKS):
            print(table(record["results"], cfg.name or default_label(loaded)))
    return broadcast_object(record)


class Terminated(KeyboardInterrupt):
    """SIGTERM during the tasks: handled as Ctrl-C (the tasks done are written)."""

    signame = "SIGTERM"


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def stop_partial(dist: DistInfo, path: Path, header: dict, results: dict, task: str,
                 signame: str = "Ctrl-C") -> int:  # fmt: skip
    """Ctrl-C (or SIGTERM) during ``task``: rank 0 writes the tasks done (marked partial) and
    says so in one line; the exit status is the shell's: 130 for Ctrl-C, 143 for SIGTERM."""
    if dist.is_main:
        kept = "nothing was finished, nothing written"
        if results:
            write_results_or_say(path, header, results)
            kept = f"{', '.join(results)} written to {path} (marked partial)"
        sys.stderr.write(f"interrupted ({signame}) during {task}: {kept}; run the same command "
                         f"again for the rest (tasks=[{task}] scores only it, limit=N fewer "
                         "rows)\n")  # fmt: skip
    return 143 if signame == "SIGTERM" else 130


def register_schemas() -> None:
    ConfigStore.instance().store(name="base_eval", node=EvalConfig)


def to_typed(cfg: DictConfig) -> EvalConfig:
    """The composed config as a validated dataclass (bad values stop with a clear message)."""
    try:
        checks.check_known_keys(OmegaConf.to_container(cfg), EvalConfig)  # also +key=value
        return OmegaConf.to_object(cfg)
    except ValueError as exc:
        raise SystemExit(f"config error: {exc}") from None


register_schemas()


@hydra.main(version_base=None, config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    try:
        evaluate(to_typed(cfg))
    except KeyboardInterrupt:  # before the tasks (loading, set-up): nothing to keep
        sys.stderr.write("interrupted (Ctrl-C) before any task finished; nothing was written\n")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
