"""The batch crossover predicted from a run's gradient statistics (docs/study.md, "The batch
crossover"; the estimators: study/findings/gradstats.py).

    python -m study predict RUN_DIR [--at 0.25 0.5 0.75 1.0] [--ladder 2048 8192 32768 131072]
                            [--warm N] [--pairs 5] [--noise-k 16 --noise-rounds 4] [--common 0]
                            [--kappa K] [--threads 1] [--json FILE] [--figure FILE]
    python -m study predict LEDGER.csv:RUN_ID    # a run of a ledger (its recorded command)
    python -m study predict -- OVERRIDES...      # a run given by its train.py overrides

The run (a finished one-process run of train.py: its recorded command, or the overrides of a
ledger row) is replayed on the CPU; at each fraction ``--at`` of its steps, from the weights and
optimizer state there (the run continues unchanged after each probe):

- for each batch B of ``--ladder`` (bytes), the run's own optimizer stepping at batch B with the
  run's lr there: ``--warm`` steps to let its state settle at that batch (default: 1 / (1 -
  beta2) of the run's optimizer, at least 6: the second moment's window), then ``--pairs``
  consecutive pairs of minibatch gradients: their cosine, and the correction's signal-to-noise
  ratio ``SNR(B) = B E|g_t - g_{t-1}|^2 / (2 tr(Sigma)) - 1`` (study/findings/gradstats.py);
- the gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` (tokens) at the weights themselves,
  from ``--noise-rounds`` x ``--noise-k`` micro-batch gradients and each round's mean (the
  SNR needs ``tr(Sigma)`` only, the robust half of it; ``|G|^2`` is small beside
  ``tr(Sigma)/B`` on this proxy, so ``B_simple`` is the noisier figure); with ``--common N``,
  ``|dG|^2`` measured directly on two common batches of N micro-batches as a check;
- the predicted crossover: where SNR passes 1 and the cosine is clearly positive (mean minus
  1.645 standard errors above 0), the larger of the two.

It prints a table, writes every figure to ``--json`` and draws ``--figure`` (cosine and SNR
against B, a line per phase). The block matrices' gradients are measured (the 2-D weights of the
transformer blocks: the correction acts on them). Exact MARS is refused (the correction compares
gradients of the same batch there).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from study.findings import gradstats
from study.findings.vr_probe import (
    block_matrices,
    build_from,
    device_line,
    kappa_of,
    recorded_overrides,
)

LADDER = [2048, 8192, 32768, 131072]


class Probe:
    """A built run and the operations the estimators need, at its current weights."""

    def __init__(self, trainer, cfg) -> None:  # noqa: ANN001
        from trainer.trainer import forward_backward

        self.trainer, self.cfg, self.fb = trainer, cfg, forward_backward
        self.blocks = block_matrices(trainer.raw_model)
        self.per_micro = cfg.micro_batch_size * cfg.sequence_length

    def grad_on(self, batches: list) -> gradstats.Vector:
        """The mean gradient over ``batches`` (micro-batches) at the current weights."""
        t = self.trainer
        t.optimizer.zero_grad(set_to_none=True)
        self.fb(t.model, batches, t.dist, t.dtype, 1.0 / len(batches))
        g = gradstats.flat([p.grad for p in self.blocks])
        t.optimizer.zero_grad(set_to_none=True)
        return g

    def fresh(self, count: int) -> list:
        return [self.trainer.loader.next_batch() for _ in range(count)]

    def step_at(self, batch: int) -> gradstats.Vector:
        """One optimizer step on a fresh batch of ``batch`` bytes, clipped as the run clips;
        the minibatch gradient it stepped with."""
        t, cfg = self.trainer, self.cfg
        count = batch // self.per_micro
        t.optimizer.zero_grad(set_to_none=True)
        self.fb(t.model, self.fresh(count), t.dist, t.dtype, cfg.grad_scale / count)
        g = gradstats.flat([p.grad for p in self.blocks])
        t.clip_grads()
        t.optimizer.step()
        t.optimizer.zero_grad(set_to_none=True)
        return g

    def snapshot(self) -> tuple:
        t = self.trainer
        return (copy.deepcopy(t.raw_model.state_dict()), copy.deepcopy(t.optimizer.state_dict()),
                t.loader.state_dict(), torch.get_rng_state())  # fmt: skip

    def restore(self, snap: tuple) -> None:
        t = self.trainer
        t.raw_model.load_state_dict(snap[0])
        t.optimizer.load_state_dict(copy.deepcopy(snap[1]))
        t.loader.load_state_dict(snap[2])
        torch.set_rng_state(snap[3])


def warm_of(cfg) -> int:  # noqa: ANN001 - the run's config
    """Steps at each batch before measuring: the second moment's window, ``1 / (1 - beta2)``
    of the run's optimizer (rounded up), at least 6; 6 where it has no second moment."""
    betas = getattr(cfg.optimizer, "betas", None) or cfg.optimizer.get("betas", None)
    try:
        return max(6, math.ceil(1.0 / (1.0 - float(betas[1]))))
    except (TypeError, IndexError, ValueError, ZeroDivisionError):
        return 6


