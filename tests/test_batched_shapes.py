"""NorMuon's row normalisation and SOAP's per-matrix work batched by shape (optim/stacks.py,
optim/normuon.py ``normalise_rows_batched``, optim/soap_batched.py) equal their per-matrix loops
in float64: NorMuon bit for bit; SOAP bit for bit where every product is above torch's
small-matrix GEMM size, to 1e-13 relative below it (bmm's own summation there)."""

import dataclasses
import io

import pytest
import torch

import optim
from optim import soap_batched
from optim.mars import mars_rule
from optim.newton_schulz import orthogonalise
from optim.normuon import NorMuonOptions, normalise_rows, normalise_rows_batched
from optim.rule import Rule
from optim.soap import Soap, SoapOptions
from optim.stacks import adopt, stack_view

F64 = torch.float64
LARGE = [(8, 8), (12, 8), (8, 8), (8, 12), (20, 8), (12, 8), (8, 8)]  # (20, 8): dim 0 unrotated
SMALL = [(4, 4), (5,), (12, 3), (3, 2, 6), (4, 4), (12, 3), (3, 2, 6), (5,)]


def data(shapes, steps, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=gen, dtype=F64) for s in shapes]
    grads = [[scale * torch.randn(s, generator=gen, dtype=F64) for s in shapes]
             for _ in range(steps)]  # fmt: skip
    return ps, grads


def run(rule, shapes, steps, *, foreach, skip=(), scale=1.0, **group):
    """``steps`` steps of a VarianceReduced group with ``rule``; tensor ``i`` gets no gradient
    on the steps ``(step, i)`` in ``skip``."""
    ps, grads = data(shapes, steps, scale)
    ps = [torch.nn.Parameter(p) for p in ps]
    group = dict(params=ps, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, **group,
                 **rule.group_keys())  # fmt: skip
    opt = optim.VarianceReduced([group], implementation="foreach" if foreach else "loop")
    for t, gs in enumerate(grads):
        for i, (p, g) in enumerate(zip(ps, gs)):
            p.grad = None if (t, i) in skip else g.clone()
        opt.step()
    return ps, opt


def assert_same(a, b, rtol=0.0):
    (ps_a, opt_a), (ps_b, opt_b) = a, b
    for x, y in zip(ps_a, ps_b):
        _close(x.detach(), y.detach(), rtol)
        sa, sb = opt_a.state[x], opt_b.state[y]
        assert sorted(sa) == sorted(sb)  # the same keys, shapes and values: checkpoints agree
        for key in sa:
            if isinstance(sa[key], torch.Tensor):
                assert sa[key].shape == sb[key].shape, key
                _close(sa[key], sb[key], rtol)


def _close(x, y, rtol):
    if rtol == 0.0:
        assert torch.equal(x, y), (x - y).abs().max()
    else:
        torch.testing.assert_close(x, y, rtol=rtol, atol=rtol * float(x.abs().max()))


# --- NorMuon ---


@pytest.mark.parametrize("fused", [False, True])  # True: tall shapes as transposed views
def test_normuon_rows_batched_equal_the_loop_bit_for_bit(fused):
    torch.manual_seed(0)
    shapes = [(8, 24), (24, 8), (8, 24), (16, 16), (24, 8), (5, 7)]
    us = [torch.randn(s, dtype=F64) for s in shapes]
    outs = orthogonalise(us, steps=5, eps=1e-7, dtype=F64, fused=fused, cast_back=True)
    assert stack_view([outs[0], outs[2]]) is not None  # Newton-Schulz's own stack: no copy
    seconds = [torch.rand(s[0], 1, dtype=F64) for s in shapes]
    mine = [s.clone() for s in seconds]
    for _ in range(3):  # plain tensors on the later steps: stacked by copy
        ref = normalise_rows(seconds, [o.clone() for o in outs], 0.95)
        got = normalise_rows_batched(mine, outs, 0.95)
        assert all(torch.equal(r, g) for r, g in zip(ref, got))
        assert all(torch.equal(r, g) for r, g in zip(seconds, mine))
        outs = [torch.randn(s, dtype=F64) for s in shapes]


