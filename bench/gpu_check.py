"""The first GPU hour in one command: the GPU tests and every GPU figure the docs promise, each
step under its own time limit, into one Markdown report.

    python -m bench.gpu_check                      # on the GPU machine (no network needed)
    scripts/gpu_check.sh --out runs/gpu_check.md   # the same
    python -m bench.gpu_check --dry-run            # list the steps and commands, run nothing
    python -m bench.gpu_check --cpu                # the same steps, tiny and on the CPU
    python -m bench.gpu_check --only train-small xl

Steps (in order, the whole within --budget seconds, 570 by default: 10 minutes on one H100):
the GPU tests (``pytest -m gpu``); tokens/s, MFU, peak memory against bench.memory_model's
estimate, the compile (first step) and graph/break/recompile counts of GPT-2 small with each
optimizer family, and of XL with AdamW and MARS-AdamW at the micro-batch the launcher would pick
for 8 of these GPUs (``python -m bench.train``); the XL estimate part by part; each optimizer's
step against torch's fused AdamW and its share of the copy bandwidth (``bench.optim_fused``);
Newton-Schulz's share of a MARS-M step (``bench.newton_schulz``); the checkpoint stall
(``bench.checkpoint``); DDP's graph pieces (``bench.graphs``). A step that fails or runs out of
time is recorded in the report with its output and the next step runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.configs import ROOT
from bench.harness import device_line, model_config

FAMILIES = ["adamw", "lion", "mars-adamw", "mars-lion", "mars-shampoo", "mars-m", "muon",
            "moonlight"]  # fmt: skip
BUDGET_S = 570
TAIL = 6000  # characters of each step's output kept in the report


@dataclass
class Step:
    name: str
    what: str
    argv: list[str]
    limit_s: float


def xl_micro_batch(memory_gib: float) -> int:
    """The micro-batch the launcher picks for XL with MARS-AdamW on 8 GPUs of ``memory_gib``."""
    import optim
    from bench.memory import meta_state_bytes
    from bench.memory_model import estimate_memory, fitting_micro_batch
    from trainer.config import TrainConfig

    cfg = model_config("gpt2-xl")
    state, _ = meta_state_bytes(cfg, optim.get_spec("mars-adamw").config_cls())
    view = getattr(TrainConfig, "gradient_as_bucket_view", False)
    kw = dict(state_bytes=state, ddp=True, gradient_as_bucket_view=view)
    cands = [d for d in range(1, 61) if 60 % d == 0]
    pick = fitting_micro_batch(
        cands, memory_gib, lambda b: estimate_memory(cfg, micro_batch=b, **kw)
    )
    return pick or 1


def gpu_steps(memory_gib: float) -> list[Step]:
    py, xl = [sys.executable], str(xl_micro_batch(memory_gib))
    train = [*py, "-m", "bench.train", "--device", "cuda", "--no-exact"]
    return [
        Step("gpu-tests", "pytest -m gpu", [*py, "-m", "pytest", "-q", "-m", "gpu", "tests"], 90),
        Step("train-small", "GPT-2 small, each optimizer family",
             [*train, "--models", "gpt2-small", "--optimizers", *FAMILIES, "--steps", "5",
              "--warmup", "2"], 180),
        Step("xl", f"GPT-2 XL at micro-batch {xl}",
             [*train, "--models", "gpt2-xl", "--optimizers", "adamw", "mars-adamw",
              "--micro-batch", xl, "--steps", "3", "--warmup", "2"], 120),
        Step("xl-estimate", "the XL estimate part by part",
             [*py, "-m", "bench.memory", "--parts", "--models", "gpt2-xl", "--optimizers",
              "adamw", "mars-adamw", "--micro-batch", xl], 30),
        Step("optim-fused", "optimizer steps vs fused AdamW, copy bandwidth",
             [*py, "-m", "bench.optim_fused", "--device", "cuda", "--only", "adamw",
              "mars-adamw", "mars-lion", "lion", "--rounds", "3"], 60),
        Step("newton-schulz", "Newton-Schulz's share of a MARS-M step",
             [*py, "-m", "bench.newton_schulz", "--device", "cuda"], 45),
        Step("checkpoint", "the checkpoint stall",
             [*py, "-m", "bench.checkpoint", "--device", "cuda", "--saves", "2"], 45),
        Step("graphs", "DDP graph pieces per bucket cap",
             [*py, "-m", "bench.graphs", "--model", "gpt2-small"], 30),
        Step("nonfinite", "the non-finite check decided on the host vs on the device",
             [*py, "-m", "bench.nonfinite", "--model", "gpt2-small", "--device", "cuda",
              "--micro-batch", "8", "--optimizer", "mars-adamw", "--rounds", "3"], 60),
        Step("nonfinite-muon", "the same for Muon (device: steps on copies, optim/masked.py)",
             [*py, "-m", "bench.nonfinite", "--model", "gpt2-small", "--device", "cuda",
              "--micro-batch", "8", "--optimizer", "muon", "--rounds", "3"], 60),
    ]  # fmt: skip


def cpu_steps() -> list[Step]:
    """The same steps, tiny, on the CPU: the check of the check."""
    py = [sys.executable]
    train = [*py, "-m", "bench.train", "--device", "cpu", "--no-exact", "--models", "tiny",
             "--steps", "1", "--warmup", "1", "--rounds", "1", "--optimizers"]  # fmt: skip
    return [
        Step("gpu-tests", "pytest -m gpu (skipped on the CPU)",
             [*py, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py"], 60),
        Step("train-small", "tiny, two optimizers", [*train, "adamw", "mars-adamw"], 60),
        Step("xl-estimate", "an estimate part by part",
             [*py, "-m", "bench.memory", "--parts", "--models", "tiny", "--optimizers",
              "adamw"], 30),
        Step("graphs", "DDP graph pieces", [*py, "-m", "bench.graphs", "--model", "tiny"], 60),
    ]  # fmt: skip


def run_step(step: Step, limit_s: float) -> dict:
    """Run one step; never raises: a failure or a timeout is a result."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(step.argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=max(limit_s, 1))  # fmt: skip
        out, status = proc.stdout + proc.stderr, "ok" if proc.returncode == 0 else "failed"
        rc = proc.returncode
    except subprocess.TimeoutExpired as e:
        out = _text(e.stdout) + _text(e.stderr)
        status, rc = f"timed out after {limit_s:.0f} s", None
    return dict(step=step, status=status, rc=rc, seconds=time.perf_counter() - t0, output=out)


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def report(results: list[dict], device: str) -> str:
    """The Markdown report: device, torch, then each step's command, status and output."""
    lines = ["# GPU check", "", f"- {device}", f"- torch {torch.__version__}, "
             f"CUDA {torch.version.cuda}", f"- {time.strftime('%Y-%m-%d %H:%M:%S')}", "",
             "| step | status | seconds |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {r['step'].name} | {r['status']} | {r['seconds']:.0f} |" for r in results]
    for r in results:
        cmd = " ".join(a if a != sys.executable else "python" for a in r["step"].argv)
        lines += ["", f"## {r['step'].name}: {r['step'].what}", "", f"`{cmd}`: {r['status']}",
                  "", "```", r["output"][-TAIL:].rstrip(), "```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="list the steps, run nothing")
    ap.add_argument("--cpu", action="store_true", help="tiny steps on the CPU")
    ap.add_argument("--only", nargs="+", metavar="STEP", help="these steps only")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all the steps")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not (args.cpu or args.dry_run):
        raise SystemExit("gpu_check: no GPU visible; use --dry-run (list) or --cpu (tiny, CPU)")
    mem = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 80.0
    steps = cpu_steps() if args.cpu else gpu_steps(mem)
    if args.only:
        unknown = set(args.only) - {s.name for s in steps}
        if unknown:
            names = ", ".join(s.name for s in steps)
            raise SystemExit(f"gpu_check: unknown step(s) {sorted(unknown)}; the steps: {names}")
        steps = [s for s in steps if s.name in args.only]
    if args.dry_run:
        for s in steps:
            cmd = " ".join(a if a != sys.executable else "python" for a in s.argv)
            print(f"{s.name} ({s.limit_s:.0f} s): {s.what}\n    {cmd}")
        return 0
    deadline, results = time.monotonic() + args.budget, []
    for s in steps:
        left = deadline - time.monotonic()
        results.append(run_step(s, min(s.limit_s, left)))
        print(f"{s.name}: {results[-1]['status']} ({results[-1]['seconds']:.0f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(results, device_line("cuda" if cuda else "cpu")))
    print(f"report: {args.out}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
