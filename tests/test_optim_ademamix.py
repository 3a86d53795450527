"""ademamix / mars-ademamix (optim/ademamix.py) and normuon (optim/normuon.py) against float64
transcriptions of their references (apple/ml-ademamix ``pytorch/ademamix.py``, zichongli5/NorMuon
``normuon.py``); mars-ademamix with gamma = 0 equal to ademamix bit for bit; muon's ``scale``."""

import math

import pytest
import torch
from test_optim_soap import registry_pair

import optim
from optim.ademamix import AdEMAMixOptions
from optim.mars import mars_rule
from optim.rule import Rule

F64 = torch.float64
HP = dict(lr=0.01, betas=(0.9, 0.999), beta3=0.999, alpha=5.0, eps=1e-8, wd=0.1)


def reference_ademamix(p, grads, *, alpha_warmup, beta3_warmup):
    """The reference's step for one tensor, as written there (float64)."""
    p, b1, b2 = p.clone(), *HP["betas"]
    m1, m2, v = torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        alpha = HP["alpha"] if alpha_warmup is None else (
            HP["alpha"] * min(1.0, t / alpha_warmup))  # fmt: skip
        beta3 = HP["beta3"]
        if beta3_warmup is not None and t < beta3_warmup:

            def f(b):
                return math.log(0.5) / math.log(b + 1e-8) - 1

            a = t / beta3_warmup
            beta3 = math.pow(0.5, 1 / ((1 - a) * f(b1) + a * f(HP["beta3"]) + 1))
        m1.mul_(b1).add_(g, alpha=1 - b1)
        m2.mul_(beta3).add_(g, alpha=1 - beta3)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(HP["eps"])
        update = (m1.div(1 - b1**t) + alpha * m2) / denom
        update.add_(p, alpha=HP["wd"])
        p.add_(-HP["lr"] * update)
    return p


def data(steps, scale=1.0, shapes=((6, 4), (5,))):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=gen, dtype=F64) for s in shapes]
    grads = [[scale * torch.randn(s, generator=gen, dtype=F64) for s in shapes]
             for _ in range(steps)]  # fmt: skip
    return ps, grads


def run(ps, grads, rule, foreach=True):
    ours = [torch.nn.Parameter(p.clone()) for p in ps]
    group = dict(params=ours, lr=HP["lr"], betas=HP["betas"], weight_decay=HP["wd"],
                 **rule.group_keys())  # fmt: skip
    opt = optim.VarianceReduced([group], implementation="foreach" if foreach else "loop")
    for gs in grads:
        for p, g in zip(ours, gs):
            p.grad = g.clone()
        opt.step()
    return ours


def options(**warmups):
    return AdEMAMixOptions(eps=HP["eps"], beta3=HP["beta3"], alpha=HP["alpha"], **warmups)


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("warmup", [None, 12])
def test_ademamix_matches_the_reference_transcription(warmup, foreach):
    ps, grads = data(30)
    kw = dict(alpha_warmup=warmup, beta3_warmup=warmup)
    ours = run(ps, grads, Rule(momentum="ema", preconditioner="ademamix", options=options(**kw)),
               foreach=foreach)  # fmt: skip
    for i, p in enumerate(ps):
        expected = reference_ademamix(p, [gs[i] for gs in grads], **kw)
        torch.testing.assert_close(ours[i].detach(), expected, rtol=1e-12, atol=1e-13)


