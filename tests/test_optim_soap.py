"""soap and mars-soap (optim/soap.py) against a float64 transcription of the reference
(nikhilvyas/SOAP ``soap.py``: m kept in the eigenbasis and rotated, the first step skipped),
and mars-soap with gamma = 0 equal to soap bit for bit."""

from itertools import chain

import pytest
import torch

import optim
from optim.mars import mars_rule
from optim.rule import Rule
from optim.soap import SoapOptions, merged_shape

F64 = torch.float64


class ReferenceSoap:
    """One tensor of the reference's ``SOAP.step`` (float64, channels_first), as written there."""

    def __init__(self, p, *, lr, betas, eps, wd, freq, max_dim, merge, precondition_1d,
                 shampoo_beta=-1.0):  # fmt: skip
        self.p, self.lr, self.betas, self.eps, self.wd = p.clone(), lr, betas, eps, wd
        self.freq, self.max_dim, self.merge, self.p1d = freq, max_dim, merge, precondition_1d
        self.sb = shampoo_beta if shampoo_beta >= 0 else betas[1]
        self.step_count, self.Q = 0, None

    def shaped(self, x):
        return x.reshape(merged_shape(tuple(x.shape), self.max_dim)) if self.merge else x

    def project(self, x, back=False):
        shape, x = x.shape, self.shaped(x)
        for q in self.Q:
            if q is None:
                x = x.permute(*range(1, x.ndim), 0)
            else:
                x = torch.tensordot(x, q, dims=[[0], [1 if back else 0]])
        return x.reshape(shape)

    def init(self, g):
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(g), torch.zeros_like(g)
        if g.ndim == 1:
            on = self.p1d and g.shape[0] <= self.max_dim
            self.GG = [torch.zeros(g.shape[0], g.shape[0], dtype=F64) if on else None]
        else:
            shape = self.shaped(g).shape
            self.GG = [torch.zeros(s, s, dtype=F64) if s <= self.max_dim else None for s in shape]

    def update_preconditioner(self, g):
        if self.Q is not None:
            self.exp_avg = self.project(self.exp_avg, back=True)
        x = self.shaped(g)
        for i, gg in enumerate(self.GG):
            if gg is not None:
                others = [*chain(range(i), range(i + 1, x.ndim))]
                gg.lerp_(torch.tensordot(x, x, dims=[others, others]), 1 - self.sb)
        if self.Q is None:
            self.Q = [None if gg is None else
                      torch.flip(torch.linalg.eigh(gg + 1e-30 * torch.eye(len(gg), dtype=F64))[1], [1])
                      for gg in self.GG]  # fmt: skip
        if self.step_count > 0 and self.step_count % self.freq == 0:
            self.power_iteration()
        if self.step_count > 0:
            self.exp_avg = self.project(self.exp_avg)

    def power_iteration(self):
        v, shape = self.shaped(self.exp_avg_sq), self.exp_avg_sq.shape
        for i, (gg, q) in enumerate(zip(self.GG, self.Q)):
            if gg is None:
                continue
            order = torch.argsort(torch.diag(q.T @ gg @ q), descending=True)
            v = v.index_select(i, order)
            self.Q[i] = torch.linalg.qr(gg @ q[:, order])[0]
        self.exp_avg_sq = v.reshape(shape)

    def step(self, g):
        if self.Q is None:
            self.init(g)
            self.update_preconditioner(g)
            return
        gp = self.project(g)
        self.step_count += 1
        b1, b2 = self.betas
        self.exp_avg.mul_(b1).add_(gp, alpha=1 - b1)
        self.exp_avg_sq.mul_(b2).add_(gp.square(), alpha=1 - b2)
        denom = self.exp_avg_sq.sqrt().add_(self.eps)
        size = self.lr * (1 - b2**self.step_count) ** 0.5 / (1 - b1**self.step_count)
        self.p.add_(self.project(self.exp_avg / denom, back=True), alpha=-size)
        self.p.add_(self.p, alpha=-self.lr * self.wd)
        self.update_preconditioner(g)


HP = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, wd=0.1)
# Every preconditioned dimension at most the product of the others: a rank-deficient GG has
# eigenvectors fixed only up to rounding, and SOAP's update depends on them (both codes alike)
SHAPES = [(4, 4), (5,), (12, 3), (3, 2, 6)]


def run_ours(ps, grads, rule, opts_kw, foreach=True, is_approx=True):
    group = dict(params=ps, lr=HP["lr"], betas=HP["betas"], weight_decay=HP["wd"],
                 **rule.group_keys())  # fmt: skip
    opt = optim.VarianceReduced([group], is_approx=is_approx,
                                implementation="foreach" if foreach else "loop")  # fmt: skip
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
    return opt


