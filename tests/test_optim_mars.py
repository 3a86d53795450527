"""MARS against a plain transcription of the official algorithm (float64, tens of steps), and the
facts of docs/official-code.md, "Facts a test can check"."""

import math

import pytest
import torch

from optim import MARS

SHAPES = [(6, 4), (3, 7), (5,), (2, 3, 2)]
A, B, C = 3.4445, -4.7750, 2.0315


def ns5_official(m, steps=5, eps=1e-8):
    """The official MARS-Shampoo Newton-Schulz, written as in its source (A, B = A X, ...)."""
    x = m / (m.norm() + eps)
    tall = m.size(0) > m.size(1)
    if tall:
        x = x.T
    for _ in range(steps):
        a = x @ x.T
        b = a @ x
        x = A * x + B * b + C * a @ b
    return x.T if tall else x


def reference_step(p, g, st, h, g_ref=None):
    """One official MARS step for one tensor (docs/official-code.md, "MARS"), plus our knobs."""
    b1, b2 = h["betas"]
    if not st:
        st.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p), vmax=torch.zeros_like(p))
        st["last"] = g.clone() if h.get("first_step") == "plain" else torch.zeros_like(p)
    st["step"] += 1
    t = st["step"]
    if h["optimize_1d"] or p.ndim == 2:
        ref = st["last"]
        c = g + h["gamma"] * b1 / (1 - b1) * (g - ref)
        if h.get("clip", "tensor") == "tensor" and c.norm() > 1:
            c = c / c.norm()
        if h.get("clip") == "global":
            c = c / h["global_scale"]
        st["m"] = b1 * st["m"] + (1 - b1) * c
        kind = h["mars_type"]
        if kind == "mars-adamw" or (kind == "mars-shampoo" and p.ndim != 2):
            src = g if h.get("second_moment") == "g" else c
            st["v"] = b2 * st["v"] + (1 - b2) * src * src
            v = st["v"]
            if h.get("amsgrad"):
                st["vmax"] = torch.maximum(st["vmax"], v)
                v = st["vmax"]
            denom = (v.sqrt() / math.sqrt(1 - b2**t) + h["eps"]) * (1 - b1**t)
            p = p - h["lr"] * (h["wd"] * p + st["m"] / denom)
        elif kind == "mars-lion":
            p = p - h["lr"] * (h["wd"] * p + torch.sign(st["m"]))
        else:
            o = ns5_official(st["m"] / (1 - b1))
            scale = math.sqrt(max(1.0, p.size(0) / p.size(1)))
            p = p - h["lr"] * (scale * o + h["wd"] * p)
        st["last"] = g.clone() if g_ref is None else g_ref.clone()
    else:
        c1, c2 = h["betas_1d"]
        st["m"] = c1 * st["m"] + (1 - c1) * g
        st["v"] = c2 * st["v"] + (1 - c2) * g * g
        denom = (st["v"].sqrt() / math.sqrt(1 - c2**t) + h["eps"]) * (1 - c1**t)
        lr = h["lr"] * h["lr_1d"] / h["lr_init"]
        p = p - lr * (h["wd_1d"] * p + st["m"] / denom)
    return p


def random_grads(gen, steps):
    """Gradients whose corrected norms fall on both sides of 1 (so clipping is exercised)."""
    out = []
    for s in range(steps):
        scale = [0.02, 0.3, 2.0][s % 3]
        out.append(
            [scale * torch.randn(shape, generator=gen, dtype=torch.float64) for shape in SHAPES]
        )
    return out


