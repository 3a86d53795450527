"""The compiled route's step (optim/compiled.py) against the foreach path, in float64.

Compiling takes seconds on a CPU: the fast tests share two compiled graphs (one rule for the
2-D tensors, one for the 1-D AdamW fallback); each other rule is a slow test.
"""

import copy
import logging

import pytest
import torch

import optim.compiled as compiled_route
from optim import MARS, Lion, LionConfig, MarsAdamWConfig, MoonlightConfig, Muon, build_optimizer

SHAPES = [(6, 4), (3, 7), (5,)]
MATRICES = SHAPES[:2]  # the fast test compiles one graph (rank 2, dynamic shapes)
LRS = [1e-2, 3e-3, 2e-2, 5e-3]  # a changing lr each step, as a schedule


def make_params(shapes=SHAPES):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes]


def grads_for(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) for p in params]


def run(opt, params, steps, start=0):
    for t in range(start, start + steps):
        for p, g in zip(params, grads_for(params, t)):
            p.grad = g
        for group in opt.param_groups:
            group["lr"] = LRS[t % len(LRS)]
        if getattr(opt, "needs_reference_grad", False):
            for p, g in zip(params, grads_for(params, 1000 + t)):
                p.grad = g
            opt.store_reference_grad()
            for p, g in zip(params, grads_for(params, t)):
                p.grad = g
        opt.step()


def assert_same(pa, oa, pb, ob):
    for a, b in zip(pa, pb):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(pa, pb):
        for key, value in oa.state[a].items():
            other = ob.state[b][key]
            if torch.is_tensor(value):
                torch.testing.assert_close(value, other, rtol=1e-10, atol=1e-12)
            else:
                assert value == other, key


def names(opt) -> list[str]:
    """The routes of the last step's buckets (optim/routes.py)."""
    return [r.name for _, r in opt.last_routes]


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_mars_adamw_compiled_equals_foreach_without_recompiling_and_state_dicts_swap():
    ref_p, fus_p = make_params(MATRICES), make_params(MATRICES)
    ref = MARS(ref_p, lr=1e-2, weight_decay=0.1, implementation="foreach")
    fus = MARS(fus_p, lr=1e-2, weight_decay=0.1, implementation="compiled")
    run(ref, ref_p, 2), run(fus, fus_p, 2)
    compiled = graphs()
    assert fus._compiled_off is None and len(fus._compiled_ok) == 1
    assert names(fus) == ["compiled"] and fus.route_counts["compiled"] == 2  # the compiled code ran
    assert names(ref) == ["foreach"]
    run(ref, ref_p, 2, start=2), run(fus, fus_p, 2, start=2)  # lr and bias corrections change
    assert graphs() == compiled, "a changing lr or step count recompiled the compiled step"
    assert_same(ref_p, ref, fus_p, fus)
    # state dicts are interchangeable: foreach <- compiled and compiled <- foreach, then step on
    a_p, b_p = [p.detach().clone().requires_grad_() for p in fus_p], make_params(MATRICES)
    a = MARS(a_p, lr=1e-2, weight_decay=0.1, implementation="foreach")
    a.load_state_dict(copy.deepcopy(fus.state_dict()))  # torch shares tensors
    with torch.no_grad():
        for p, q in zip(b_p, ref_p):
            p.copy_(q)
    b = MARS(b_p, lr=1e-2, weight_decay=0.1, implementation="compiled")
    b.load_state_dict(copy.deepcopy(ref.state_dict()))
    run(a, a_p, 2, start=4), run(b, b_p, 2, start=4), run(ref, ref_p, 2, start=4)
    assert_same(ref_p, ref, a_p, a)
    assert_same(ref_p, ref, b_p, b)
    assert graphs() == compiled


