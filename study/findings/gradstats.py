"""Gradient statistics that predict where approximate MARS's correction can pay (docs/study.md,
"The batch crossover").

Approximate MARS preconditions ``c_t = g_t + kappa (g_t - g_{t-1})`` with ``g_t``, ``g_{t-1}``
minibatch gradients of B tokens on *different* batches at consecutive weights. Its noise part
``kappa (noise_t - noise_{t-1})`` has variance ``2 kappa^2 tr(Sigma) / B`` (Sigma the covariance
of one token's gradient); its only signal is ``kappa dG``, ``dG = grad F(x_t) - grad F(x_{t-1})``,
the change of the full gradient over one step. So the correction's signal-to-noise ratio is

    SNR(B) = |kappa dG|^2 / (2 kappa^2 tr(Sigma) / B) = B |dG(B)|^2 / (2 tr(Sigma)),

kappa cancelling, and it can pay only where SNR > 1 *and* consecutive gradients agree (their
cosine clearly positive: near an oscillation the change alternates in sign and the extrapolation
undoes the momentum's damping). ``dG(B)`` depends on B through the steps the optimizer takes at
that batch, so it is measured along the run at each B.

The estimators:

- the noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
  appendix A): ``E|g_b|^2 = |G|^2 + tr(Sigma)/b`` at two batch sizes, ``b`` and ``kb`` (k small
  batches and their mean) at fixed weights (``noise_scale``), or at several batches along one
  trajectory (``fit_noise``: a line in 1/B, valid where every batch sees the same ``|G|^2``);
  ``B_simple = tr(Sigma) / |G|^2``;
- the correction's signal-to-noise from consecutive minibatch gradients on independent batches:
  ``E|g_t - g_{t-1}|^2 = |dG|^2 + 2 tr(Sigma)/B``, so ``SNR(B) = B E|g_t - g_{t-1}|^2 /
  (2 tr(Sigma)) - 1``: no gradient beyond the ones the optimizer steps with;
- where common batches are measured too (``common``), ``|dG|^2`` directly, as the inner
  product of the change on two independent common batches (``<g(x_t; A) - g(x_{t-1}; A),
  g(x_t; C) - g(x_{t-1}; C)>``: the batches' noise drops out of the mean), a check on the first;
- the cosine of consecutive minibatch gradients, per pair of steps.

Everything here works on flat float64 vectors and callables, so a test can plant a model with a
known answer (tests/test_crossover.py); study/findings/predict.py feeds it a real run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

Vector = torch.Tensor  # a flat float64 gradient


def flat(tensors: Sequence[torch.Tensor]) -> Vector:
    """The tensors as one flat float64 vector (a copy)."""
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def cosine(a: Vector, b: Vector) -> float:
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else math.nan


@dataclass
class NoiseScale:
    """``tr(Sigma)`` per token and ``|G|^2`` (block gradients), and ``B_simple`` in tokens, each
    with its standard error (the jackknife over rounds; nan with fewer than two rounds)."""

    trace: float
    g2: float
    small: int  # tokens in a small batch
    k: int  # small batches per large one
    rounds: int
    trace_se: float = math.nan
    g2_se: float = math.nan
    b_simple_se: float = math.nan

    @property
    def b_simple(self) -> float:
        return self.trace / self.g2 if self.g2 > 0 else math.inf


def _pooled(sq: float, cross: float, n: int, small: int) -> tuple[float, float]:
    """``(tr(Sigma), |G|^2)`` from ``n`` independent gradients of ``small`` tokens: ``sq`` the
    sum of their squared norms, ``cross`` the sum over ordered pairs i != j of <g_i, g_j>:
    ``E<g_i, g_j> = |G|^2`` and ``E|g_i|^2 = |G|^2 + tr(Sigma) / small`` (both unbiased)."""
    g2 = cross / (n * (n - 1))
    return small * (sq / n - g2), g2


def noise_scale(sample: Callable[[], Vector], *, small: int, k: int, rounds: int) -> NoiseScale:
    """Estimate the noise scale from ``rounds`` x ``k`` independent gradients of ``small``
    tokens each (``sample()`` returns one, at fixed weights): every pair of distinct gradients
    estimates ``|G|^2``, every squared norm ``|G|^2 + tr(Sigma) / small`` (``_pooled``); the
    standard errors are the jackknife's, leaving out one round of ``k`` at a time (only each
    round's sum of gradients is kept, so memory is ``rounds`` gradients, not ``rounds * k``)."""
    if k < 2 or rounds < 1 or small < 1:
        raise ValueError(f"noise_scale: k {k} >= 2, rounds {rounds} >= 1, small {small} >= 1")
    sums, sqs = [], []
    for _ in range(rounds):
        total, sq = None, 0.0
        for _ in range(k):
            g = sample()
            sq += float(g @ g)
            total = g.clone() if total is None else total.add_(g)
        sums.append(total)
        sqs.append(sq)
    whole = torch.stack(sums).sum(0)
    n, sq_all = rounds * k, sum(sqs)
    trace, g2 = _pooled(sq_all, float(whole @ whole) - sq_all, n, small)
    out = NoiseScale(trace=trace, g2=g2, small=small, k=k, rounds=rounds)
    if rounds >= 2:
        dots = [float(whole @ s) for s in sums]
        norms = [float(s @ s) for s in sums]
        loo = []
        for r in range(rounds):  # |S - S_r|^2 = |S|^2 - 2 <S, S_r> + |S_r|^2
            rest = float(whole @ whole) - 2 * dots[r] + norms[r]
            sq = sq_all - sqs[r]
            loo.append(_pooled(sq, rest - sq, n - k, small))
        out.trace_se, out.g2_se = (_jackknife([x[i] for x in loo]) for i in (0, 1))
        ratios = [t / g for t, g in loo if g > 0]
        if len(ratios) == rounds and g2 > 0:
            out.b_simple_se = _jackknife(ratios)
    return out


