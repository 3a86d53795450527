"""docs/adding-an-optimizer.md is run, block by block, so that the recipe cannot drift: its code
registers ``mars-adafactor``, which is then built through the registry from its config."""

import copy
import re

import pytest
import torch

import optim
import optim.options
import optim.preconditioners
import optim.registry
from helpers import ROOT

DOC = ROOT / "docs" / "adding-an-optimizer.md"


@pytest.fixture
def recipe():
    """The namespace of the document's Python blocks; the registries are restored after."""
    saved = [dict(d) for d in (optim.registry._REGISTRY, optim.preconditioners.PRECONDITIONERS,
                               optim.options.VALIDATORS)]  # fmt: skip
    namespace = {"__name__": "recipe"}
    try:
        for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S):
            exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 (our own document)
        yield namespace
    finally:
        for d, old in zip((optim.registry._REGISTRY, optim.preconditioners.PRECONDITIONERS,
                           optim.options.VALIDATORS), saved):  # fmt: skip
            d.clear()
            d.update(old)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 6)
        self.ln = torch.nn.LayerNorm(6)
        self.fc = torch.nn.Linear(6, 8)
        self.proj = torch.nn.Linear(8, 6, bias=False)


def steps(opt, model, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        if opt.needs_reference_grad:
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opt.store_reference_grad()
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_the_documented_optimizer_builds_from_its_config_and_steps(recipe, mode):
    assert "mars-adafactor" in optim.available()
    torch.manual_seed(0)
    model = Tiny()
    before = [p.detach().clone() for p in model.parameters()]
    cfg = optim.get_spec("mars-adafactor").config_cls(mode=mode)
    opt = optim.build_optimizer(model, cfg)
    steps(opt, model, 3)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    state = opt.state[model.fc.weight]
    assert state["step"] == 3 and state["exp_avg_sq_row"].shape == (8,)
    assert "exp_avg_sq" in opt.state[model.ln.weight]  # non-2-D: MARS's AdamW routing
    # resume equals uninterrupted
    twin = Tiny()
    twin.load_state_dict(model.state_dict())
    opt2 = optim.build_optimizer(twin, cfg)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch shares the tensors
    steps(opt, model, 2, seed=1), steps(opt2, twin, 2, seed=1)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_documented_options_are_checked_once_with_the_full_key(recipe):
    cls = optim.get_spec("mars-adafactor").config_cls
    with pytest.raises(ValueError, match=r"optimizer\.factored_eps must be > 0, got 0"):
        cls(factored_eps=0.0)
    p = torch.nn.Parameter(torch.zeros(3, 3))
    rule = optim.Rule(momentum="ema", preconditioner="adafactor")
    with pytest.raises(ValueError, match="did you mean factored_eps"):
        optim.VarianceReduced([p], dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0,
                                        factored_esp=1e-3, **rule.group_keys()))  # fmt: skip


def test_the_documented_correction_runs_on_every_path_and_differs_from_mars(recipe, monkeypatch):
    """The guide's BoundedMARS through the registry: the loop, foreach and the compiled step's
    code (run uncompiled here: seconds; tests/test_optim_extension.py compiles it, slow) give
    the same numbers, with a gamma schedule applied as the trainer does, and not MARS's."""
    import optim.compiled as compiled_route

    monkeypatch.setattr(
        compiled_route,
        "_compiled",
        lambda grouping: (
            compiled_route._update if grouping == "tensor" else compiled_route._multi_step
        ),
    )
    monkeypatch.setattr(compiled_route, "unavailable_reason", lambda device: None)
    cls = optim.get_spec("mars-adamw-bounded").config_cls
    results = {}
    for name, how in (("loop", "loop"), ("foreach", "foreach"), ("compiled", "compiled"),
                      ("mars", "foreach")):  # fmt: skip
        torch.manual_seed(0)
        model = Tiny()
        cfg = (cls if name != "mars" else optim.MarsAdamWConfig)(
            implementation=how, gamma=0.5, gamma_schedule="linear"
        )
        opt = optim.build_optimizer(model, cfg)
        optim.set_initial_lr(opt)
        gen = torch.Generator().manual_seed(0)
        for t in range(3):
            optim.apply_schedule(opt, t, optim.ScheduleConfig(name="constant"), 4)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        assert opt.param_groups[0]["gamma"] == 0.5 * (1 - 2 / 4)
        assert name == "mars" or type(opt).__name__ == "BoundedMARS"
        assert name != "compiled" or "compiled" in {r.name for _, r in opt.last_routes}
        results[name] = [p.detach().clone() for p in model.parameters()]
    for name in ("foreach", "compiled"):
        for a, b in zip(results["loop"], results[name]):
            torch.testing.assert_close(a, b)
    assert not torch.allclose(results["loop"][3], results["mars"][3])  # fc.weight: 2-D