def test_list_grouping_runs_same_shape_chunks_and_equals_foreach(monkeypatch):
    """The GPU's grouping ("list"), run on the CPU: tensors go to the compiled step in chunks of
    one shape (at most CHUNK), each (shape, length) one graph; a deeper model of the same shapes
    adds calls, not graphs; the numbers are the foreach path's."""
    assert compiled_route.shape_chunks([torch.empty(2, 3)] * 5 + [torch.empty(4)], size=2) == [
        [0, 1], [2, 3], [4], [5]]  # fmt: skip
    monkeypatch.setitem(compiled_route.GROUPING, "cpu", "list")
    monkeypatch.setattr(compiled_route, "CHUNK", 2)
    monkeypatch.setattr(compiled_route.shape_chunks, "__defaults__", (2,))
    shapes = [(3, 2)] * 4
    ref_p, fus_p = make_params(shapes), make_params(shapes)
    ref = MARS(ref_p, lr=1e-2, weight_decay=0.1, implementation="foreach")
    fus = MARS(fus_p, lr=1e-2, weight_decay=0.1, implementation="compiled")
    run(ref, ref_p, 3), run(fus, fus_p, 3)
    assert fus._compiled_off is None and fus.route_counts["compiled"] == 3
    assert_same(ref_p, ref, fus_p, fus)


def check_rule(make, steps=3):
    ref_p, fus_p = make_params(), make_params()
    ref, fus = make(ref_p, "foreach"), make(fus_p, "compiled")
    run(ref, ref_p, steps), run(fus, fus_p, steps)
    assert fus._compiled_off is None and fus._compiled_ok
    assert "compiled" in names(fus)
    # every bucket the compiled step covers took it: none of its code ran eagerly (a bucket of
    # a rule it does not cover, Muon's Newton-Schulz matrices, takes an eager route by name)
    eager = [r.reason for _, r in fus.last_routes if r.name != "compiled"]
    assert all("not compiled: rule" in why for why in eager), eager
    assert_same(ref_p, ref, fus_p, fus)


@pytest.mark.slow
@pytest.mark.parametrize(
    "make",
    [
        # with the 1-D AdamW rule
        lambda ps, f: MARS(ps, lr=1e-2, weight_decay=0.1, implementation=f),
        lambda ps, f: MARS(ps, lr=1e-2, is_approx=False, weight_decay=0.1, implementation=f),
        lambda ps, f: MARS(ps, lr=1e-2, mars_type="mars-lion", weight_decay=0.1, implementation=f),
        lambda ps, f: MARS(
            ps,
            amsgrad=True,
            second_moment="g",
            optimize_1d=True,
            clip="none",
            first_step="plain",
            implementation=f,
        ),  # fmt: skip
        lambda ps, f: Lion(ps, lr=1e-2, weight_decay=0.1, implementation=f),
        lambda ps, f: Muon(ps[:2], adamw_params=ps[2:], implementation=f),
    ],
    ids=[
        "mars-adamw-1d",
        "mars-adamw-exact",
        "mars-lion",
        "amsgrad-g-plain-noclip",
        "lion",
        "muon-adamw",
    ],
)
def test_other_rules_compiled_equal_foreach(make):
    check_rule(make)


def test_default_is_off_on_cpu_and_configs_forward_the_knob():
    ps = make_params()
    opt = MARS(ps)
    run(opt, ps, 1)
    assert not opt._compiled_ok and opt._compiled_off is None
    model = torch.nn.Linear(3, 2)
    for cfg in (MarsAdamWConfig(implementation="compiled"), LionConfig(implementation="loop"),
                MoonlightConfig(implementation="triton")):  # fmt: skip
        assert build_optimizer(model, cfg).implementation == cfg.implementation


def test_unavailable_compiler_falls_back_to_foreach_with_a_logged_reason(monkeypatch, caplog):
    monkeypatch.setattr(
        compiled_route, "unavailable_reason", lambda device: "no C++ compiler (test)"
    )
    ref_p, fus_p = make_params(), make_params()
    ref, fus = MARS(ref_p, implementation="foreach"), MARS(fus_p, implementation="compiled")
    with caplog.at_level(logging.WARNING, logger="optim.core"):
        run(ref, ref_p, 2), run(fus, fus_p, 2)
    assert "no C++ compiler (test)" in caplog.text and not fus._compiled_ok
    assert fus.off_reason == "no C++ compiler (test)" and "compiled" not in fus.route_counts
    assert_same(ref_p, ref, fus_p, fus)


