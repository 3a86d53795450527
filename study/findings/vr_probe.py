"""How much MARS's approximate correction inflates the gradient it preconditions, by batch size.

    python -m study probe RUN_DIR [RUN_DIR ...] [--fixed 2048 8192 32768 131072]
                          [--kappa K] [--threads 1] [--json FILE]

The approximate correction (official MARS, ``mode: approx``) preconditions ``c_t = g_t + kappa
(g_t - g_{t-1})``, ``kappa = gamma beta1 / (1 - beta1)`` (0.475 at gamma 0.025, beta1 0.95),
with ``g_{t-1}`` the previous step's gradient on another batch at the previous weights. Written
as a function of the cosine ``rho`` of consecutive gradients of equal norm, ``|c|^2 / |g|^2 = (1
+ kappa)^2 + kappa^2 - 2 kappa (1 + kappa) rho``: 2.40 when consecutive gradients are
independent (rho 0: noise dominates), 1 when they agree (rho 1), and up to (1 + 2 kappa)^2 =
3.80 when they point apart (rho -1: the step overshoots). Two things set rho along a run: the
batch's noise, and how far the step moves the weights between the two.

For each RUN_DIR (a finished run of train.py on one process, e.g. a study's evaluation run) the
probe replays, on the CPU, the run's step from its recorded command (meta.jsonl) and, before
every optimizer step, reads the raw gradients of the block matrices (the 2-D tensors of the transformer blocks;
the correction acts on them) and the previous step's: the inflation ``|c_t|^2 / |g_t|^2`` and
``rho``, summed over the block matrices, in four windows of the run. It checks its replay
against the run's logged training losses (equal to the last bit where the code, thread count and
CPU kind are the run's; another CPU kind differs in the last bits, which a long run amplifies).
``--kappa`` measures a run of another optimizer (AdamW's trajectory, say) with MARS's correction
applied on paper. Then, at the run's final weights, ``--fixed``: two gradients on independent
batches of each size at the same weights, their cosine (the noise part of rho alone: the weights
do not move between them) and the inflation that cosine predicts, so the table says at which
batch the correction would stop inflating the update on this model and data. Figures are printed
with the device and written to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def device_line(device: torch.device | str = "cpu") -> str:
    """The device the probe ran on, its CPU (or GPU) kind, threads and torch, for the record."""
    import os
    import platform

    from runtime.runfiles import cpu_name

    device = torch.device(device)
    kind = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return (f"device: {device} ({kind}), {os.cpu_count()} cores, {torch.get_num_threads()} "
            f"threads, Python {platform.python_version()}, torch {torch.__version__}")  # fmt: skip


def kappa_of(cfg) -> float:  # noqa: ANN001
    """``gamma beta1 / (1 - beta1)`` of a MARS optimizer config: beta1 is ``betas[0]`` (the
    MARS-AdamW family) or ``momentum`` (MARS-M); 0 for an optimizer without a correction."""
    opt = cfg.optimizer
    gamma = float(getattr(opt, "gamma", 0.0) or 0.0)
    if gamma == 0.0:
        return 0.0
    betas, momentum = getattr(opt, "betas", None), getattr(opt, "momentum", None)
    beta1 = float(betas[0]) if betas else float(momentum) if momentum is not None else None
    if beta1 is None:
        raise SystemExit(f"study.vr_probe: {opt.name} has gamma but neither betas nor momentum; "
                         "give the correction's --kappa")  # fmt: skip
    return gamma * beta1 / (1.0 - beta1)


def predicted_inflation(kappa: float, rho: float) -> float:
    """``|c|^2 / |g|^2`` for consecutive gradients of equal norm and cosine ``rho``."""
    return (1 + kappa) ** 2 + kappa**2 - 2 * kappa * (1 + kappa) * rho


def block_matrices(model: torch.nn.Module) -> list[torch.Tensor]:
    """The transformer blocks' 2-D weights (not the embedding, head or gains)."""
    return [p for n, p in model.named_parameters() if p.ndim == 2 and ".h." in n]