@pytest.mark.parametrize("mars", [False, True])
def test_normuon_batched_equals_per_matrix(mars):
    """The registry's rule (and NorMuon behind MARS's clipped correction): ``ns_batched`` on
    and off, NS in float64, weight decay, tensors without a gradient on some steps."""
    options = NorMuonOptions(ns_dtype="float64")
    if mars:
        rule = mars_rule("normuon", options, gamma=0.05, clip="tensor", first_step="zero",
                         optimize_1d=True, lr=0.01, lr_1d=0.01, betas_1d=(0.9, 0.95),
                         weight_decay_1d=0.0)  # fmt: skip
        extra = {}
    else:
        rule = Rule(momentum="ema-nesterov", preconditioner="normuon", options=options)
        extra = dict(momentum=0.95, nesterov=True)
    shapes = [(8, 24), (24, 8), (8, 24), (16, 16), (24, 8)]
    runs = []
    for batched in (False, True):
        rule_b = dataclasses.replace(rule, options=dataclasses.replace(options, ns_batched=batched))
        runs.append(run(rule_b, shapes, 5, foreach=True, skip={(2, 1)}, scale=3.0, **extra))
    assert_same(*runs)


# --- SOAP ---

SOAP_CASES = {
    "large": (LARGE, dict(precondition_frequency=3, max_precond_dim=16), 0.0),
    "normalize": (LARGE, dict(precondition_frequency=2, max_precond_dim=16,
                              normalize_grads=True), 0.0),
    # rotated vectors: stepped alone, by the loop's code (optim/soap_batched.py)
    "1d": (LARGE + [(5,), (24,), (5,)], dict(precondition_frequency=2, max_precond_dim=24,
                                              precondition_1d=True), 0.0),
    "small": (SMALL, dict(precondition_frequency=3, max_precond_dim=8), 1e-13),
    "merge-dims": (SMALL, dict(precondition_frequency=4, max_precond_dim=8, merge_dims=True),
                   1e-13),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SOAP_CASES))
def test_soap_batched_equals_the_loop(case):
    """foreach (batched by shape) against the loop: 10 steps (the first step's eigh, power
    iterations), weight decay, a tensor without a gradient on one step."""
    shapes, kw, rtol = SOAP_CASES[case]
    rule = Rule(momentum="ema", preconditioner="soap", options=SoapOptions(**kw))
    skip = {(4, 2)}
    runs = [run(rule, shapes, 10, foreach=f, skip=skip) for f in (False, True)]
    assert_same(*runs, rtol=rtol)


def test_mars_soap_batched_equals_the_loop_bit_for_bit(monkeypatch):
    """MARS's clipped correction in front (the core on foreach both times: only SOAP's
    direction differs)."""
    kw = dict(precondition_frequency=2, max_precond_dim=16)
    rule = mars_rule("soap", SoapOptions(**kw), gamma=0.05, clip="tensor", first_step="zero",
                     optimize_1d=True, lr=0.01, lr_1d=0.01, betas_1d=(0.9, 0.95),
                     weight_decay_1d=0.0)  # fmt: skip
    batched = run(rule, LARGE, 7, foreach=True, scale=3.0)
    monkeypatch.setattr(soap_batched, "direction", _loop_direction)
    assert_same(run(rule, LARGE, 7, foreach=True, scale=3.0), batched)


def _loop_direction(pre, states, us, cs, beta1):
    return Soap.direction(pre, states, us, cs, cs, beta1=beta1, foreach=False)


def test_soap_batches_capped_in_bytes_give_the_same_numbers(monkeypatch):
    rule = Rule(momentum="ema", preconditioner="soap",
                options=SoapOptions(precondition_frequency=2, max_precond_dim=16))  # fmt: skip
    whole = run(rule, LARGE, 5, foreach=True)
    monkeypatch.setattr(soap_batched, "BATCH_BYTES", 2 * 12 * 12 * 8)  # two (12, 12) per batch
    assert_same(whole, run(rule, LARGE, 5, foreach=True))