def _jackknife(values: list[float]) -> float:
    """The jackknife's standard error from the leave-one-out estimates."""
    n = len(values)
    mean = sum(values) / n
    return math.sqrt((n - 1) / n * sum((v - mean) ** 2 for v in values))


@dataclass
class AlongRun:
    """At one batch, after ``warm`` steps: per measured step the squared norm of its minibatch
    gradient, and per consecutive pair the cosine, ``|g_t - g_{t-1}|^2`` and (with common
    batches) the direct ``|dG|^2`` estimate."""

    batch: int
    cosines: list[float] = field(default_factory=list)
    dg2: list[float] = field(default_factory=list)  # from common batches (empty: not measured)
    g2: list[float] = field(default_factory=list)
    diff2: list[float] = field(default_factory=list)

    @staticmethod
    def _mean_se(xs: list[float]) -> tuple[float, float]:
        n = len(xs)
        if n == 0:
            return math.nan, math.nan
        m = sum(xs) / n
        if n < 2:
            return m, math.nan
        return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)

    @property
    def cosine(self) -> tuple[float, float]:
        """Mean cosine and its standard error."""
        return self._mean_se(self.cosines)

    @property
    def dg2_mean(self) -> float:
        return self._mean_se(self.dg2)[0]

    def snr(self, trace: float) -> float:
        """``B E|g_t - g_{t-1}|^2 / (2 tr(Sigma)) - 1`` (module docstring), at least 0."""
        if not self.diff2 or not trace > 0:
            return math.nan
        return max(0.0, self.batch * self._mean_se(self.diff2)[0] / (2.0 * trace) - 1.0)

    def snr_common(self, trace: float) -> float:
        """``B |dG|^2 / (2 tr(Sigma))`` with ``|dG|^2`` from the common batches (nan: not
        measured); 0 where that estimate came out negative."""
        if not self.dg2 or not trace > 0:
            return math.nan
        return max(0.0, self.batch * self.dg2_mean / (2.0 * trace))


