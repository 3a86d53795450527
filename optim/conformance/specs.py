"""What each conformance vector runs: the official optimizer, its settings, routing and tolerance.

Settings are written in the official constructors' keywords, exactly as the official training
scripts pass them (``MARS/train_mars.py`` through ``configure_optimizers``, ``MARS/train_muon.py``,
``MARS_M/train_mars_m.py``, ``MARS_M/train_moonlight.py``), with one exception said in ``notes``:
``MARS_M``'s ``clip_c`` is left out (the official code ignores it and always clips; this project
honours it, and its default ``clip_c=True`` is the official behaviour).

Layouts (how the parameters reach the constructor):

- ``groups``: ``Cls(groups, **kwargs)`` with ``groups`` the official model's decay / no-decay
  param groups (``configure_optimizers``: Linear weights decayed, the rest not; names sorted);
- ``muon_adamw``: ``Cls(muon_params=..., adamw_params=..., **kwargs)``, the MARS-M scripts'
  split (ndim >= 2 and not an embedding or head on Muon);
- ``combined``: the MARS repo's Muon baseline, ``CombinedOptimizer(params, [AdamW, Muon],
  [adamw_kwargs, kwargs])``: every tensor with ndim >= 2 (the embedding too) on Muon, the rest on
  the repo's own AdamW; each part's lr follows the schedule from its own peak.

Tolerances (runner.py): vectors whose official code runs in float64 throughout compare every
element after every step, ``|ours - official| <= atol + rtol * |official|`` with 1e-10 on both.
Vectors whose official code forces Newton-Schulz into bf16 (MARS-Shampoo, Muon, MARS-M,
Moonlight) compare each step's update of each tensor, ``||d_ours - d_official|| <= update_rtol *
||d_official||`` (Frobenius norms), with ``update_rtol`` 0.15 set from measurement
(docs/conformance.md, "Tolerances").
"""

from __future__ import annotations

from optim.conformance.scenario import TENSORS

MATRICES = [n for n, s in TENSORS.items() if len(s) == 2]
DECAY = sorted(n for n in MATRICES if n != "wte.weight")  # configure_optimizers: Linear weights
NO_DECAY = sorted(n for n in TENSORS if n not in DECAY)
MUON_M = [n for n in MATRICES if "wte" not in n]  # the MARS-M scripts' name rule
ADAMW_M = [n for n in TENSORS if n not in MUON_M]

FLOAT64 = {"atol": 1e-10, "rtol": 1e-10}
BF16_NS = {"update_rtol": 0.15}  # measured: see docs/conformance.md, "Tolerances"

MARS_KW = dict(lr=6e-3, betas=[0.95, 0.99], gamma=0.025, optimize_1d=False, lr_1d=3e-3,
               betas_1d=[0.9, 0.95], weight_decay_1d=0.1)  # fmt: skip
MUON_FAMILY_KW = dict(lr=6e-3, wd=0.1, momentum=0.95, adamw_betas=[0.9, 0.95])


def _mars(mars_type: str, mode: str) -> dict:
    return dict(
        name=f"{mars_type}-{mode}",
        official="MARS/optimizers/mars.py:MARS",
        official_class="MARS",
        mode=mode,
        layout="groups",
        groups=[{"params": DECAY, "weight_decay": 0.1}, {"params": NO_DECAY, "weight_decay": 0.0}],
        kwargs={**MARS_KW, "mars_type": mars_type, "is_approx": mode == "approx"},
        lr={"base": 6e-3, "min": 6e-4},
        kappa=0.025 * 0.95 / 0.05,
        ns_dtype="bfloat16" if mars_type == "mars-shampoo" else None,
        tolerance=BF16_NS if mars_type == "mars-shampoo" else FLOAT64,
    )


def _muon_family(name: str, cls: str, path: str, mode: str, extra: dict, notes: str) -> dict:
    return dict(
        name=name,
        official=f"MARS_M/optimizers/{path}:{cls}",
        official_class=cls,
        mode=mode,
        layout="muon_adamw",
        muon_params=MUON_M,
        adamw_params=ADAMW_M,
        kwargs={**MUON_FAMILY_KW, **extra},
        lr={"base": 6e-3, "min": 6e-4},
        kappa=0.025 * 0.95 / 0.05 if cls == "MARS_M" else None,
        ns_dtype="bfloat16",
        tolerance=BF16_NS,
        notes=notes,
    )


_CLIP_C = ("The scripts also pass clip_c=False, which the official MARS_M ignores (it always "
           "clips); left out here, since this project honours clip_c and clips by default.")  # fmt: skip

SPECS = [
    *[
        _mars(t, m)
        for t in ("mars-adamw", "mars-lion", "mars-shampoo")
        for m in ("approx", "exact")
    ],
    _muon_family(
        "mars-m-approx",
        "MARS_M",
        "mars_m.py",
        "approx",
        {"gamma": 0.025, "is_approx": True},
        _CLIP_C,
    ),  # fmt: skip
    _muon_family(
        "mars-m-exact",
        "MARS_M",
        "mars_m.py",
        "exact",
        {"gamma": 0.025, "is_approx": False},
        _CLIP_C,
    ),  # fmt: skip
    _muon_family(
        "mars-m-efficient",
        "MARS_M_Efficient",
        "mars_m_efficient.py",
        "approx",
        {"gamma": 0.025},
        "Used by no official script; driven as approx MARS-M.",
    ),  # fmt: skip
    _muon_family("moonlight", "Moonlight", "moonlight.py", "approx", {}, ""),
    dict(
        name="muon",
        official="MARS/optimizers/muon.py:Muon + MARS/optimizers/adamw.py:AdamW (MARS/opt.py)",
        official_class="Muon",
        mode="approx",
        layout="combined",
        muon_params=MATRICES,
        adamw_params=[n for n in TENSORS if n not in MATRICES],
        kwargs={"lr": 0.02, "weight_decay": 0.05},
        adamw_kwargs={"lr": 6e-3, "betas": [0.9, 0.95], "weight_decay": 0.1},
        lr={"base": 0.02, "adamw_base": 6e-3, "min": 6e-4},
        kappa=None,
        ns_dtype="bfloat16",
        tolerance=BF16_NS,
        notes=(
            "The official runs use Muon weight_decay 0; 0.05 here exercises the decay. The "
            "official Muon allocates its update buffer on 'cuda'; the generator allocates it "
            "on the CPU (same dtype, same numbers)."
        ),
    ),
]