def recorded_overrides(run_dir: Path) -> list[str]:
    """The overrides of the run's recorded ``train.py`` command (meta.jsonl), without out_dir."""
    from runtime import runfiles

    metas = runfiles.read_meta(run_dir)
    argv = (metas[0].get("argv") or []) if metas else []
    if (
        not argv
        or not str(argv[0]).endswith("train.py")
        or not (run_dir / "metrics.jsonl").is_file()
    ):
        raise SystemExit(f"study.vr_probe: {run_dir} is not a finished train.py run (its "
                         "meta.jsonl records the command, metrics.jsonl the losses)")  # fmt: skip
    if int(metas[0].get("world_size") or 1) != 1:
        raise SystemExit(f"study.vr_probe: {run_dir} ran on several processes; the probe "
                         "replays one-process runs")  # fmt: skip
    return [a for a in argv[1:] if not a.startswith("out_dir=")]


def build(run_dir: Path):  # noqa: ANN201
    """(Trainer, typed config, recorded overrides) of a finished run, ready to step."""
    overrides = recorded_overrides(run_dir)
    trainer, cfg = build_from(overrides)
    return trainer, cfg, overrides


def build_from(overrides: list[str]):  # noqa: ANN201
    """(Trainer, typed config) of the run ``overrides`` describe (no out_dir: nothing is
    written), ready to step from its first step."""
    from data import ensure_prepared
    from runtime.distributed import DistInfo
    from trainer import command_line
    from trainer.trainer import Trainer

    cfg, _ = command_line.compose_typed(overrides)
    ensure_prepared(cfg.data.name, cfg.data.dir, cfg.data.tokenizer, cfg.data.val_fraction)
    trainer = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")))
    trainer.wrap()
    return trainer, cfg


