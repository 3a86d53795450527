"""Write the conformance vectors by running the OFFICIAL optimizers (AGI-Arena/MARS).

    python -m optim.conformance.generate /path/to/official/checkout [--commit SHA] [--out DIR]

The official files are imported from that checkout by path (nothing of them is kept here) and
driven exactly as the official training scripts drive them: every iteration writes
``group['lr']`` from the scripts' ``get_lr`` for each group; in exact mode the look-ahead
gradient is put in ``p.grad``, ``update_previous_grad()`` is called and the gradients are set to
None; then the step's gradient is put in ``p.grad``, ``step()``, ``zero_grad(set_to_none=True)``
and ``update_last_grad()`` (where the class has it). Everything runs in float64 except where the
official code casts (Newton-Schulz in bf16, compiled with ``torch.compile`` as in the official
files). The weights after every step are stored with the inputs in ``vectors/NAME.pt`` and the
settings in ``vectors/manifest.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import subprocess
import sys
import types
from pathlib import Path

import torch

from optim.conformance.scenario import (
    GRAD_NORMS,
    LOOKAHEAD_NOISE,
    SEED,
    STEPS,
    TENSORS,
    WARMUP_ITERS,
    clipped_steps,
    gradients,
    initial_params,
    official_lr,
)  # fmt: skip
from optim.conformance.specs import SPECS

log = logging.getLogger(__name__)
VECTORS = Path(__file__).parent / "vectors"
FILES = {
    "MARS": "MARS/optimizers/mars.py",
    "Muon": "MARS/optimizers/muon.py",
    "AdamW": "MARS/optimizers/adamw.py",
    "Combined": "MARS/opt.py",
    "MARS_M": "MARS_M/optimizers/mars_m.py",
    "MARS_M_Efficient": "MARS_M/optimizers/mars_m_efficient.py",
    "Moonlight": "MARS_M/optimizers/moonlight.py",
}


def load_official(root: Path) -> dict[str, type]:
    """The official classes, imported from ``root`` by file path."""
    classes = {}
    for key, rel in FILES.items():
        path = root / rel
        if not path.is_file():
            raise SystemExit(f"no {rel} under {root}: pass the root of an AGI-Arena/MARS checkout")
        spec = importlib.util.spec_from_file_location(f"official_{key.lower()}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if key == "Muon":  # its update buffer is allocated on 'cuda': the same numbers on the CPU
            module.torch = _CpuTorch()
        classes[key] = getattr(module, "CombinedOptimizer" if key == "Combined" else key)
    return classes


class _CpuTorch(types.SimpleNamespace):
    """``torch`` as the official Muon module sees it, with ``zeros(device='cuda')`` on the CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, **kwargs):
        kwargs.pop("device", None)
        return torch.zeros(*args, **kwargs)


def build(spec: dict, official: dict, params: dict[str, torch.Tensor]):
    """The official optimizer for ``spec`` over ``params`` (name -> leaf tensor)."""
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["kwargs"].items()}
    if spec["layout"] == "groups":
        groups = [{**g, "params": [params[n] for n in g["params"]]} for g in spec["groups"]]
        return official[spec["official_class"]](groups, **kw)
    if spec["layout"] == "muon_adamw":
        return official[spec["official_class"]](
            muon_params=[params[n] for n in spec["muon_params"]],
            adamw_params=[params[n] for n in spec["adamw_params"]], **kw)  # fmt: skip
    adamw_kw = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["adamw_kwargs"].items()}
    return official["Combined"](list(params.values()), [official["AdamW"], official["Muon"]],
                                [adamw_kw, kw])  # fmt: skip


def lr_table(spec: dict) -> dict[str, torch.Tensor]:
    """Per tensor, the lr the official script writes into its group at each iteration."""
    lr = spec["lr"]
    adamw = set(spec.get("adamw_params", [])) if spec["layout"] == "combined" else set()
    out = {}
    for name in TENSORS:
        base = lr["adamw_base"] if name in adamw else lr["base"]
        out[name] = torch.tensor([official_lr(t, base_lr=base, min_lr=lr["min"])
                                  for t in range(STEPS)], dtype=torch.float64)  # fmt: skip
    return out


def run(spec: dict, official: dict) -> dict:
    """Drive the official optimizer through the scenario; the vector's tensors."""
    init = initial_params()
    grads, refs = gradients()
    lrs = lr_table(spec)
    params = {n: x.clone().requires_grad_(True) for n, x in init.items()}
    opt = build(spec, official, params)
    by_id = {id(p): n for n, p in params.items()}
    trajectory = {n: [] for n in params}
    for t in range(STEPS):
        for group in opt.param_groups:  # the scripts' loop: one lr per group
            group["lr"] = float(lrs[by_id[id(group["params"][0])]][t])
        if spec["mode"] == "exact":
            for n, p in params.items():
                p.grad = refs[n][t].clone()
            opt.update_previous_grad()
            opt.zero_grad(set_to_none=True)
        for n, p in params.items():
            p.grad = grads[n][t].clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if hasattr(opt, "update_last_grad"):
            opt.update_last_grad()
        for n, p in params.items():
            trajectory[n].append(p.detach().clone())
    vector = {"names": list(TENSORS), "init": init, "grads": grads, "lrs": lrs,
              "params": {n: torch.stack(v) for n, v in trajectory.items()}}  # fmt: skip
    if spec["mode"] == "exact":
        vector["refs"] = refs
    return vector


def manifest_entry(spec: dict, vector: dict) -> dict:
    """The manifest's record of one vector: its settings and where the per-tensor clip fired."""
    entry = {**spec, "file": f"{spec['name']}.pt", "steps": STEPS, "seed": SEED,
             "dtype": "float64"}  # fmt: skip
    if spec["kappa"] is not None:
        refs = vector.get("refs")
        matrices = spec.get("muon_params") or [n for n, s in TENSORS.items() if len(s) == 2]
        entry["clipped_steps"] = {
            n: clipped_steps(vector["grads"][n], None if refs is None else refs[n], spec["kappa"])
            for n in matrices
        }
    return entry


def commit_of(root: Path, given: str | None) -> str:
    if given:
        return given
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                             capture_output=True, text=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"{root} is not a git checkout: pass --commit SHA") from None
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("official", type=Path, help="root of an AGI-Arena/MARS checkout")
    parser.add_argument("--commit", help="the checkout's commit (default: git rev-parse HEAD)")
    parser.add_argument("--out", type=Path, default=VECTORS, help="output folder")
    parser.add_argument("--only", nargs="*", help="vector names (default: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    commit = commit_of(args.official, args.commit)
    official = load_official(args.official)
    args.out.mkdir(parents=True, exist_ok=True)
    entries = []
    for spec in SPECS:
        if args.only and spec["name"] not in args.only:
            continue
        vector = run(spec, official)
        torch.save(vector, args.out / f"{spec['name']}.pt")
        entries.append(manifest_entry(spec, vector))
        log.info("wrote %s", spec["name"])
    manifest = {
        "official": {"repository": "AGI-Arena/MARS", "commit": commit, "torch": torch.__version__},
        "generator": "python -m optim.conformance.generate OFFICIAL_CHECKOUT --commit SHA",
        "scenario": {"seed": SEED, "steps": STEPS, "tensors": {n: list(s) for n, s in
                     TENSORS.items()}, "grad_norms": list(GRAD_NORMS),
                     "lookahead_noise": LOOKAHEAD_NOISE, "warmup_iters": WARMUP_ITERS},
        "vectors": entries,
    }  # fmt: skip
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
