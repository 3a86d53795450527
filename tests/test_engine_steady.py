"""The engine's kept launch list (optim/engine/steady.py), on the CPU through Triton's interpreter.

Steps whose parameters, gradients (their addresses), state and hyperparameter structure do not
change run the launches kept from the first (MARS-AdamW: from the second, where the clip fold's
norm pass merges with MARS's): no new program, and the same numbers as the
foreach path with ``clip_grad_norm_`` in float64. Each thing a program depends on, changed,
builds a new one, and the step after it is still the foreach path's. Skipped without triton.
"""

import pytest
import torch

pytest.importorskip("triton")

from test_engine import (  # noqa: E402
    LRS,
    SCALES,
    TOL,
    assert_same,
    core,
    make_params,
    small_blocks,  # noqa: F401  (the autouse fixture: 16-element blocks)
)

from optim import MARS, MARS_M, Muon  # noqa: E402
from optim.soap import SoapOptions  # noqa: E402

pytestmark = pytest.mark.engine
MAX_NORM = 3.0


def two_groups(params, **kw) -> list[dict]:
    return [{"params": [p for p in params if p.ndim == 2], "weight_decay": 0.1, **kw},
            {"params": [p for p in params if p.ndim != 2], "weight_decay": 0.0}]  # fmt: skip


MAKE = {
    "mars-adamw": lambda ps, f: MARS(two_groups(ps), lr=1e-2, implementation=f),
    "muon": lambda ps, f: Muon(
        [p for p in ps if p.ndim == 2],
        ns_dtype="float64",
        implementation=f,
        adamw_params=[p for p in ps if p.ndim != 2],
    ),  # fmt: skip
    "mars-m": lambda ps, f: MARS_M(
        muon_params=[p for p in ps if p.ndim == 2],
        ns_dtype="float64",
        adamw_params=[p for p in ps if p.ndim != 2],
        implementation=f,
    ),  # fmt: skip
}


def grads_in_place(params, t: int) -> None:
    """Step ``t``'s gradients written into the gradients already there (same addresses, as a
    steady training loop's allocator or DDP's buckets give them)."""
    gen = torch.Generator().manual_seed(100 + t)
    for p in params:
        g = torch.randn(p.shape, generator=gen, dtype=p.dtype) * SCALES[t % len(SCALES)]
        if p.grad is None:
            p.grad = g
        else:
            p.grad.copy_(g)


def trainer_step(opt, params, t: int, fold: bool) -> None:
    for group in opt.param_groups:
        group["lr"] = LRS[t % len(LRS)]
    if fold:
        assert opt.fold_grad_clip(MAX_NORM, params) is not None, opt.clip_fold_off_reason
    else:
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
    opt.step()


def pair(name: str):
    ref_p, eng_p = make_params(), make_params()
    return ref_p, MAKE[name](ref_p, "foreach"), eng_p, MAKE[name](eng_p, "triton")


def steps(ref_p, ref, eng_p, eng, ts, change=None) -> None:
    """Steps ``ts`` on both, ``change(params, opt)`` applied to both before the first."""
    for i, t in enumerate(ts):
        for ps, opt, fold in ((ref_p, ref, False), (eng_p, eng, True)):
            if i == 0 and change is not None:
                change(ps, opt)
            grads_in_place(ps, t)
            trainer_step(opt, ps, t, fold)


def built(opt) -> int:
    return opt.engine_state.programs_built


@pytest.mark.parametrize("name", list(MAKE))
def test_steady_steps_reuse_one_launch_list_and_equal_foreach(name):
    """Five steps, a new lr each: one program built (on the first step), reused on the next
    four; the foreach path's parameters and state in float64."""
    ref_p, ref, eng_p, eng = pair(name)
    steps(ref_p, ref, eng_p, eng, range(5))
    # MARS-AdamW: a second list from the second step, where the fold's norm pass merges with
    # MARS's (optim/engine/clip.py; the first step makes the reference buffers)
    first = 1 + (name == "mars-adamw")
    assert built(eng) == first and eng.route_counts == {"engine": 5 * len(eng.last_routes)}
    assert_same(ref_p, ref, eng_p, eng, TOL)