def probe_phase(probe: Probe, args: argparse.Namespace) -> dict:
    """Every figure at the trainer's current step (module docstring); the run left as found."""
    import optim

    t, cfg = probe.trainer, probe.cfg
    snap = probe.snapshot()
    # tr(Sigma) at the weights themselves: the ladder's own gradients are taken along different
    # trajectories, whose |G|^2 differs by more than tr(Sigma)/B on this proxy (a fit of them
    # against 1/B came out negative)
    noise = gradstats.noise_scale(lambda: probe.grad_on(probe.fresh(1)), small=probe.per_micro,
                                  k=args.noise_k, rounds=args.noise_rounds)  # fmt: skip
    common = [probe.fresh(args.common), probe.fresh(args.common)] if args.common else None
    lr = optim.apply_schedule(t.optimizer, t.state.step, cfg.schedule, cfg.max_steps)
    rows = []
    for batch in args.ladder:
        probe.restore(snap)
        optim.apply_schedule(t.optimizer, t.state.step, cfg.schedule, cfg.max_steps)
        read = (lambda j: probe.grad_on(common[j])) if common else None
        rows.append(gradstats.along_run(batch, lambda b=batch: probe.step_at(b), read,
                                        warm=args.warm, pairs=args.pairs))  # fmt: skip
    probe.restore(snap)
    kappa = args.kappa if args.kappa is not None else 0.0
    return {
        "step": t.state.step, "lr": lr, "trace_per_token": noise.trace, "g2": noise.g2,
        "b_simple": noise.b_simple, "trace_se": noise.trace_se, "g2_se": noise.g2_se,
        "b_simple_se": noise.b_simple_se,
        # the along-run differences bound tr(Sigma) from above at each B (B E|g_t - g_{t-1}|^2
        # / 2 = tr(Sigma) + B |dG|^2 / 2); the smallest batch's bound, beside the fixed-weight
        # estimate: where it lies far above, the two disagree (docs/study.md)
        "trace_bound_from_differences": min(
            (r.batch * sum(r.diff2) / len(r.diff2) / 2 for r in rows if r.diff2), default=None),
        "ladder": [{
            "batch": r.batch, "cosine": r.cosine[0], "cosine_se": r.cosine[1],
            "cosines": r.cosines, "g2s": r.g2, "diff2s": r.diff2, "snr": r.snr(noise.trace),
            "dg2_common": r.dg2_mean if r.dg2 else None, "snr_common": r.snr_common(noise.trace),
            "inflation": gradstats_inflation(kappa, r.cosine[0]),
        } for r in rows],
        "prediction": gradstats.predicted_crossover(rows, noise.trace),
    }  # fmt: skip


def gradstats_inflation(kappa: float, rho: float) -> float:
    """``|c|^2/|g|^2`` that the cosine ``rho`` predicts (study/findings/vr_probe.py)."""
    return (1 + kappa) ** 2 + kappa**2 - 2 * kappa * (1 + kappa) * rho


