"""The typed rule and its checks (optim/rule.py, optim/options.py, optim/core.py): the core
owns the step counter, every option has one validator, and an unknown key is an error."""

import copy

import pytest
import torch

import optim
from optim.momentum import MOMENTA
from optim.muon import muon_group
from optim.options import VALIDATORS, check_option


def params():
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in ((4, 3), (5,))]


def step(opt, ps, n=2):
    for t in range(n):
        for p in ps:
            p.grad = torch.full_like(p, 0.1 * (t + 1))
        opt.step()


@pytest.mark.parametrize("form", sorted(MOMENTA))
@pytest.mark.parametrize("preconditioner", ["adam", "sign", "newton-schulz"])
def test_every_state_has_the_step_whatever_the_momentum(form, preconditioner):
    """A preconditioner may read state["step"] (Adam's bias corrections) with any momentum: it
    was a KeyError with the MARS-M momentum, which did not count steps."""
    rule = optim.Rule(momentum=form, preconditioner=preconditioner)
    ps = params()
    hyper = dict(lr=1e-2, betas=(0.9, 0.99), momentum=0.9, nesterov=True, gamma=0.1,
                 weight_decay=0.0)  # fmt: skip
    opt = optim.VarianceReduced(ps, {**hyper, **rule.group_keys()})
    step(opt, ps)
    assert all(opt.state[p]["step"] == 2 for p in ps)


@pytest.mark.parametrize(
    "make,typo,hint",
    [
        (lambda g: optim.MARS([g]), "gama", "gamma"),
        (lambda g: optim.MARS([g]), "ns_step", "ns_steps"),
        (lambda g: optim.Lion([g]), "weight_decya", "weight_decay"),
        (
            lambda g: optim.MuonFamily(
                [{**muon_group(g.pop("params"), lr=0.02, weight_decay=0), **g}]
            ),
            "nesterv",
            "nesterov",
        ),  # fmt: skip
    ],
)
def test_a_misspelt_group_option_is_an_error_not_a_default(make, typo, hint):
    group = {"params": [torch.nn.Parameter(torch.zeros(3, 3))], typo: 0.5}
    with pytest.raises(ValueError, match=f"unknown option '{typo}'.*did you mean {hint}"):
        make(group)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: optim.MARS([p], gamma=-1), "gamma must be >= 0"),
        (lambda p: optim.MARS([{"params": [p], "gamma": -1}]), "gamma must be >= 0"),
        (lambda p: optim.MARS_M(muon_params=[p], gamma=-1), "gamma must be >= 0"),
        (lambda p: optim.MARS_M_Efficient(muon_params=[p], gamma=-1), "gamma must be >= 0"),
        (lambda p: optim.Muon([p], ns_steps=0), "ns_steps must be >= 1"),
        (lambda p: optim.MARS([p], mars_type="mars-shampoo", ns_steps=0), "ns_steps must be"),
        (lambda p: optim.Lion([p], lr=-1), "lr must be > 0"),
        (lambda p: optim.Moonlight(muon_params=[p], lr=0), "lr must be > 0"),
        (lambda p: optim.MARS([p], betas_1d=(1.0, 0.9)), "betas_1d must be two numbers"),
        (lambda p: optim.Muon([p], adamw_betas=(0.9, 1.0)), "betas must be two numbers"),
        (lambda p: optim.MARS([p], clip="sometimes"), "unknown clip 'sometimes'"),
        (lambda p: optim.MARS_M_Efficient(muon_params=[p], momentum=0.0), "momentum must be"),
    ],
)
def test_each_knob_has_one_validator_everywhere(make, message):
    with pytest.raises(ValueError, match=message):
        make(torch.nn.Parameter(torch.zeros(3, 3)))


def test_one_validator_per_option_and_aliases_share_it():
    for name in ("lr", "betas", "eps", "weight_decay", "gamma", "ns_steps", "momentum", "clip"):
        assert name in VALIDATORS
    for alias, key in (("adamw_lr", "adamw_lr must be > 0"), ("betas_1d", "betas_1d must be")):
        with pytest.raises(ValueError, match=key):
            check_option(alias, -1 if alias == "adamw_lr" else (2.0, 0.5))


def test_rule_refuses_an_unknown_preconditioner_and_foreign_options():
    with pytest.raises(ValueError, match="register_preconditioner"):
        optim.Rule(momentum="ema", preconditioner="shampoo2")
    from optim.preconditioners import AdamOptions

    with pytest.raises(TypeError, match="NewtonSchulzOptions"):
        optim.Rule(momentum="ema", preconditioner="newton-schulz", options=AdamOptions())


def test_a_state_dict_of_the_previous_version_loads_and_steps():
    """Checkpoints written before the core kept every step: Muon states had no "step" and its
    groups fewer keys; both load, and the next step equals the uninterrupted one."""
    ps, qs = params()[:1], params()[:1]
    a, b = optim.Muon(ps, implementation="foreach"), optim.Muon(qs, implementation="foreach")
    step(a, ps), step(b, qs)
    old = copy.deepcopy(a.state_dict())
    for state in old["state"].values():
        state.pop("step")
    for group in old["param_groups"]:
        for key in ("split_1d", "amsgrad", "ns_debias", "decay_bias_corrected"):
            group.pop(key, None)
    b.load_state_dict(old)
    step(a, ps, 1), step(b, qs, 1)
    torch.testing.assert_close(ps[0], qs[0], rtol=0, atol=0)