def _new_eps(ps, opt):
    opt.param_groups[0]["eps"] = 1e-6


def _new_clip_scope(ps, opt):
    opt.param_groups[0]["clip"] = "global"


def _new_grad_address(ps, opt):
    ps[0].grad = ps[0].grad.clone()


def _new_param_address(ps, opt):
    ps[1].data = ps[1].data.clone()


def _loaded_state(ps, opt):
    opt.load_state_dict(opt.state_dict())


CHANGES = [_new_eps, _new_clip_scope, _new_grad_address, _new_param_address, _loaded_state]  # fmt: skip


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.strip("_"))
def test_a_change_builds_a_new_launch_list_and_the_step_stays_right(change):
    ref_p, ref, eng_p, eng = pair("mars-adamw")
    steps(ref_p, ref, eng_p, eng, range(2))
    assert built(eng) == 2  # the first step's, the second's (the fold merged from then on)
    steps(ref_p, ref, eng_p, eng, range(2, 5), change=change)
    assert built(eng) == 3, "the change was not seen, or the new list was not kept"
    assert_same(ref_p, ref, eng_p, eng, TOL)


def test_a_parameter_without_a_gradient_for_a_step_builds_a_new_launch_list():
    """A step where one tensor has no gradient (not stepped, its count held) and the step after
    (its gradient back, at another count than the others: launched apart)."""
    ref_p, ref, eng_p, eng = pair("mars-adamw")
    steps(ref_p, ref, eng_p, eng, range(2))
    for ps, opt, fold in ((ref_p, ref, False), (eng_p, eng, True)):
        grads_in_place(ps, 2)
        ps[0].grad = None
        trainer_step(opt, ps, 2, fold)
    assert built(eng) == 3 and eng.state[eng_p[0]]["step"] == 2  # (2 before: the fold merged)
    steps(ref_p, ref, eng_p, eng, range(3, 5))
    assert built(eng) == 4
    assert_same(ref_p, ref, eng_p, eng, TOL)


def test_a_skip_flag_builds_its_own_launch_list_and_exact_mode_keeps_none():
    ps = make_params()
    opt = MARS(ps, lr=1e-2, implementation="triton")
    for t in range(2):
        grads_in_place(ps, t)
        opt.step()
    assert built(opt) == 1
    opt.found_inf = torch.zeros(())
    grads_in_place(ps, 2)
    opt.step()
    assert built(opt) == 2  # the flagged variant: a new list (its kernels compiled first)
    exact_p = make_params()
    exact = MARS(exact_p, lr=1e-2, is_approx=False, implementation="triton")
    for t in range(2):
        grads_in_place(exact_p, t + 10)
        exact.store_reference_grad()
        grads_in_place(exact_p, t)
        exact.step()
    assert built(exact) == 0 and exact.engine_state.program is None


class OwnCorrection(MARS):
    """MARS with a subclass's correction: its MARS bucket is not the engine's, its 1-D AdamW is."""

    correction = staticmethod(lambda g, ref, kappa: g + kappa * (g - ref))


@pytest.mark.parametrize("make", [
    lambda ps, f: OwnCorrection(ps, lr=1e-2, implementation=f),
    core("soap", SoapOptions(precondition_frequency=2)),
], ids=["subclass-correction", "soap"])  # fmt: skip
def test_a_step_partly_off_the_engine_keeps_no_launch_list(make):
    """A bucket the engine does not take (a subclass's correction; SOAP's rotated matrices) beside
    one it takes. With gradients that stay where they are, a kept list would run the engine's
    part alone: none is kept, and every step equals foreach (the other buckets stepped too)."""
    ref_p, eng_p = make_params(), make_params()
    ref, eng = make(ref_p, "foreach"), make(eng_p, "triton")
    for t in range(4):
        for ps, opt in ((ref_p, ref), (eng_p, eng)):
            grads_in_place(ps, t)
            opt.step()
    assert eng.route_counts == {"engine": 4, "foreach": 4} and built(eng) == 0
    assert_same(ref_p, ref, eng_p, eng, TOL)