def run_pair(steps=30, foreach=False, **kw):
    """Our MARS and the transcription on the same gradients and lr schedule."""
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    grads = random_grads(gen, steps)
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt_kw = dict(lr=1e-2, weight_decay=0.1, lr_1d=4e-3, ns_dtype="float64",
                  implementation="foreach" if foreach else "loop")  # fmt: skip
    opt_kw.update(kw)
    opt = MARS(params, **opt_kw)
    h = dict(
        lr_init=opt_kw["lr"],
        lr_1d=opt_kw["lr_1d"],
        betas=kw.get("betas", (0.95, 0.99)),
        betas_1d=kw.get("betas_1d", (0.9, 0.95)),
        eps=1e-8,
        wd=opt_kw["weight_decay"],
        wd_1d=kw.get("weight_decay_1d", 0.1),
        gamma=kw.get("gamma", 0.025),
        mars_type=kw.get("mars_type", "mars-adamw"),
        optimize_1d=kw.get("optimize_1d", False),
        amsgrad=kw.get("amsgrad", False),
        second_moment=kw.get("second_moment", "c"),
        first_step=kw.get("first_step", "zero"),
        clip=kw.get("clip", "tensor"),
    )
    ref, states = [x.clone() for x in init], [{} for _ in SHAPES]
    for step, gs in enumerate(grads):
        lr = opt_kw["lr"] * (0.5 + 0.5 * math.cos(step / steps))  # a schedule moves the lr
        for group in opt.param_groups:
            group["lr"] = lr
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()
        h["lr"] = lr
        if h["clip"] == "global":
            h["global_scale"] = _global_norm(ref, gs, states, h)
        ref = [reference_step(p, g, st, h) for p, g, st in zip(ref, gs, states)]
    return params, ref, opt


def _global_norm(ref, gs, states, h):
    b1 = h["betas"][0]
    total = 0.0
    for p, g, st in zip(ref, gs, states):
        if h["optimize_1d"] or p.ndim == 2:
            last = st["last"] if st else torch.zeros_like(g)
            total += float((g + h["gamma"] * b1 / (1 - b1) * (g - last)).norm() ** 2)
    return max(1.0, math.sqrt(total))


def assert_same(params, ref, rtol=1e-10, atol=1e-12):
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), r, rtol=rtol, atol=atol)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("mars_type", ["mars-adamw", "mars-lion", "mars-shampoo"])
@pytest.mark.parametrize("optimize_1d", [False, True])
def test_matches_transcription(mars_type, optimize_1d, foreach):
    params, ref, _ = run_pair(mars_type=mars_type, optimize_1d=optimize_1d, foreach=foreach)
    assert_same(params, ref)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize(
    "knob",
    [
        dict(second_moment="g"),
        dict(first_step="plain"),
        dict(clip="none"),
        dict(clip="global"),
        dict(amsgrad=True),
        dict(gamma=0.1, betas=(0.9, 0.95)),
    ],
)
def test_knobs_match_transcription(knob, foreach):
    params, ref, _ = run_pair(foreach=foreach, **knob)
    assert_same(params, ref)


def test_gamma_zero_without_clipping_is_torch_adamw():
    gen = torch.Generator().manual_seed(1)
    init = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.clone()) for x in init]
    a = MARS(ours, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, gamma=0.0, optimize_1d=True)
    b = torch.optim.AdamW(theirs, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(30):
        gs = [0.05 * torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
        for p, q, g in zip(ours, theirs, gs):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    assert_same(ours, [q.detach() for q in theirs], rtol=1e-12, atol=1e-14)


def test_first_step_correction_and_v_from_clipped_c():
    g_small = torch.full((4, 4), 0.01, dtype=torch.float64)
    p = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    opt = MARS([p], lr=1e-3)  # m and v do not depend on lr
    p.grad = g_small.clone()
    opt.step()
    kappa = 0.025 * 0.95 / 0.05
    assert kappa == pytest.approx(0.475)
    c1 = (1 + kappa) * g_small  # last_grad starts at zero: c_1 = 1.475 g_1
    torch.testing.assert_close(opt.state[p]["exp_avg"], 0.05 * c1)
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], 0.01 * c1 * c1)

    q = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    opt = MARS([q], lr=1e-3)
    q.grad = torch.randn(4, 4, dtype=torch.float64) * 10
    opt.step()
    c = (1 + kappa) * q.grad
    unit = c / c.norm()  # ||c|| > 1: what enters m and v has unit norm
    torch.testing.assert_close(opt.state[q]["exp_avg"], 0.05 * unit)
    torch.testing.assert_close(opt.state[q]["exp_avg_sq"], 0.01 * unit * unit)
    assert opt.state[q]["exp_avg"].norm().item() == pytest.approx(0.05)


