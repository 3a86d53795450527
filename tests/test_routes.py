"""One route decision per bucket (optim/routes.py): the route each bucket took and why, recorded
in ``opt.last_routes``, summed per route (``taken``), logged when it changes; ``implementation``
(optim/implementation.py) the one setting, its earlier spellings refused."""

import logging

import pytest
import torch

import optim
from optim import MARS, AdamWScheduleFree, Lion
from optim.routes import ROUTES, Route, decide, lines, taken


def params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64))
          for s in ((6, 7), (3, 11), (9,))]  # fmt: skip
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
    return ps


def test_the_cpu_default_is_eager_and_says_why():
    opt = MARS(params(), lr=1e-2)
    opt.step()
    assert [r.name for _, r in opt.last_routes] == ["foreach", "foreach"]
    for name, r in opt.last_routes:
        assert "implementation=auto on cpu" in r.reason and "not compiled" in r.reason, (name, r)
    assert all(r.name in ROUTES for _, r in opt.last_routes)


def test_routes_are_logged_at_debug_first_and_again_when_they_change(caplog):
    ps = params()
    opt = MARS(ps, lr=1e-2)
    with caplog.at_level(logging.DEBUG, logger="optim.routes"):
        opt.step()
        opt.step()
        first = [(r.levelno, r.message) for r in caplog.records]
        assert first == [(logging.DEBUG, lines(taken(opt))[0])]
        opt.implementation = "loop"
        opt.step()
    ((level, message),) = [(r.levelno, r.message) for r in caplog.records][1:]
    assert level == logging.INFO and message.startswith("optimizer routes changed: optimizer "
                                                        "route loop: 2 buckets (")  # fmt: skip


def test_taken_counts_buckets_per_route_with_their_reasons():
    opt = MARS(params(), lr=1e-2)
    opt.step()
    ((route, entry),) = taken(opt).items()
    assert route == "foreach" and entry["buckets"] == 2 and len(entry["reasons"]) == 1
    assert lines(taken(opt)) == [f"optimizer route foreach: 2 buckets ({entry['reasons'][0]})"]
    sf = AdamWScheduleFree(params(), implementation="loop")
    sf.step()
    assert taken(sf) == {"loop": {"buckets": 1, "reasons": ["AdamWScheduleFree, "
                                                             "implementation=loop"]}}  # fmt: skip
    torch_adamw = torch.optim.AdamW(params(), foreach=True)
    assert list(taken(torch_adamw)) == ["torch"]


@pytest.mark.parametrize("implementation,route", [("loop", "loop"), ("foreach", "foreach"),
                                                  ("auto", "foreach")])  # fmt: skip
def test_each_implementation_takes_its_route_on_a_cpu(implementation, route):
    opt = MARS(params(), lr=1e-2, implementation=implementation)
    opt.step()
    assert {r.name for _, r in opt.last_routes} == {route}


@pytest.mark.parametrize("kwargs", [{"fused": True}, {"foreach": False}])
def test_no_constructor_takes_the_old_switches(kwargs):
    """``fused``/``foreach`` were replaced by ``implementation``: a constructor takes neither
    keyword (Python refuses it); the config check names the replacement (tests/test_cli.py)."""
    ((key, _),) = kwargs.items()
    for make in (lambda: MARS(params(), **kwargs), lambda: Lion(params(), **kwargs),
                 lambda: AdamWScheduleFree(params(), **kwargs),
                 lambda: optim.VarianceReduced([{"params": params(), "lr": 1e-2,
                                                 "momentum_form": "ema",
                                                 "preconditioner": "adam"}], **kwargs)):  # fmt: skip
        with pytest.raises(TypeError, match=key):
            make()


def test_a_value_an_optimizer_does_not_have_is_refused_naming_its_values():
    with pytest.raises(
        ValueError,
        match=r"unknown implementation 'compiled' for "
        r"AdamWScheduleFree; valid: auto, loop, foreach, triton",
    ):
        AdamWScheduleFree(params(), implementation="compiled")
    with pytest.raises(
        ValueError,
        match=r"optimizer.implementation 'compiled' for adamw; "
        r"valid: auto, loop, foreach, torch-fused",
    ):
        optim.AdamWConfig(implementation="compiled")
    with pytest.raises(
        ValueError,
        match=r"'torch-fused' for mars-adamw; valid: auto, loop, "
        r"foreach, compiled, triton",
    ):
        optim.MarsAdamWConfig(implementation="torch-fused")


def test_a_subclass_correction_is_a_reason_the_engine_gives():
    pytest.importorskip("triton")

    class Mine(MARS):
        correction = staticmethod(lambda g, ref, kappa: g + kappa * (g - ref))

    opt = Mine(params(), lr=1e-2, implementation="triton")
    opt.step()
    routes = {name.split()[1]: r for name, r in opt.last_routes}
    assert routes["ema/adam"].name == "engine"  # MARS's 1-D AdamW: no correction
    mars = routes["ema/adam+mars"]
    assert "a subclass's correction not covered" in mars.reason and mars.name == "foreach"


@pytest.mark.engine
def test_engine_routes_on_the_cpu_when_asked():
    pytest.importorskip("triton")
    opt = MARS(params(), lr=1e-2, implementation="triton")
    opt.step()
    assert [r for _, r in opt.last_routes] == [Route("engine", "Triton engine on cpu")] * 2
    assert decide(opt, _bucket(opt), foreach=True, engine="test").reason.startswith(
        "not the engine: test"
    )


def _bucket(opt):
    return opt._buckets(opt.param_groups[0])[0]
