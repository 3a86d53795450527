"""``optimizer.aux_lr``, one knob with one meaning in every registered optimizer
(docs/optimizers.md): None changes nothing; a number is the peak lr of every parameter that is
not a block matrix (optim/groups.py: the embedding = tied head, an untied head, positions, gains,
biases), whatever rule it is on, and only that lr changes.

Each test runs over the whole registry, so a new optimizer is covered when it is registered, on a
small GPT (tied embedding, positions, gains, biases) and a LLaMA-style model (untied head, RMS
gains). ``tests/fixtures/optim_groups_before_aux_lr.json`` holds every optimizer's param groups
as built before aux_lr existed (commit 0f706ae): aux_lr=None must build exactly those."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import optim
from helpers import ROOT
from model import ModelConfig, build_model
from optim.core import VarianceReduced, route

MODELS = {
    "gpt": dict(arch="gpt2", block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16,
                bias=True),
    "llama": dict(arch="llama", block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16),
}  # fmt: skip
BEFORE = json.loads((ROOT / "tests" / "fixtures" / "optim_groups_before_aux_lr.json").read_text())
NAMES = optim.available()
CASES = [(n, a) for n in NAMES for a in MODELS]
IDS = [f"{n}-{a}" for n, a in CASES]
AUX = 0.0123  # no optimizer's default lr
# Keys that only name a group or hold its lr (the schedule's peak; MARS's fallback factor)
LR_KEYS = {"params", "lr", "initial_lr", "kind", "lr_1d_factor"}


def fields_of(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(optim.get_spec(name).config_cls)}


def plain(value):
    """A group value as JSON (floats by repr, so that equality is exact)."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items())}
    return repr(value)