def test_reference_is_a_copy_not_an_alias():
    """zero_grad(set_to_none=False) must not erase last_grad (the official alias bug)."""
    results = []
    for set_to_none in (True, False):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64))
        opt = MARS([p], lr=1e-2, weight_decay=0.1)
        for _ in range(10):
            p.grad = torch.randn_like(p) if p.grad is None else p.grad.copy_(torch.randn_like(p))
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        results.append(p.detach().clone())
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_exact_mode_on_a_repeated_batch_equals_approx():
    """Exact mode with g_ref = g(x_t, same batch) is approx mode when every batch is the same."""
    gen = torch.Generator().manual_seed(2)
    target = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    init = torch.randn(6, 4, generator=gen, dtype=torch.float64)

    def grad(p):  # a fixed batch: the gradient depends on the weights only
        return 3.0 * (p.detach() - target) + 0.5 * torch.sin(p.detach())

    finals = []
    for approx in (True, False):
        p = torch.nn.Parameter(init.clone())
        opt = MARS([p], lr=1e-2, weight_decay=0.1, is_approx=approx)
        for _ in range(25):
            if opt.needs_reference_grad:
                p.grad = grad(p)  # the "next" batch is the same batch
                opt.store_reference_grad()
                opt.zero_grad()
            p.grad = grad(p)
            opt.step()
            opt.zero_grad()
        finals.append(p.detach())
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-12, atol=1e-14)


def test_exact_mode_uses_the_stored_reference():
    gen = torch.Generator().manual_seed(3)
    init = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = MARS(params, lr=1e-2, weight_decay=0.1, is_approx=False, ns_dtype="float64")
    h = dict(
        lr=1e-2, lr_init=1e-2, lr_1d=3e-3, betas=(0.95, 0.99), betas_1d=(0.9, 0.95), eps=1e-8,
        wd=0.1, wd_1d=0.1, gamma=0.025, mars_type="mars-adamw", optimize_1d=False,
    )  # fmt: skip
    ref, states = [x.clone() for x in init], [{} for _ in SHAPES]
    for _ in range(20):
        refs = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
        gs = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
        for p, r in zip(params, refs):
            p.grad = r.clone()
        opt.update_previous_grad()  # the official protocol: previous, step, then last
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()
        opt.update_last_grad()
        ref = [reference_step(p, g, st, h, r) for p, g, st, r in zip(ref, gs, states, refs)]
    assert_same(params, ref)
    assert "previous_grad" not in opt.state[params[2]]  # the 1-D fallback keeps no reference


def test_exact_mode_without_reference_fails():
    p = torch.nn.Parameter(torch.zeros(3, 3))
    opt = MARS([p], is_approx=False)
    p.grad = torch.ones(3, 3)
    with pytest.raises(RuntimeError, match="store_reference_grad"):
        opt.step()


def test_state_only_where_used():
    params = [torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(3))]
    for kind, keys2d in [
        ("mars-adamw", {"step", "exp_avg", "exp_avg_sq", "last_grad"}),
        ("mars-lion", {"step", "exp_avg", "last_grad"}),
        ("mars-shampoo", {"step", "exp_avg", "last_grad"}),
    ]:
        opt = MARS(params, mars_type=kind)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        assert set(opt.state[params[0]]) == keys2d
        assert set(opt.state[params[1]]) == {"step", "exp_avg", "exp_avg_sq"}


def test_official_keywords_and_errors():
    p = torch.nn.Parameter(torch.zeros(3, 3))
    MARS(
        [p], lr=3e-3, betas=(0.95, 0.99), eps=1e-8, weight_decay=0.0, amsgrad=False, gamma=0.025,
        is_approx=True, mars_type="mars-adamw", optimize_1d=False, lr_1d=3e-3,
        betas_1d=(0.9, 0.95), weight_decay_1d=0.1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="mars-adamw"):
        MARS([p], mars_type="mars-sgd")
    for bad in (dict(lr=-1), dict(betas=(1.0, 0.9)), dict(eps=0), dict(gamma=-0.1)):
        with pytest.raises(ValueError):
            MARS([p], **bad)
