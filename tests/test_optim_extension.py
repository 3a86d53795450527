"""The core's extension points (optim/core.py, docs/adding-an-optimizer.md): a subclass's
``correction`` runs on every path (loop, foreach, compiled), a private override is refused the
compiled step, per-step schedules of group keys (gamma first), and ``build_mars`` taking a
subclass. All in float64 against plain transcriptions."""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import optim
import optim.compiled as compiled_route
from optim import VarianceReduced, build_mars
from optim.functional import mars_kappa
from optim.mars import MarsAdamWConfig

SHAPES = [(6, 4), (3, 7)]


class Bounded(VarianceReduced):
    """The correction's difference bounded element-wise by |g| (a made-up variant)."""

    @staticmethod
    def correction(g, g_ref, kappa):
        bound = g.abs()
        return g + kappa * torch.minimum(torch.maximum(g - g_ref, -bound), bound)


class PrivateOverride(VarianceReduced):
    """Overrides the private bucket method: the compiled step would not call it."""

    def _corrections(self, b, foreach):
        return [g.clone() for g in b.gs]


def group_defaults(**extra):
    keys = MarsAdamWConfig().rule().group_keys()
    return {"lr": 1e-2, "betas": (0.95, 0.99), "weight_decay": 0.1, **keys,
            "split_1d": False, **extra}  # fmt: skip


def make(cls, **kwargs):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64))
              for s in SHAPES]  # fmt: skip
    defaults = group_defaults(**kwargs.pop("extra", {}))
    return params, cls(params, defaults, **kwargs)


def run(opt, params, steps, gammas=None):
    for t in range(steps):
        gen = torch.Generator().manual_seed(100 + t)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        if gammas is not None:
            for group in opt.param_groups:
                group["gamma"] = gammas[t]
        opt.step()


def transcription(correction, steps, gammas, lr=1e-2, wd=0.1, b1=0.95, b2=0.99, eps=1e-8):
    """MARS-AdamW by hand (approx mode, g_ref = 0 first, clip per tensor, v from c*c)."""
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    refs, ms, vs = ([torch.zeros_like(p) for p in ps] for _ in range(3))
    for t in range(steps):
        gen = torch.Generator().manual_seed(100 + t)
        gs = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in ps]
        for i, g in enumerate(gs):
            c = correction(g, refs[i], mars_kappa(gammas[t], b1))
            c = c / max(1.0, c.norm().item())
            ms[i] = b1 * ms[i] + (1 - b1) * c
            vs[i] = b2 * vs[i] + (1 - b2) * c * c
            n = t + 1
            d = ms[i] / ((vs[i].sqrt() / (1 - b2**n) ** 0.5 + eps) * (1 - b1**n))
            ps[i] = ps[i] - lr * (wd * ps[i] + d)
            refs[i] = g
    return ps


def test_a_subclass_correction_is_the_transcription_on_loop_and_foreach():
    expected = transcription(Bounded.correction, 3, [0.025] * 3)
    for how in ("loop", "foreach"):
        params, opt = make(Bounded, implementation=how)
        run(opt, params, 3)
        assert [r.name for _, r in opt.last_routes] == [how]
        for p, e in zip(params, expected):
            torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-14)
    base, opt = make(VarianceReduced, implementation="foreach")
    run(opt, base, 3)
    assert not torch.allclose(base[0], params[0]), "the variant changed nothing"


def test_the_compiled_step_calls_the_subclass_correction(monkeypatch):
    """The compiled step's own code, run without compiling (seconds): it takes the class's
    correction. The compiled twin of this test is ``..._compiled`` (slow)."""
    monkeypatch.setattr(
        compiled_route,
        "_compiled",
        lambda grouping: (
            compiled_route._update if grouping == "tensor" else compiled_route._multi_step
        ),
    )
    monkeypatch.setattr(compiled_route, "unavailable_reason", lambda device: None)
    params, opt = make(Bounded, implementation="compiled")
    run(opt, params, 3)
    assert [r.name for _, r in opt.last_routes] == ["compiled"]
    for p, e in zip(params, transcription(Bounded.correction, 3, [0.025] * 3)):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_the_compiled_step_calls_the_subclass_correction_compiled():
    if compiled_route.unavailable_reason("cpu"):
        pytest.skip(compiled_route.unavailable_reason("cpu"))
    params, opt = make(Bounded, implementation="compiled")
    run(opt, params, 3)
    assert [r.name for _, r in opt.last_routes] == ["compiled"] and opt.off_reason is None
    for p, e in zip(params, transcription(Bounded.correction, 3, [0.025] * 3)):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-14)