def test_mars_ademamix_is_ademamix_on_the_clipped_corrections():
    gamma, kw = 0.05, dict(alpha_warmup=8, beta3_warmup=8)
    ps, grads = data(20, scale=3.0)
    rule = mars_rule("ademamix", options(**kw), gamma=gamma, clip="tensor", first_step="zero",
                     optimize_1d=True, lr=HP["lr"], lr_1d=HP["lr"], betas_1d=(0.9, 0.95),
                     weight_decay_1d=0.0)  # fmt: skip
    ours = run(ps, grads, rule)
    kappa = gamma * HP["betas"][0] / (1 - HP["betas"][0])
    for i, p in enumerate(ps):
        cs, prev = [], torch.zeros_like(p)
        for gs in grads:
            c = gs[i] + kappa * (gs[i] - prev)
            cs.append(c / max(1.0, c.norm().item()))
            prev = gs[i]
        expected = reference_ademamix(p, cs, **kw)
        torch.testing.assert_close(ours[i].detach(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("clip", ["tensor", "none"])
def test_mars_ademamix_with_gamma_zero_is_ademamix_bit_for_bit(clip):
    shared = dict(lr=1e-3, betas=[0.9, 0.999], weight_decay=0.1, alpha_warmup=3, beta3_warmup=3)
    a, b = registry_pair("ademamix", "mars-ademamix", clip, **shared)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def newton_schulz64(g, steps=5):
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.mT if g.size(-2) > g.size(-1) else g
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        x = a * x + (b * A + c * A @ A) @ x
    return x.mT if g.size(-2) > g.size(-1) else x


def reference_normuon(p, grads, *, lr, wd, mu=0.95, beta2=0.95):
    """``normuon_update`` and ``SingleDeviceNorMuon.step`` for one matrix (NS in float64)."""
    p, m, second = p.clone(), torch.zeros_like(p), torch.zeros_like(p[..., 0:1])
    for g in grads:
        g = g.clone()
        m.lerp_(g, 1 - mu)
        update = newton_schulz64(g.lerp_(m, mu))
        vnorm = update.norm(dim=(-2, -1), keepdim=True)
        second.lerp_(torch.mean(update * update, dim=-1, keepdim=True), 1 - beta2)
        update = update * (1 / second.sqrt().add_(1e-10))
        update.mul_(vnorm / update.norm(dim=(-2, -1), keepdim=True).add_(1e-10))
        update *= max(1, g.size(-2) / g.size(-1)) ** 0.5
        p.mul_(1 - lr * wd)
        p.add_(update, alpha=-lr)
    return p


def reference_aux_adam(p, grads, *, lr, wd, betas=(0.9, 0.95), eps=1e-10):
    p, m, v = p.clone(), torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        m.lerp_(g, 1 - betas[0])
        v.lerp_(g.square(), 1 - betas[1])
        update = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
        p.mul_(1 - lr * wd)
        p.add_(update, alpha=-lr)
    return p


def test_normuon_matches_the_reference_transcription():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3, bias=False)).double()
    cfg = optim.get_spec("normuon").config_cls(ns_dtype="float64", weight_decay=0.1,
                                               adamw_weight_decay=0.05)  # fmt: skip
    opt = optim.build_optimizer(model, cfg)
    start = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(3)
    grads = [[torch.randn(p.shape, generator=gen, dtype=F64) for p in start] for _ in range(12)]
    for gs in grads:
        for p, g in zip(model.parameters(), gs):
            p.grad = g.clone()
        opt.step()
    names = [n for n, _ in model.named_parameters()]
    for i, (name, p) in enumerate(model.named_parameters()):
        seq = [gs[i] for gs in grads]
        if p.ndim == 2:
            expected = reference_normuon(start[i], seq, lr=cfg.lr, wd=cfg.weight_decay)
        else:  # the bias: the auxiliary Adam
            expected = reference_aux_adam(start[i], seq, lr=cfg.adamw_lr, wd=0.05)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-10, atol=1e-12, msg=name)
    assert names == ["0.weight", "0.bias", "1.weight"]


def test_muon_scale_rms_is_d_muon():
    """``optimizer.scale=rms``: Moonlight's 0.2*sqrt(max(A, B)) in place of sqrt(max(1, r/c))."""
    finals = {}
    for scale in ("shape", "rms"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False))
        cfg = optim.get_spec("muon").config_cls(scale=scale, routing="recommended",
                                                ns_dtype="float32")  # fmt: skip
        opt = optim.build_optimizer(model, cfg)
        before = model[0].weight.detach().clone()
        model[0].weight.grad = torch.randn(8, 4)
        opt.step()
        finals[scale] = model[0].weight.detach() - before
    ratio = (0.2 * math.sqrt(8)) / math.sqrt(8 / 4)
    torch.testing.assert_close(finals["rms"], ratio * finals["shape"])
