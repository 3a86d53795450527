"""One route decision per bucket (optim/routes.py): the route each bucket took and why, recorded
in ``opt.last_routes`` and logged once."""

import logging

import pytest
import torch

from optim import MARS
from optim.routes import ROUTES, Route, decide


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
        assert "fused=None on cpu" in r.reason and "not compiled" in r.reason, (name, r)
    assert all(r.name in ROUTES for _, r in opt.last_routes)


def test_routes_are_logged_once_and_again_when_they_change(caplog):
    ps = params()
    opt = MARS(ps, lr=1e-2)
    with caplog.at_level(logging.INFO, logger="optim.routes"):
        opt.step()
        opt.step()
        first = [r.message for r in caplog.records]
        opt.foreach = False
        opt.step()
    assert len(first) == 2 and all("-> foreach" in m for m in first)
    assert [r.message for r in caplog.records][2:] == [m.replace("-> foreach", "-> loop")
                                                         for m in first]  # fmt: skip


def test_a_subclass_correction_is_a_reason_the_engine_gives():
    pytest.importorskip("triton")

    class Mine(MARS):
        correction = staticmethod(lambda g, ref, kappa: g + kappa * (g - ref))

    opt = Mine(params(), lr=1e-2, fused="engine")
    opt.step()
    routes = {name.split()[1]: r for name, r in opt.last_routes}
    assert routes["ema/adam"].name == "engine"  # MARS's 1-D AdamW: no correction
    mars = routes["ema/adam+mars"]
    assert "a subclass's correction not covered" in mars.reason and mars.name == "foreach"


@pytest.mark.engine
def test_engine_routes_on_the_cpu_when_asked():
    pytest.importorskip("triton")
    opt = MARS(params(), lr=1e-2, fused="engine")
    opt.step()
    assert [r for _, r in opt.last_routes] == [Route("engine", "Triton engine on cpu")] * 2
    assert decide(opt, _bucket(opt), foreach=True, engine="test").reason.startswith(
        "not the engine: test"
    )


def _bucket(opt):
    return opt._buckets(opt.param_groups[0])[0]