def test_a_compile_error_runs_the_same_step_eagerly_then_foreach(monkeypatch, caplog):
    def broken(grouping):
        def fail(*args, **kwargs):
            raise RuntimeError("inductor exploded (test)")

        return fail

    monkeypatch.setattr(compiled_route, "_compiled", broken)
    ref_p, fus_p = make_params(), make_params()
    ref, fus = MARS(ref_p, implementation="foreach"), MARS(fus_p, implementation="compiled")
    with caplog.at_level(logging.WARNING, logger="optim.core"):
        run(ref, ref_p, 3), run(fus, fus_p, 3)
    assert "inductor exploded (test)" in fus._compiled_off and "inductor exploded" in caplog.text
    # step 1: the 2-D bucket compiles, fails, runs the same code eagerly (the loop route, its
    # reason saying so); then 5 buckets on foreach
    assert fus.route_counts == {"loop": 1, "foreach": 5}
    assert_same(ref_p, ref, fus_p, fus)


class OlderDynamoConfig:
    """torch 2.5's dynamo config: the recompile limit is ``cache_size_limit``; ``patch``
    refuses a name it does not have, as torch's does."""

    cache_size_limit = 8
    force_parameter_static_shapes = True

    def __init__(self):
        self.patched = {}

    def patch(self, **options):
        unknown = [k for k in options if not hasattr(self, k)]
        if unknown:
            raise AttributeError(f"{unknown[0]} does not exist")
        self.patched = options
        return torch._dynamo.config.patch(force_parameter_static_shapes=False)


def test_older_torch_names_the_recompile_limit_cache_size_limit(monkeypatch):
    older = OlderDynamoConfig()
    monkeypatch.setattr(compiled_route, "_dynamo_config", lambda: older)
    ref_p, fus_p = make_params(MATRICES), make_params(MATRICES)
    ref = MARS(ref_p, lr=1e-2, weight_decay=0.1, implementation="foreach")
    fus = MARS(fus_p, lr=1e-2, weight_decay=0.1, implementation="compiled")
    run(ref, ref_p, 2), run(fus, fus_p, 2)
    assert older.patched == {"cache_size_limit": 64, "force_parameter_static_shapes": False}
    assert fus.route_counts == {"compiled": 2} and fus.off_reason is None
    assert_same(ref_p, ref, fus_p, fus)


def test_unpatchable_dynamo_config_falls_back_with_a_reason_never_raises(monkeypatch, caplog):
    class Broken:
        def patch(self, **options):
            raise RuntimeError("no such config (test)")

    monkeypatch.setattr(compiled_route, "_dynamo_config", Broken)
    ref_p, fus_p = make_params(), make_params()
    ref, fus = MARS(ref_p, implementation="foreach"), MARS(fus_p, implementation="compiled")
    with caplog.at_level(logging.WARNING, logger="optim.core"):
        run(ref, ref_p, 2), run(fus, fus_p, 2)
    assert "no such config (test)" in fus.off_reason and "no such config" in caplog.text
    assert "compiled" not in fus.route_counts and fus.route_counts["loop"] == 1
    assert_same(ref_p, ref, fus_p, fus)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("how,path", [("compiled", "compiled"), ("auto", "engine")])
def test_cuda_compiled_step_and_default_equal_foreach(how, path):
    """``implementation="compiled"`` takes the compiled step; the CUDA default (``auto``) is the
    Triton engine (docs/optim-engine.md) where Triton imports, else the compiled step; each
    equals foreach."""
    from optim.engine.loader import triton_missing

    if path == "engine" and triton_missing():
        path = "compiled"
    ref_p = [torch.nn.Parameter(p.detach().float().cuda()) for p in make_params()]
    fus_p = [torch.nn.Parameter(p.detach().float().cuda()) for p in make_params()]
    ref, fus = MARS(ref_p, implementation="foreach"), MARS(fus_p, implementation=how)
    run(ref, ref_p, 3), run(fus, fus_p, 3)
    assert fus.off_reason is None and fus.route_counts[path] == 6, fus.route_counts
    for a, b in zip(ref_p, fus_p):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