def test_soap_state_is_adopted_saved_and_resumed_as_one_stack():
    """After a step each shape's GG_i, Q_i, exp_avg_sq are slices of one stack (found again,
    not copied); a checkpoint holds each storage once and resumes the uninterrupted run."""
    rule = Rule(momentum="ema", preconditioner="soap",
                options=SoapOptions(precondition_frequency=2, max_precond_dim=16))  # fmt: skip
    ps, opt = run(rule, LARGE, 3, foreach=True)
    same = [ps[i] for i in (0, 2, 6)]  # the (8, 8) matrices
    for key in ("GG0", "Q1", "exp_avg_sq"):
        states = [opt.state[p] for p in same]
        before = [s[key] for s in states]
        assert stack_view(before) is not None
        adopt(states, key)
        assert all(s[key] is t for s, t in zip(states, before))  # nothing copied
    buf, apart = io.BytesIO(), io.BytesIO()
    torch.save(opt.state_dict(), buf)
    state = opt.state_dict()
    state["state"] = {k: {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in s.items()}
                      for k, s in state["state"].items()}  # fmt: skip
    torch.save(state, apart)
    assert buf.tell() <= apart.tell()  # each stack once, not once per slice

    ref_ps, ref_opt = run(rule, LARGE, 5, foreach=True)
    _, grads = data(LARGE, 5)
    resumed = optim.VarianceReduced([dict(opt.param_groups[0], params=ps)],
                                    implementation="foreach")  # fmt: skip
    buf.seek(0)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    for gs in grads[3:]:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        resumed.step()
    for x, y in zip(ps, ref_ps):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name", ["soap", "normuon"])
def test_a_step_flagged_non_finite_leaves_the_stacks_as_they_were(name):
    """Under a device flag the eager buckets step on copies (optim/masked.py), which are
    stacked anew: the real, adopted state is left bit for bit, and the run goes on as the
    per-matrix loop's does through the same flagged step."""
    if name == "soap":
        rule = Rule(momentum="ema", preconditioner="soap",
                    options=SoapOptions(precondition_frequency=2, max_precond_dim=16))  # fmt: skip
        paths = [(rule, dict(foreach=False)), (rule, dict(foreach=True))]
    else:
        paths = [(Rule(momentum="ema-nesterov", preconditioner="normuon",
                       options=NorMuonOptions(ns_dtype="float64", ns_batched=b)),
                  dict(foreach=True, momentum=0.95, nesterov=True)) for b in (False, True)]  # fmt: skip
    finals = []
    for rule, kw in paths:
        ps, opt = run(rule, LARGE, 3, **kw)
        saved = [{k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in ps]
        opt.found_inf = torch.ones(())
        for p in ps:
            p.grad = torch.full_like(p, float("nan"))
        opt.step()
        for p, before in zip(ps, saved):
            assert all(torch.equal(opt.state[p][k], v) for k, v in before.items())
        opt.found_inf = torch.zeros(())
        for p, g in zip(ps, data(LARGE, 4)[1][3]):
            p.grad = g.clone()
        opt.step()
        finals.append((ps, opt))
    assert_same(*finals)


def test_stack_view_refuses_what_is_not_one_stack():
    base = torch.arange(24.0).view(4, 6)
    assert stack_view(list(base.unbind(0))) is not None
    assert stack_view([base[0], base[2]]) is not None  # equal steps: a strided stack
    assert stack_view([base[0], base[1], base[3]]) is None  # unequal steps
    assert stack_view([base[0], base[0]]) is None  # overlapping
    assert stack_view([base[0], torch.arange(6.0)]) is None  # another storage
    assert stack_view([base[0, :4], base[0, 2:]]) is None  # overlapping slices