def test_a_private_override_is_refused_the_compiled_step_in_one_line():
    assert PrivateOverride.private_overrides() == ["_corrections"]
    assert Bounded.private_overrides() == []
    with pytest.raises(ValueError, match="overrides _corrections.*set the class attribute "
                                         "`correction`.*or pass implementation='foreach'"):  # fmt: skip
        make(PrivateOverride, implementation="compiled")
    params, opt = make(PrivateOverride)  # auto: eager, the override honoured
    assert not opt._want_compiled(None)
    assert "PrivateOverride overrides" in opt.off_reason


def test_a_gamma_schedule_equals_setting_gamma_by_hand_each_step():
    horizon, steps = 4, 5
    spec = ("linear", 0.05, 0.01)
    gammas = [0.05 + (0.01 - 0.05) * min(1.0, t / horizon) for t in range(steps)]
    assert [optim.schedules.hyper_value(spec, t, horizon) for t in range(steps)] == gammas
    params, opt = make(VarianceReduced, implementation="foreach",
                       extra={"schedules": {"gamma": spec}})  # fmt: skip
    optim.set_initial_lr(opt)
    sched = optim.ScheduleConfig(name="constant")
    gen_steps = []
    for t in range(steps):
        optim.apply_schedule(opt, t, sched, horizon)
        gen_steps.append(opt.param_groups[0]["gamma"])
        run_one(opt, params, t)
    assert gen_steps == gammas
    for p, e in zip(params, transcription(VarianceReduced.correction, steps, gammas)):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-14)
    assert opt.state_dict()["param_groups"][0]["schedules"] == {"gamma": spec}


def run_one(opt, params, t):
    gen = torch.Generator().manual_seed(100 + t)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
    opt.step()


@pytest.mark.parametrize("schedules, message", [
    ({"gamma": ("linaer", 0.1, 0.0)}, r"shape one of \['constant', 'linear', 'cosine'\]"),
    ({"gamma": ("linear", 0.1, -1.0)}, r"gamma \(schedule end\) must be >= 0"),
    ({"clip": ("linear", 0.1, 0.0)}, "'clip' is not a number of the group"),
    ({"gamma": "linear"}, "must be"),
])  # fmt: skip
def test_bad_schedules_are_refused_naming_the_fix(schedules, message):
    with pytest.raises(ValueError, match=message):
        make(VarianceReduced, extra={"schedules": schedules})


def test_the_gamma_schedule_of_a_mars_config_reaches_the_groups():
    model = torch.nn.Linear(4, 3)
    opt = optim.build_optimizer(model, MarsAdamWConfig(gamma_schedule="cosine", gamma_end=0.0))
    assert all(g["schedules"] == {"gamma": ("cosine", 0.025, 0.0)} for g in opt.param_groups)
    assert "schedules" not in optim.build_optimizer(model, MarsAdamWConfig()).param_groups[0]
    with pytest.raises(ValueError, match="unknown optimizer.gamma_schedule 'lin'"):
        MarsAdamWConfig(gamma_schedule="lin")
    with pytest.raises(ValueError, match="gamma_end=0.01 is read only by a gamma schedule: set "
                                         "optimizer.gamma_schedule=linear"):  # fmt: skip
        MarsAdamWConfig(gamma_end=0.01)  # ignored otherwise: refused, not silently dropped


class Tagged(VarianceReduced):
    adapter_keys = ("bound",)


@dataclass
class TaggedConfig(MarsAdamWConfig):
    name: str = "tagged"
    bound: float = 2.0

    optimizer_class: ClassVar[type] = Tagged


def test_build_mars_takes_a_subclass_and_its_group_keys():
    model = torch.nn.Linear(4, 3)
    opt = build_mars(model, TaggedConfig())
    assert type(opt) is Tagged and opt.param_groups[0]["bound"] == 2.0
    assert type(build_mars(model, MarsAdamWConfig(), cls=Bounded)) is Bounded
    with pytest.raises(TypeError, match="subclass of optim.VarianceReduced"):
        build_mars(model, MarsAdamWConfig(), cls=torch.optim.AdamW)