def probe_run(overrides: list[str], args: argparse.Namespace) -> dict:
    """Replay the run, probing at each fraction ``args.at`` of its steps."""
    trainer, cfg = build_from(overrides)
    if getattr(trainer.optimizer, "needs_reference_grad", False):
        raise SystemExit("study.predict: the run uses exact MARS; the prediction is for the "
                         "approximate correction (mode: approx)")  # fmt: skip
    per_micro = cfg.micro_batch_size * cfg.sequence_length
    bad = [b for b in args.ladder if b <= 0 or b % per_micro]
    if bad:
        raise SystemExit(f"study.predict: --ladder {bad[0]}: a positive multiple of the run's "
                         f"micro-batch ({per_micro} tokens)")  # fmt: skip
    if args.kappa is None:
        args.kappa = kappa_of(cfg)
    if args.warm is None:
        args.warm = warm_of(cfg)
    at = sorted({max(0, min(cfg.max_steps, round(f * cfg.max_steps))) for f in args.at})
    probe, phases, t0 = Probe(trainer, cfg), [], time.perf_counter()
    for stop in at:
        while trainer.state.step < stop:
            trainer.train_step()
        phases.append(probe_phase(probe, args))
        print_phase(phases[-1], cfg)
    return {"overrides": overrides, "batch_tokens": cfg.batch_tokens, "steps": cfg.max_steps,
            "kappa": args.kappa, "micro_batch_tokens": per_micro, "warm": args.warm,
            "pairs": args.pairs, "common_micro_batches": args.common, "noise_k": args.noise_k,
            "noise_rounds": args.noise_rounds, "phases": phases,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def _b(x: float) -> str:
    return "beyond the ladder" if x == math.inf else "-" if math.isnan(x) else f"{x:,.0f}"


def print_phase(ph: dict, cfg) -> None:  # noqa: ANN001
    print(f"\n  step {ph['step']}/{cfg.max_steps} (lr {ph['lr']:.3g}): B_simple "
          f"{ph['b_simple']:,.0f} tokens (tr Sigma {ph['trace_per_token']:.4g}, |G|^2 "
          f"{ph['g2']:.4g})")  # fmt: skip
    print("  batch      cosine (se)       SNR   SNR (common batches)  |c|^2/|g|^2")
    for r in ph["ladder"]:
        print(f"  {r['batch']:<10,} {r['cosine']:+.3f} ({r['cosine_se']:.3f})  {r['snr']:8.3g}   "
              f"{r['snr_common']:8.3g}             {r['inflation']:.3f}")  # fmt: skip
    p = ph["prediction"]
    print(f"  SNR passes 1 at {_b(p['snr_passes_1'])}; cosine clearly positive from "
          f"{_b(p['cosine_positive_from'])}; predicted crossover: {_b(p['crossover'])}")  # fmt: skip


def _relative(name: str) -> str:
    """A run's spec relative to the checkout where it lies inside it."""
    root = str(Path(__file__).resolve().parents[2]) + "/"
    return name.replace(root, "")


def draw(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for run in record["runs"]:
        for ph in run["phases"]:
            xs = [r["batch"] for r in ph["ladder"]]
            label = f"{run.get('label', '')} step {ph['step']}".strip()
            ax1.errorbar(xs, [r["cosine"] for r in ph["ladder"]], marker="o", label=label,
                         yerr=[1.645 * (r["cosine_se"] or 0) for r in ph["ladder"]])  # fmt: skip
            ax2.plot(xs, [max(r["snr"], 1e-4) for r in ph["ladder"]], marker="o", label=label)
    ax1.axhline(0, color="grey", lw=0.8)
    ax2.axhline(1, color="grey", lw=0.8)
    for ax, title in ((ax1, "cosine of consecutive gradients (90% bars)"),
                      (ax2, "correction's signal-to-noise, B|dG|^2 / 2 tr(Sigma)")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (bytes)")
        ax.set_title(title, fontsize=9)
    ax2.set_yscale("log")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m study predict", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR|LEDGER.csv:RUN_ID")
    ap.add_argument("--at", nargs="+", type=float, default=[0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--ladder", nargs="+", type=int, default=LADDER, metavar="BYTES")
    ap.add_argument("--warm", type=int, default=None,
                    help="steps at each batch before measuring (default: 1 / (1 - beta2) of "
                    "the run's optimizer, at least 6)")  # fmt: skip
    ap.add_argument("--pairs", type=int, default=5, help="consecutive pairs measured per batch")
    ap.add_argument("--common", type=int, default=0,
                    help="micro-batches per common batch for the direct |dG|^2 check (0: none)")  # fmt: skip
    ap.add_argument("--noise-k", type=int, default=16,
                    help="micro-batch gradients per round of the noise scale, at the weights "
                    "themselves (each round's mean is the larger batch)")  # fmt: skip
    ap.add_argument("--noise-rounds", type=int, default=4)
    ap.add_argument("--kappa", type=float, default=None,
                    help="the correction's kappa for the inflation column (default: the run's; "
                    "0.475 is MARS's at gamma 0.025, beta1 0.95)")  # fmt: skip
    ap.add_argument("--label", nargs="*", default=[], help="a name per run for the figure")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, metavar="FILE")
    ap.add_argument("--figure", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    if not args.runs and not extra:
        ap.error("give a RUN_DIR, or a run's train.py overrides after --")
    checks = [("--at", all(0 <= f <= 1 for f in args.at), "fractions in [0, 1]"),
              ("--warm", args.warm is None or args.warm >= 0, "0 or more"), ("--pairs", args.pairs >= 1, "1 or more"),
              ("--common", args.common >= 0, "0 or more"), ("--noise-k", args.noise_k >= 2,
              "2 or more"), ("--noise-rounds", args.noise_rounds >= 1, "1 or more"), ("--ladder", len(set(args.ladder)) >= 2, "two batches or more"),
              ("--threads", args.threads >= 1, "1 or more")]  # fmt: skip
    for name, ok, what in checks:
        if not ok:
            ap.error(f"{name}: {what}")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(list(sys.argv[1:] if argv is None else argv))
    torch.set_num_threads(args.threads)
    print(device_line("cpu"))
    record = {"device": device_line("cpu"), "command": ["python", "-m", "study", "predict",
              *map(_relative, sys.argv[1:] if argv is None else argv)], "runs": []}  # fmt: skip
    from study import ledger

    sources = [(str(r), ledger.overrides_of(str(r)) if ledger.split_spec(str(r)) else
                recorded_overrides(r)) for r in args.runs] or [("overrides", extra)]  # fmt: skip
    for i, (name, overrides) in enumerate(sources):
        name = _relative(name)  # no machine's path in a record that may be committed
        print(f"\n{name}: {' '.join(overrides)}")
        run = probe_run(overrides, args)
        run["run"] = name
        run["label"] = args.label[i] if i < len(args.label) else ""
        record["runs"].append(run)
        if args.json:  # written after every run: a stopped probe keeps what it measured
            args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.figure:
        draw(record, args.figure)
    return 0