def data(steps, scale=1.0):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=gen, dtype=F64) for s in SHAPES]
    grads = [[scale * torch.randn(s, generator=gen, dtype=F64) for s in SHAPES]
             for _ in range(steps)]  # fmt: skip
    return ps, grads


CASES = {
    "plain": dict(precondition_frequency=3, max_precond_dim=8, merge_dims=False),
    "merge-dims": dict(precondition_frequency=4, max_precond_dim=8, merge_dims=True),
    "precondition-1d": dict(precondition_frequency=2, max_precond_dim=10, precondition_1d=True),
}


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_soap_matches_the_reference_transcription(case, foreach):
    kw = CASES[case]
    ps, grads = data(20)
    ours = [torch.nn.Parameter(p.clone()) for p in ps]
    options = SoapOptions(eps=HP["eps"], **kw)
    opt = run_ours(ours, grads, Rule(momentum="ema", preconditioner="soap", options=options), kw,
                   foreach=foreach)  # fmt: skip
    for i, p in enumerate(ps):
        ref = ReferenceSoap(p, lr=HP["lr"], betas=HP["betas"], eps=HP["eps"], wd=HP["wd"],
                            freq=kw["precondition_frequency"], max_dim=kw["max_precond_dim"],
                            merge=kw.get("merge_dims", False),
                            precondition_1d=kw.get("precondition_1d", False))  # fmt: skip
        for gs in grads:
            ref.step(gs[i])
        torch.testing.assert_close(ours[i].detach(), ref.p, rtol=1e-10, atol=1e-12)
        assert opt.state[ours[i]]["step"] - 1 == ref.step_count  # the first step only sets Q


def test_mars_soap_matches_soap_on_the_clipped_corrections():
    """MARS-SOAP: c = g + gamma beta1/(1-beta1) (g - g_prev) (g_prev = 0 first), each tensor's
    c clipped to norm <= 1, then the reference SOAP on c (gradients large enough to clip)."""
    kw, gamma = CASES["plain"], 0.05
    ps, grads = data(15, scale=3.0)
    ours = [torch.nn.Parameter(p.clone()) for p in ps]
    rule = mars_rule("soap", SoapOptions(eps=HP["eps"], **kw), gamma=gamma, clip="tensor",
                     first_step="zero", optimize_1d=True, lr=HP["lr"], lr_1d=HP["lr"],
                     betas_1d=(0.9, 0.95), weight_decay_1d=0.0)  # fmt: skip
    run_ours(ours, grads, rule, kw)
    kappa = gamma * HP["betas"][0] / (1 - HP["betas"][0])
    for i, p in enumerate(ps):
        ref = ReferenceSoap(p, lr=HP["lr"], betas=HP["betas"], eps=HP["eps"], wd=HP["wd"],
                            freq=kw["precondition_frequency"], max_dim=kw["max_precond_dim"],
                            merge=False, precondition_1d=False)  # fmt: skip
        prev = torch.zeros_like(p)
        for gs in grads:
            c = gs[i] + kappa * (gs[i] - prev)
            ref.step(c / max(1.0, c.norm().item()))
            prev = gs[i]
        torch.testing.assert_close(ours[i].detach(), ref.p, rtol=1e-10, atol=1e-12)


def registry_pair(plain: str, mars: str, clip: str, steps=6, scale=1e-3, **shared):
    """``plain`` and ``mars`` (gamma 0, every tensor on MARS, ``clip``) from the registry on the
    same small GPT and gradients (norms below 1); their parameters after ``steps``."""
    out = []
    for name, extra in ((plain, {}), (mars, dict(gamma=0.0, optimize_1d=True, clip=clip))):
        torch.manual_seed(0)
        model = small_model()
        cfg = optim.get_spec(name).config_cls(**shared, **extra)
        opt = optim.build_optimizer(model, cfg)
        gen = torch.Generator().manual_seed(1)
        for _ in range(steps):
            for p in model.parameters():
                p.grad = scale * torch.randn(p.shape, generator=gen)
            opt.step()
        out.append([p.detach().clone() for p in model.parameters()])
    return out


def small_model():
    from model import GPT, GPTConfig

    return GPT(GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=8))


@pytest.mark.parametrize("clip", ["tensor", "none"])
def test_mars_soap_with_gamma_zero_is_soap_bit_for_bit(clip):
    shared = dict(lr=3e-3, betas=[0.95, 0.95], weight_decay=0.01, precondition_frequency=2)
    a, b = registry_pair("soap", "mars-soap", clip, **shared)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_soap_refuses_bad_options_in_one_line():
    cls = optim.get_spec("soap").config_cls
    for field, value in (("precondition_frequency", 0), ("max_precond_dim", 2.5),
                         ("shampoo_beta", 1.5)):  # fmt: skip
        with pytest.raises(ValueError, match=f"optimizer.{field}") as e:
            cls(**{field: value})
        assert "\n" not in str(e.value)
