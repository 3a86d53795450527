"""Which parameters each optimizer trains with which update and lr: read off the optimizer the
study's runs build (optim.build_optimizer over the proxy), so the report states it as run."""

from __future__ import annotations

from collections import defaultdict


def _kind(name: str, ndim: int) -> str:
    if name.endswith("wte.weight"):
        return "token embedding = head (tied)"
    if name.endswith("wpe.weight"):
        return "position embedding"
    return "block matrices" if ndim >= 2 else "norm gains (1-D)"


PRECONDITIONERS = {"adam": "AdamW", "soap": "SOAP", "ademamix": "AdEMAMix",
                   "normuon": "NorMuon (Newton-Schulz, per-row second moment)"}  # fmt: skip
MUON_AUX_LR = {"muon": "adamw_lr", "normuon": "adamw_lr"}  # their AdamW part's own lr


def _update(group: dict, ndim: int, opt_name: str) -> tuple[str, str]:
    """(update, the tuned value that is its peak lr) of one parameter in ``group``: a group that
    ``aux_lr`` made (``kind: aux``) is at aux_lr, whatever its update."""
    update, lr = _update_lr(group, ndim, opt_name)
    return update, "aux_lr" if group.get("kind") == "aux" else lr


def _update_lr(group: dict, ndim: int, opt_name: str) -> tuple[str, str]:
    if "use_muon" in group:
        if group["use_muon"]:
            algo = (
                "MARS-M (variance-reduced Newton-Schulz)"
                if group.get("gamma")
                else "Muon (Newton-Schulz)"
            )
            scale = {"rms": "update RMS matched to AdamW (0.2 sqrt(max dim))",
                     "shape": "sqrt(max(1, rows/cols))"}.get(group.get("scale"), group.get("scale"))  # fmt: skip
            return f"{algo}, {scale}, wd {group['weight_decay']}", "lr"
        return f"AdamW, wd {group['weight_decay']}", MUON_AUX_LR.get(opt_name, "lr")
    if "weight_lr_power" in group:  # Schedule-Free AdamW
        return f"Schedule-Free AdamW, wd {group['weight_decay']}", "lr"
    pre = group.get("preconditioner", "adam")
    name = PRECONDITIONERS.get(pre, pre)
    if pre == "soap" and ndim < 2 and not group.get("precondition_1d"):
        name = "SOAP's Adam (1-D tensors not rotated)"  # precondition_1d=false
    if group.get("variance_reduction"):
        if ndim < 2 and group.get("split_1d"):
            return "AdamW fallback (no variance reduction)", "lr_1d"
        return f"MARS-{name} (gamma {group['gamma']}), wd {group['weight_decay']}", "lr"
    lr = MUON_AUX_LR.get(opt_name, "lr") if pre == "adam" and opt_name in MUON_AUX_LR else "lr"
    return f"{name}, wd {group['weight_decay']}", lr


def routing(optimizer: str, model: str, options: dict | None = None) -> list[tuple[str, str, str]]:
    """``[(parameters, update, lr)]`` for ``optimizer`` on ``model`` with config ``options``."""
    import torch

    from model import build_model
    from optim import build_optimizer, get_spec
    from study.plan import model_config

    with torch.device("meta"):
        m = build_model(model_config(model))
    names = {id(p): (n, p.ndim) for n, p in m.named_parameters()}
    opt = build_optimizer(m, get_spec(optimizer).config_cls(**(options or {})))
    rows: dict = defaultdict(list)
    for group in opt.param_groups:
        for p in group["params"]:
            name, ndim = names[id(p)]
            rows[_update(group, ndim, optimizer)].append(_kind(name, ndim))
    return [(", ".join(sorted(set(kinds))), upd, lr) for (upd, lr), kinds in rows.items()]
