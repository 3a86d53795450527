"""Chunked linear + cross-entropy: the training loss without the (tokens, vocab) logits tensor.

With GPT-2's 50,304-token vocabulary the head's logits are the largest activation of a training
step (16,384 tokens x 50,304 x 4 bytes = 3.3 GB in fp32 for one GPT-2 small micro-batch of
16 x 1024, before the log-softmax and its gradient double it). ``linear_cross_entropy`` computes

    loss = mean over tokens with target != -1 of  logsumexp(h W^T) - (h W^T)[target]

one chunk of ``chunk`` tokens at a time. When a gradient is needed, each chunk's gradients are
computed in the forward pass, while its logits are at hand (the softmax minus the one-hot target,
divided by the token count): ``dL/dh = G W`` per chunk and ``dL/dW = sum over chunks of G^T h``.
Backward only scales them by the incoming gradient. The same three matmuls as the plain path, and
at most one chunk's logits alive at a time; the price is a (vocab, n_embd) fp32 buffer for dL/dW.

Autocast behaves as in the plain path (``lm_head`` under autocast, then ``.float()``): each chunk's
logits come out of the matmul in the autocast dtype and the log-softmax runs in fp32; the gradient
of the logits is cast back to that dtype for the two gradient matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype: torch 2.4 and newer.
_AUTOCAST_BY_DEVICE = hasattr(torch, "get_autocast_dtype")


def matmul_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear(h, weight)`` computes in: autocast's where it is on, else the
    inputs'."""
    kind = h.device.type
    if torch.is_autocast_enabled(kind) if _AUTOCAST_BY_DEVICE else torch.is_autocast_enabled():
        return torch.get_autocast_dtype(kind)
    return torch.promote_types(h.dtype, weight.dtype)


def _chunk_log_probs(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Log-softmax of one chunk's logits in at least fp32 (one fused kernel, no upcast copy).
    ``weight`` is already in the matmul dtype (cast once per loss call, not once per chunk)."""
    low = F.linear(h.to(weight.dtype), weight)
    return torch.log_softmax(low, dim=-1, dtype=torch.promote_types(low.dtype, torch.float32))


def _chunk_nll_sum(logp: torch.Tensor, safe: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Sum over the chunk's valid rows of -log p(target)."""
    return -(logp.gather(1, safe.unsqueeze(1)).squeeze(1) * valid).sum()


def _accumulate(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype):
    """``acc + a @ b`` in ``dtype``, in place where the dtypes allow (no (vocab, n_embd) temporary)."""
    if acc is None:
        return (a @ b).to(dtype)
    if a.dtype == dtype:
        return acc.addmm_(a, b)
    return acc.add_(a @ b)


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss and both gradients in one chunked pass (see the module docstring)."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int, need_w: bool):  # noqa: ANN001, ANN205
        acc = torch.promote_types(h.dtype, torch.float32)
        valid = targets != -1
        count = valid.sum()
        safe = targets.clamp(min=0)
        scale = valid.to(acc) / count  # 0 on ignored rows; nan everywhere if none valid
        total = torch.zeros((), dtype=acc, device=h.device)
        grad_h = torch.empty_like(h)
        grad_w = None
        w_low = weight.to(matmul_dtype(h, weight))  # the (vocab, n_embd) cast, once per call
        for start in range(0, h.size(0), chunk):
            sl = slice(start, start + chunk)
            logp = _chunk_log_probs(h[sl], w_low)
            low = w_low.dtype
            total = total + _chunk_nll_sum(logp, safe[sl], valid[sl])
            # The gradient of the mean loss w.r.t. the logits, in place of the log-probabilities.
            g = logp.exp_()
            g.scatter_add_(1, safe[sl].unsqueeze(1), -valid[sl].to(g.dtype).unsqueeze(1))
            g = g.mul_(scale[sl].unsqueeze(1)).to(low)
            grad_h[sl] = (g @ w_low).to(h.dtype)
            if need_w:
                grad_w = _accumulate(grad_w, g.t(), h[sl].to(low), acc)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        grad_h, grad_w = ctx.saved_tensors
        gw = None if grad_w is None else (grad_w * grad_out).to(ctx.weight_dtype)
        return grad_h * grad_out.to(grad_h.dtype), gw, None, None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunk: int
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(h, weight).float(), targets, ignore_index=-1)``, chunked.

    ``h`` is (..., n_embd), ``weight`` (vocab, n_embd), ``targets`` (...) with -1 for tokens to
    ignore; the mean is over the other tokens (nan when there are none, as F.cross_entropy).
    ``chunk`` tokens are processed at a time. Without a gradient to compute (eval, no_grad) only
    the loss is computed, still chunk by chunk.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 token, got {chunk}")
    h = h.reshape(-1, h.size(-1))
    targets = targets.reshape(-1)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, chunk, weight.requires_grad)
    valid = targets != -1
    safe = targets.clamp(min=0)
    acc = torch.promote_types(h.dtype, torch.float32)
    total = torch.zeros((), dtype=acc, device=h.device)
    w_low = weight.to(matmul_dtype(h, weight))
    for start in range(0, h.size(0), chunk):
        sl = slice(start, start + chunk)
        total = total + _chunk_nll_sum(_chunk_log_probs(h[sl], w_low), safe[sl], valid[sl])
    return total / valid.sum()
