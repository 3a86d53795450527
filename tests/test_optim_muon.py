"""Muon, Moonlight, MARS-M and MARS-M-Efficient against plain transcriptions of the official code
(docs/official-code.md, "Muon (MARS repo)", "AdamW (MARS repo)", "MARS-M", "MARS-M-Efficient",
"Moonlight" and "Muon, Moonlight and MARS-M compared"), in float64 over tens of steps."""

import math

import pytest
import torch

from optim import MARS_M, MARS_M_Efficient, Moonlight, Muon
from optim.functional import newton_schulz

MATRICES = [(6, 4), (3, 7), (5, 5)]
VECTORS = [(5,), (4, 2, 2)]
A, B, C = 3.4445, -4.7750, 2.0315


def ns5(g, eps=1e-7):
    """The official MARS-M / Moonlight iteration, as written there."""
    x = g / (g.norm() + eps)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    for _ in range(5):
        a = x @ x.T
        b = B * a + C * a @ a
        x = A * x + b @ x
    return x.T if tall else x


def muon_side(p, g, st, h, ref=None):
    mu, lr, wd = h["momentum"], h["lr"], h["wd"]
    if not st:
        st.update(buf=torch.zeros_like(p), last=torch.zeros_like(p))
    if h["kind"] == "mars-m":
        c = g + h["gamma"] * mu / (1 - mu) * (g - st["last"])
        if h["clip"] and c.norm() > 1:
            c = c / c.norm()
        st["buf"] = mu * st["buf"] + (1 - mu) * c
        u = st["buf"]
        st["last"] = (g if ref is None else ref).clone()
    elif h["kind"] == "efficient":
        phi = (1 - h["gamma"]) * (1 - mu) / mu
        st["buf"] = mu * st["buf"] + phi * g
        u = h["gamma"] * g + mu * st["buf"]
    else:
        st["buf"] = mu * st["buf"] + g
        u = g + mu * st["buf"] if h["nesterov"] else st["buf"]
    if h["scale"] == "rms":
        scale = 0.2 * math.sqrt(max(p.shape[0], p.shape[1]))
    else:
        scale = math.sqrt(max(1.0, p.shape[0] / p.shape[1]))
    return p * (1 - lr * wd) - lr * scale * ns5(u)


def adamw_side(p, g, st, h):
    b1, b2 = h["adamw_betas"]
    lr, wd = h["adamw_lr"], h["adamw_wd"]
    if not st:
        st.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
    st["t"] += 1
    t = st["t"]
    st["m"] = b1 * st["m"] + (1 - b1) * g
    st["v"] = b2 * st["v"] + (1 - b2) * g * g
    step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
    u = st["m"] / (st["v"].sqrt() + 1e-8)
    if h.get("bias_corrected_decay"):  # the MARS repo's own AdamW
        return p - step_size * (wd * p + u)
    return p * (1 - lr * wd) - step_size * u


def setup(seed=0):
    gen = torch.Generator().manual_seed(seed)
    mats = [torch.randn(s, generator=gen, dtype=torch.float64) for s in MATRICES]
    vecs = [torch.randn(s, generator=gen, dtype=torch.float64) for s in VECTORS]
    return gen, mats, vecs


def compare(make, h, steps=30, exact=False):
    gen, mats, vecs = setup()
    mp = [torch.nn.Parameter(x.clone()) for x in mats]
    vp = [torch.nn.Parameter(x.clone()) for x in vecs]
    opt = make(mp, vp)
    rm, rv = [x.clone() for x in mats], [x.clone() for x in vecs]
    sm, sv = [{} for _ in mats], [{} for _ in vecs]
    for step in range(steps):
        scale = [0.02, 0.3, 2.0][step % 3]
        gm = [scale * torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in mats]
        gv = [scale * torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in vecs]
        refs = [None] * len(mats)
        if exact:
            refs = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in mats]
            for p, r in zip(mp, refs):
                p.grad = r.clone()
            opt.store_reference_grad()
        for p, g in zip(mp + vp, gm + gv):
            p.grad = g.clone()
        opt.step()
        rm = [muon_side(p, g, st, h, r) for p, g, st, r in zip(rm, gm, sm, refs)]
        rv = [adamw_side(p, g, st, h) for p, g, st in zip(rv, gv, sv)]
    for p, r in zip(mp + vp, rm + rv):
        torch.testing.assert_close(p.detach(), r, rtol=1e-10, atol=1e-12)
    return opt


BASE = dict(momentum=0.95, lr=2e-2, wd=0.1, adamw_lr=2e-2, adamw_wd=0.1, adamw_betas=(0.9, 0.95))


@pytest.mark.parametrize("clip_c", [True, False])
def test_mars_m_matches_transcription(clip_c):
    h = dict(BASE, kind="mars-m", gamma=0.025, clip=clip_c, scale="rms")
    compare(
        lambda m, v: MARS_M(
            lr=2e-2, wd=0.1, muon_params=m, adamw_params=v, clip_c=clip_c, ns_dtype="float64"
        ),
        h,
    )


