"""Each optimizer hyperparameter has one home: its config dataclass. Every optimizer YAML composes
to a valid config and sets only what differs from the dataclass; every config field either
changes the run or is rejected by the config's check (none silently does nothing); the fast and
plain paths of the Muon family agree with the float64 transcriptions of the official code."""

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf
from test_optim_muon import BASE, compare

import optim
from helpers import CONFIG_DIR, compose_config
from model import GPT, GPTConfig
from optim import MARS_M, MARS_M_Efficient, Moonlight, Muon
from trainer import command_line

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)
OPTIMIZER_YAMLS = sorted(p.stem for p in (CONFIG_DIR / "optimizer").glob("*.yaml"))
# Implementation choices, not hyperparameters: they must reach the optimizer, not change it.
IMPLEMENTATION = {"implementation": "loop", "ns_distributed": False}
ALTERNATIVES = {
    "mode": {"approx": "exact", "exact": "approx"},
    "clip": {"tensor": "none"},
    "second_moment": {"c": "g"},
    "first_step": {"zero": "plain"},
    "ns_dtype": {"bfloat16": "float32"},
    "routing": {"mars-repo": "recommended"},
    "scale": {"shape": "rms"},
    # values that act within the test's four steps and its small shapes
    "precondition_frequency": {10: 2},
    "max_precond_dim": {10000: 32},
    "alpha_warmup": {None: 3},
    "beta3_warmup": {None: 3},
    "aux_lr": {None: 3e-2},
    "warmup_steps": {0: 3},
    "gamma_schedule": {"constant": "linear"},
}


@pytest.mark.parametrize("name", OPTIMIZER_YAMLS)
def test_yaml_composes_and_sets_only_what_differs(name):
    typed, _ = command_line.to_typed(compose_config(f"optimizer={name}"))
    cls = optim.get_spec(typed.optimizer.name).config_cls
    assert isinstance(typed.optimizer, cls)
    raw = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "optimizer" / f"{name}.yaml"))
    assert raw.pop("defaults")[-1] == "_self_"
    defaults = cls()
    for key, value in raw.items():
        assert hasattr(defaults, key), f"{name}.yaml: {key} is not a field of {cls.__name__}"
        if key != "name":
            assert value != getattr(defaults, key), f"{name}.yaml restates the default {key}"


def perturbed(field: str, value):
    """A different valid-looking value for ``field`` (a config check may still reject it)."""
    if field in ALTERNATIVES:
        return ALTERNATIVES[field][value]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return max(1, value - 2)
    if isinstance(value, float):
        return value * 0.5 if value >= 0.5 else value + 0.05
    if field == "decay_kinds":
        return [*value, "embedding"]
    if isinstance(value, list):
        return [perturbed(field, v) for v in value]
    raise AssertionError(f"no perturbation for {field}={value!r}")


def final_params(name: str, loss_scale: float, **overrides) -> list[torch.Tensor]:
    """Four steps of a small GPT through the training loop's exact-mode hook,
    optim.reference_pass (``loss_scale`` 100: the MARS clip acts)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL))
    opt = optim.build_optimizer(model, optim.get_spec(name).config_cls(**overrides))
    optim.set_initial_lr(opt)  # the schedules as the loop applies them (a gamma_schedule too)
    constant = optim.ScheduleConfig(name="constant")

    def backward(step: int) -> None:
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randint(0, 64, (4, 17), generator=g)
        (loss_scale * model(x[:, :-1], x[:, 1:])[1]).backward()

    for step in range(4):
        optim.apply_schedule(opt, step, constant, 4)
        optim.reference_pass(opt, lambda step=step: backward(step + 1))
        backward(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


CASES = [
    (name, f.name)
    for name in optim.available()
    for f in dataclasses.fields(optim.get_spec(name).config_cls)
    if f.name != "name"
]


@pytest.mark.parametrize("name,field", CASES, ids=[f"{n}.{f}" for n, f in CASES])
def test_every_config_field_changes_the_run_or_is_rejected(name, field):
    cls = optim.get_spec(name).config_cls
    new = (
        IMPLEMENTATION[field]
        if field in IMPLEMENTATION
        else perturbed(field, getattr(cls(), field))
    )
    try:
        cls(**{field: new})
    except ValueError:
        return  # a knob pinned to one value (e.g. MARS-M's nesterov) says so by rejecting others
    if field in IMPLEMENTATION:
        model = GPT(GPTConfig(**SMALL))
        opt = optim.build_optimizer(model, cls(**{field: new}))
        if field == "implementation" and isinstance(opt, torch.optim.AdamW):
            assert opt.defaults["foreach"] is False  # torch's per-tensor loop
            return
        groups = [g.get(field) for g in opt.param_groups]
        assert new in (getattr(opt, field, None), opt.defaults.get(field), *groups), field
        return
    for loss_scale in (1.0, 100.0):
        base = final_params(name, loss_scale)
        changed = final_params(name, loss_scale, **{field: new})
        if any(not torch.equal(a, b) for a, b in zip(base, changed)):
            return
    raise AssertionError(f"{name}.{field}={new!r} changes nothing")


def test_reference_pass_only_for_exact_optimizers():
    calls = []
    for mode, runs in (("approx", False), ("exact", True)):
        model = GPT(GPTConfig(**SMALL))
        opt = optim.build_optimizer(model, optim.get_spec("mars-m").config_cls(mode=mode))
        assert optim.reference_pass(opt, lambda mode=mode: calls.append(mode)) is runs
    assert calls == ["exact"]


FAMILY = {
    "mars-m": (dict(kind="mars-m", gamma=0.025, clip=True, scale="rms"),
               lambda m, v, **kw: MARS_M(lr=2e-2, wd=0.1, muon_params=m, adamw_params=v, **kw)),
    "efficient": (dict(kind="efficient", gamma=0.025, scale="rms"),
                  lambda m, v, **kw: MARS_M_Efficient(lr=2e-2, wd=0.1, muon_params=m,
                                                      adamw_params=v, **kw)),
    "moonlight": (dict(kind="muon", nesterov=True, scale="rms"),
                  lambda m, v, **kw: Moonlight(lr=2e-2, wd=0.1, muon_params=m, adamw_params=v,
                                               **kw)),
    "muon": (dict(kind="muon", nesterov=True, scale="shape", wd=0.0, adamw_lr=3e-3,
                  bias_corrected_decay=True),
             lambda m, v, **kw: Muon(m, lr=2e-2, adamw_params=v, adamw_lr=3e-3, **kw)),
}  # fmt: skip


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("kind", sorted(FAMILY))
def test_muon_family_fast_and_plain_paths_match_transcription(kind, foreach):
    h, make = FAMILY[kind]
    how = "foreach" if foreach else "loop"
    compare(lambda m, v: make(m, v, ns_dtype="float64", implementation=how), dict(BASE, **h))


def test_muon_family_sends_non_matrices_to_adamw():
    m = torch.nn.Parameter(torch.randn(4, 4))
    conv = torch.nn.Parameter(torch.randn(3, 2, 2))
    opt = Moonlight(muon_params=[m, conv])
    muon, adamw = opt.param_groups
    assert muon["params"] == [m] and adamw["params"] == [conv]