def logged_losses(run_dir: Path) -> dict[int, float]:
    """The run's logged training loss per step (metrics.jsonl)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        if "train_loss" in rec:
            out[int(rec["step"])] = float(rec["train_loss"])
    return out


def replay(run_dir: Path, kappa: float | None = None) -> dict:
    """The run replayed with the inflation and rho of every step (module docstring); ``kappa``
    replaces the run's own (an AdamW run: what the correction would do on its trajectory)."""
    trainer, cfg, overrides = build(run_dir)
    if getattr(trainer.optimizer, "needs_reference_grad", False):
        raise SystemExit(f"study.vr_probe: {run_dir} runs exact MARS; the probe measures the "
                         "approximate correction (mode: approx)")  # fmt: skip
    kappa = kappa_of(cfg) if kappa is None else kappa
    blocks = block_matrices(trainer.raw_model)
    prev: list[torch.Tensor] | None = None
    steps: list[dict] = []
    step_fn = trainer.optimizer.step

    def probed_step(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        nonlocal prev
        grads = [p.grad.detach().double().clone() for p in blocks]
        if prev is not None:
            gg = sum(float((g * g).sum()) for g in grads)
            pp = sum(float((q * q).sum()) for q in prev)
            gp = sum(float((g * q).sum()) for g, q in zip(grads, prev))
            cc = sum(float(((1 + kappa) * g - kappa * q).pow(2).sum()) for g, q in zip(grads, prev))
            steps.append({"inflation": cc / gg, "rho": gp / math.sqrt(gg * pp), "norm_ratio":
                          math.sqrt(gg / pp)})  # fmt: skip
        prev = grads
        return step_fn(*args, **kwargs)

    trainer.optimizer.step = probed_step
    logged, losses = logged_losses(run_dir), {}
    t0 = time.perf_counter()
    while trainer.state.step < cfg.max_steps:
        loss, _, _ = trainer.train_step()
        if trainer.state.step in logged:
            losses[trainer.state.step] = float(loss)
    trainer.optimizer.step = step_fn
    mismatch = max((abs(losses[s] - logged[s]) for s in losses), default=math.nan)
    windows = []
    q = max(1, len(steps) // 4)
    for i in range(4):
        part = steps[i * q : (i + 1) * q if i < 3 else len(steps)]
        if part:
            windows.append({
                "steps": f"{i * q + 2}-{i * q + 1 + len(part)}",
                "inflation": sum(s["inflation"] for s in part) / len(part),
                "rho": sum(s["rho"] for s in part) / len(part),
            })  # fmt: skip
    return {
        "run": str(run_dir), "overrides": overrides, "batch_tokens": cfg.batch_tokens,
        "steps": cfg.max_steps, "kappa": kappa, "windows": windows,
        "replay_max_loss_diff": mismatch, "replay_steps_checked": len(losses),
        "seconds": round(time.perf_counter() - t0, 1), "trainer": trainer,
    }  # fmt: skip


def fixed_weights(trainer, sizes: list[int], kappa: float) -> list[dict]:  # noqa: ANN001
    """At the trainer's current weights: the cosine of two gradients on independent batches of
    each size, and the inflation it predicts."""
    from trainer.trainer import MicroBatches, forward_backward

    cfg, blocks = trainer.cfg, block_matrices(trainer.raw_model)
    per_micro = cfg.micro_batch_size * cfg.sequence_length
    rows = []
    for size in sizes:
        if size % per_micro:
            raise SystemExit(f"study.vr_probe: --fixed {size} is not a multiple of a micro-batch "
                             f"({per_micro} tokens)")  # fmt: skip
        count = size // per_micro
        grads = []
        for _ in range(2):
            trainer.optimizer.zero_grad(set_to_none=True)
            batches = MicroBatches(lambda _: trainer.loader.next_batch(), count)
            forward_backward(trainer.model, batches, trainer.dist, trainer.dtype, 1.0 / count)
            grads.append([p.grad.detach().double().clone() for p in blocks])
        trainer.optimizer.zero_grad(set_to_none=True)
        a, b = grads
        ab = sum(float((x * y).sum()) for x, y in zip(a, b))
        aa = sum(float((x * x).sum()) for x in a)
        bb = sum(float((y * y).sum()) for y in b)
        rho = ab / math.sqrt(aa * bb)
        rows.append({"batch_tokens": size, "rho": rho,
                     "predicted_inflation": predicted_inflation(kappa, rho)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m study probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    ap.add_argument("--fixed", nargs="*", type=int, default=[2048, 8192, 32768, 131072],
                    metavar="TOKENS", help="batch sizes measured at the run's final weights")  # fmt: skip
    ap.add_argument("--kappa", type=float, default=None,
                    help="the correction's kappa to measure with (default: each run's own; "
                    "0.475 is MARS's at gamma 0.025, beta1 0.95)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the study runs 1)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write every figure here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(device_line(torch.device("cpu")))
    results = []
    for run in args.runs:
        r = replay(run, args.kappa)
        trainer = r.pop("trainer")
        print(f"\n{run}\n  batch {r['batch_tokens']:,} tokens x {r['steps']} steps, kappa "
              f"{r['kappa']:.3f}; replay: {r['replay_steps_checked']} logged losses, largest "
              f"difference {r['replay_max_loss_diff']:.3g} ({r['seconds']} s)")  # fmt: skip
        print("  steps      |c|^2/|g|^2  rho (consecutive gradients, along the run)")
        for w in r["windows"]:
            print(f"  {w['steps']:<10} {w['inflation']:11.3f}  {w['rho']:+.3f}")
        if args.fixed:
            r["fixed"] = fixed_weights(trainer, args.fixed, r["kappa"])
            print("  at the final weights, two independent batches of each size:")
            print("  batch       rho     predicted |c|^2/|g|^2")
            for f in r["fixed"]:
                print(
                    f"  {f['batch_tokens']:<10,} {f['rho']:+.3f}   {f['predicted_inflation']:.3f}"
                )
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps({"device": device_line(torch.device("cpu")),
                                         "runs": results}, indent=1) + "\n")  # fmt: skip
    return 0