def fit_noise(rows: Sequence[AlongRun]) -> NoiseScale:
    """``tr(Sigma)`` and ``|G|^2`` from the minibatch gradients' squared norms at the ladder's
    batches: weighted least squares of ``|g_B|^2`` on ``1/B`` (module docstring)."""
    xs, ys, ws = [], [], []
    for r in rows:
        if r.g2:
            xs.append(1.0 / r.batch)
            ys.append(sum(r.g2) / len(r.g2))
            ws.append(len(r.g2))
    if len(xs) < 2:
        raise ValueError("fit_noise: squared norms at two batches or more are needed")
    sw = sum(ws)
    mx, my = sum(w * x for w, x in zip(ws, xs)) / sw, sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx
    smallest = min(r.batch for r in rows)
    return NoiseScale(trace=slope, g2=my - slope * mx, small=smallest, k=len(xs), rounds=1)


def along_run(batch: int, step: Callable[[], Vector], common: Callable[[int], Vector] | None,
              *, warm: int, pairs: int) -> AlongRun:  # fmt: skip
    """Step ``warm`` times at ``batch`` (``step()`` takes one optimizer step on a fresh batch and
    returns the minibatch gradient it stepped with), then ``pairs + 1`` more: each one's squared
    norm, each consecutive pair's cosine and squared difference, and, where ``common`` is given,
    the gradient on the two common batches before each step (``common(0)``, ``common(1)``, at
    the current weights) for the direct ``|dG|^2``."""
    if pairs < 1 or warm < 0:
        raise ValueError(f"along_run: pairs {pairs} >= 1 and warm {warm} >= 0")
    for _ in range(warm):
        step()
    out = AlongRun(batch)
    prev_g = prev_a = prev_c = None
    for _ in range(pairs + 1):
        a, c = (common(0), common(1)) if common is not None else (None, None)
        g = step()
        out.g2.append(float(g @ g))
        if prev_g is not None:
            out.cosines.append(cosine(g, prev_g))
            out.diff2.append(float((g - prev_g) @ (g - prev_g)))
            if a is not None:
                out.dg2.append(float((a - prev_a) @ (c - prev_c)))
        prev_g, prev_a, prev_c = g, a, c
    return out


def crossing(batches: Sequence[int], snrs: Sequence[float]) -> float:
    """The batch where SNR passes 1, interpolated in log-log between the ladder's points
    (``inf``: it stays below 1 on the ladder; the smallest batch's own value where it is
    above 1 there already, extrapolated along SNR proportional to B)."""
    pts = [(b, s) for b, s in zip(batches, snrs) if math.isfinite(s)]
    if not pts:
        return math.nan
    b0, s0 = pts[0]
    if s0 >= 1:
        return b0 / s0 if s0 > 0 else math.nan
    for (b1, s1), (b2, s2) in zip(pts, pts[1:]):
        if s1 < 1 <= s2:
            if s1 <= 0:
                return float(b2) / s2
            t = math.log(1 / s1) / math.log(s2 / s1)
            return math.exp(math.log(b1) + t * math.log(b2 / b1))
    return math.inf


def positive_from(rows: Sequence[AlongRun], z: float = 1.645) -> float:
    """The smallest batch from which every larger one's mean cosine is clearly positive (mean
    minus ``z`` standard errors above 0); ``inf`` if the largest is not."""
    first = math.inf
    for r in sorted(rows, key=lambda r: r.batch, reverse=True):
        m, se = r.cosine
        if not (math.isfinite(m) and m - z * (se if math.isfinite(se) else math.inf) > 0):
            break
        first = r.batch
    return first


def predicted_crossover(rows: Sequence[AlongRun], trace: float) -> dict:
    """Where SNR passes 1, where the cosine turns clearly positive, and the predicted
    crossover: the larger of the two (``inf``: beyond the ladder)."""
    rows = sorted(rows, key=lambda r: r.batch)
    snr_at = crossing([r.batch for r in rows], [r.snr(trace) for r in rows])
    cos_at = positive_from(rows)
    both = [x for x in (snr_at, cos_at) if not math.isnan(x)]
    return {"snr_passes_1": snr_at, "cosine_positive_from": cos_at,
            "crossover": max(both) if both else math.nan}  # fmt: skip