def describe(model, opt) -> dict:
    """The optimizer's class and its param groups: parameter names and every other key."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{"params": [names[id(p)] for p in g["params"]],
               **{k: plain(v) for k, v in sorted(g.items()) if k != "params"}}
              for g in opt.param_groups]  # fmt: skip
    return {"class": type(opt).__name__, "groups": groups}


def build(name: str, arch: str, **overrides):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**MODELS[arch])).double()
    return model, optim.build_optimizer(model, optim.get_spec(name).config_cls(**overrides))


def run(model, opt, steps: int = 4) -> list[torch.Tensor]:
    """``steps`` scheduled steps (warm-up, then cosine) on seeded synthetic gradients (and
    reference gradients in exact mode): each tensor's update depends on its own gradients only,
    so runs that share the gradient stream can be compared tensor by tensor."""
    optim.set_initial_lr(opt)
    sched = optim.ScheduleConfig(name="cosine", warmup_steps=1, min_lr_ratio=0.1)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        optim.apply_schedule(opt, step, sched, steps)
        if getattr(opt, "needs_reference_grad", False):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            opt.store_reference_grad()
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def matrix_ids(model) -> set[int]:
    return {id(p) for _, p in optim.classify_parameters(model)["matrix"]}


def effective_lr(opt, group: dict, p: torch.Tensor) -> float:
    """The lr ``p`` is stepped with: the group's, or the core's routed one (MARS's fallback)."""
    return route(p, group)[1]["lr"] if isinstance(opt, VarianceReduced) else group["lr"]


def group_of(opt) -> dict[int, dict]:
    out = {}
    for g in opt.param_groups:
        for p in g["params"]:
            assert id(p) not in out, "a parameter in two groups"
            out[id(p)] = g
    return out


def test_every_optimizer_has_the_field():
    for name in NAMES:
        cls = optim.get_spec(name).config_cls
        assert cls().aux_lr is None, name
        with pytest.raises(ValueError, match="optimizer.aux_lr"):
            cls(aux_lr=0.0)
        assert cls(aux_lr=3e-3).aux_lr == 3e-3


@pytest.mark.parametrize("name,arch", CASES, ids=IDS)
def test_unset_builds_the_groups_of_before(name, arch):
    """(a) aux_lr=None: the param groups (every key, every parameter, in order) and the class
    are those built before aux_lr existed, so the steps are the same, bit for bit. (One change
    since, not aux_lr's: AdamW's groups say foreach=True on the CPU too, 8f7670f, its values the
    same bit for bit.)"""
    key = f"{name}/{arch}"
    if key not in BEFORE:
        pytest.skip(f"{name} was registered after aux_lr: nothing to compare with")
    model, opt = build(name, arch)
    assert json.loads(json.dumps(describe(model, opt))) == BEFORE[key]


def equal_lrs(name: str) -> dict:
    """Overrides under which every parameter already steps at ``lr``: then aux_lr=lr may only
    regroup the parameters, never change a number."""
    cfg = optim.get_spec(name).config_cls()
    return {k: cfg.lr for k in ("lr_1d", "adamw_lr") if k in fields_of(name)}


@pytest.mark.parametrize("name,arch", CASES, ids=IDS)
def test_moving_to_an_aux_group_at_the_same_lr_changes_no_bit(name, arch):
    """(a) The regrouping alone is arithmetic-neutral: with every lr equal, aux_lr=lr gives the
    trajectory of aux_lr unset, bit for bit (approx and, where there is one, exact mode)."""
    modes = [{"mode": m} for m in ("approx", "exact")] if "mode" in fields_of(name) else [{}]
    for mode in modes:
        over = {**equal_lrs(name), **mode}
        lr = optim.get_spec(name).config_cls().lr
        base = run(*build(name, arch, **over))
        split_model, split_opt = build(name, arch, aux_lr=lr, **over)
        assert any(g.get("kind") == "aux" for g in split_opt.param_groups)
        for a, b in zip(base, run(split_model, split_opt)):
            assert torch.equal(a, b), (name, mode)


@pytest.mark.parametrize("name,arch", CASES, ids=IDS)
def test_set_moves_only_the_lr_of_the_non_matrix_parameters(name, arch):
    """(b) aux_lr set: each non-matrix parameter is stepped at aux_lr (its group's lr, and for
    MARS's 1-D fallback the routed lr), each matrix at lr; every other value of each
    parameter's group is what it was without aux_lr."""
    model, opt = build(name, arch, aux_lr=AUX)
    ref_model, ref_opt = build(name, arch)
    lr = optim.get_spec(name).config_cls().lr
    matrices, groups = matrix_ids(model), group_of(opt)
    ref_groups = group_of(ref_opt)
    ref_by_name = dict(ref_model.named_parameters())
    kinds = optim.classify_parameters(model)
    assert kinds["embedding"] and kinds["gain"] and (kinds["head"] or arch == "gpt")
    assert len(groups) == len(ref_groups) == len(list(model.parameters()))
    for pname, p in model.named_parameters():
        g, ref_g = groups[id(p)], ref_groups[id(ref_by_name[pname])]
        if id(p) in matrices:
            assert g["lr"] == lr and effective_lr(opt, g, p) == lr, pname
        else:
            assert g["lr"] == AUX and g["kind"] == "aux", pname
            assert effective_lr(opt, g, p) == AUX, pname
        same = {k: plain(v) for k, v in g.items() if k not in LR_KEYS}
        assert same == {k: plain(v) for k, v in ref_g.items() if k not in LR_KEYS}, pname


@pytest.mark.parametrize("name,arch", CASES, ids=IDS)
def test_set_steps_each_parameter_as_the_optimizer_at_that_lr(name, arch):
    """(c) float64, scheduled steps: with aux_lr = 2 lr the matrices follow the optimizer at lr
    and every other parameter the same optimizer with all its lrs at 2 lr (lr, and lr_1d or
    adamw_lr where it has them), bit for bit; in exact mode too where there is one."""
    lr = optim.get_spec(name).config_cls().lr
    modes = [{"mode": m} for m in ("approx", "exact")] if "mode" in fields_of(name) else [{}]
    for mode in modes:
        model, opt = build(name, arch, aux_lr=2 * lr, **mode)
        got = run(model, opt)
        low = run(*build(name, arch, **mode))
        high = run(*build(name, arch, lr=2 * lr, **{k: 2 * lr for k in equal_lrs(name)}, **mode))
        matrices = matrix_ids(model)
        for p, a, b, c in zip(model.parameters(), got, low, high):
            assert torch.equal(a, b if id(p) in matrices else c), (name, mode, tuple(p.shape))
            if id(p) not in matrices:
                assert not torch.equal(a, b)  # aux_lr acts on it