def test_exact_mars_m_matches_transcription():
    h = dict(BASE, kind="mars-m", gamma=0.025, clip=True, scale="rms")
    opt = compare(
        lambda m, v: MARS_M(
            lr=2e-2, wd=0.1, muon_params=m, adamw_params=v, is_approx=False, ns_dtype="float64"
        ),
        h,
        exact=True,
    )
    assert opt.needs_reference_grad


def test_efficient_matches_transcription_and_unclipped_mars_m():
    h = dict(BASE, kind="efficient", gamma=0.025, scale="rms")
    compare(
        lambda m, v: MARS_M_Efficient(
            lr=2e-2, wd=0.1, muon_params=m, adamw_params=v, ns_dtype="float64"
        ),
        h,
    )
    finals = []
    for make in (MARS_M_Efficient, lambda **kw: MARS_M(clip_c=False, **kw)):
        _, mats, _ = setup()
        ps = [torch.nn.Parameter(x.clone()) for x in mats]
        opt = make(lr=2e-2, wd=0.1, muon_params=ps, ns_dtype="float64")
        gen = torch.Generator().manual_seed(5)
        for _ in range(30):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            opt.step()
        finals.append([p.detach() for p in ps])
        buffers = [{k for k in opt.state[p] if k != "step"} for p in ps]  # the core's counter
        assert all(len(b) == (1 if make is MARS_M_Efficient else 2) for b in buffers)
    for a, b in zip(*finals):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("nesterov", [True, False])
def test_moonlight_matches_transcription(nesterov):
    h = dict(BASE, kind="muon", nesterov=nesterov, scale="rms")
    compare(
        lambda m, v: Moonlight(
            lr=2e-2, wd=0.1, muon_params=m, adamw_params=v, nesterov=nesterov, ns_dtype="float64"
        ),
        h,
    )


def test_muon_matches_transcription():
    h = dict(BASE, kind="muon", nesterov=True, scale="shape", wd=0.0, adamw_lr=3e-3)
    h["bias_corrected_decay"] = True
    compare(lambda m, v: Muon(m, lr=2e-2, adamw_params=v, adamw_lr=3e-3, ns_dtype="float64"), h)


def test_mars_m_with_gamma_one_minus_mu_is_nesterov_muon():
    """Unclipped approx MARS-M with gamma = 1 - mu has the direction of Nesterov Muon
    (docs/official-code.md, "Muon, Moonlight and MARS-M compared"); Newton-Schulz removes the
    (1 - mu) factor."""
    finals = []
    for make in (
        lambda ps: MARS_M(lr=1e-2, wd=0.1, muon_params=ps, gamma=0.05, clip_c=False,
                          ns_dtype="float64"),
        lambda ps: Moonlight(lr=1e-2, wd=0.1, muon_params=ps, ns_dtype="float64"),
    ):  # fmt: skip
        _, mats, _ = setup()
        ps = [torch.nn.Parameter(x.clone()) for x in mats]
        opt = make(ps)
        gen = torch.Generator().manual_seed(6)
        for _ in range(20):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            opt.step()
        finals.append([p.detach() for p in ps])
    for a, b in zip(*finals):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(64, 16), (16, 64), (32, 32), (192, 768)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_singular_values_near_one(shape, dtype):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    o = newton_schulz(g, dtype=dtype).float()
    assert o.shape == g.shape and o.dtype == torch.float32
    s = torch.linalg.svdvals(o)
    assert 0.6 < s.min().item() and s.max().item() < 1.25, (s.min(), s.max())


def test_newton_schulz_coefficients_and_transpose():
    g = torch.randn(7, 3, dtype=torch.float64)
    torch.testing.assert_close(newton_schulz(g, dtype=torch.float64), ns5(g))
    torch.testing.assert_close(newton_schulz(g.T, dtype=torch.float64), ns5(g.T))


def test_official_keywords_accepted():
    m = [torch.nn.Parameter(torch.zeros(4, 4))]
    v = [torch.nn.Parameter(torch.zeros(4))]
    MARS_M(
        lr=1e-3, wd=0.1, muon_params=m, momentum=0.95, ns_steps=5, adamw_params=v,
        adamw_betas=(0.9, 0.95), adamw_eps=1e-8, gamma=0.025, clip_c=False, is_approx=True,
    )  # fmt: skip
    Moonlight(
        lr=1e-3, wd=0.1, muon_params=m, momentum=0.95, nesterov=True, ns_steps=5,
        adamw_params=v, adamw_betas=(0.9, 0.95), adamw_eps=1e-8,
    )  # fmt: skip
    with pytest.raises(ValueError, match="momentum"):
        MARS_M(muon_params=m, momentum=1.0)
    with pytest.raises(ValueError, match="lr"):
        Moonlight(lr=-1.0, muon_params=m)
