"""Chunked linear + cross-entropy: the training loss without the (tokens, vocab) logits tensor.

With GPT-2's 50,304-token vocabulary the head's logits are the largest activation of a training
step (16,384 tokens x 50,304 x 4 bytes = 3.3 GB in fp32 for one GPT-2 small micro-batch of
16 x 1024, before the log-softmax and its gradient double it). ``linear_cross_entropy`` computes

    loss = mean over tokens with target != -1 of  logsumexp(h W^T) - (h W^T)[target]

one chunk of ``chunk`` tokens at a time. When a gradient is needed, each chunk's gradients are
computed in the forward pass, while its logits are at hand: ``G = (softmax - onehot(target)) /
count`` per valid row, ``dL/dh = G W`` per chunk and ``dL/dW = sum over chunks of G^T h``.
Backward only scales them by the incoming gradient. The same three matmuls as the plain path, and
at most one chunk's logits alive at a time; the price is a (vocab, n_embd) fp32 buffer for dL/dW.

Autocast behaves as in the plain path (``lm_head`` under autocast, then ``.float()``): each chunk's
logits come out of the matmul in the autocast dtype and the softmax runs in fp32. ``G`` is
written once, in the matmul dtype, for the two gradient matmuls; on CUDA it comes out of one
compiled kernel (a row reduction for the log-sum-exp, then one pointwise pass that reads the
logits and writes ``G``; ``python -m bench.chunked_loss`` counts the bytes). Elsewhere an eager
in-place sequence computes the same values. Each chunk's ``G^T h`` is summed into dL/dW in fp32,
never rounded to the matmul dtype first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype: torch 2.4 and newer.
_AUTOCAST_BY_DEVICE = hasattr(torch, "get_autocast_dtype")
# torch.mm(bf16, bf16, out_dtype=torch.float32): a CUDA kernel on newer torch (not on the CPU).
_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")
# Devices whose chunks go through the compiled kernel (tests add "cpu" to exercise it there).
FUSED_DEVICES = {"cuda"}


def matmul_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear(h, weight)`` computes in: autocast's where it is on, else the
    inputs'."""
    kind = h.device.type
    if torch.is_autocast_enabled(kind) if _AUTOCAST_BY_DEVICE else torch.is_autocast_enabled():
        return torch.get_autocast_dtype(kind)
    return torch.promote_types(h.dtype, weight.dtype)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _nll_sum(logits: torch.Tensor, safe: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Sum over the chunk's valid rows of logsumexp(logits) - logits[target], in >= fp32 (the
    no-gradient path; the upcast happens inside the reduction, no fp32 copy is kept)."""
    x = logits.to(_acc_dtype(logits.dtype))
    picked = x.gather(1, safe.unsqueeze(1)).squeeze(1)
    return ((torch.logsumexp(x, dim=-1) - picked) * valid).sum()


def grad_logits_fused(
    logits: torch.Tensor, safe: torch.Tensor, valid: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's loss sum and ``G`` (the softmax minus the one-hot target, times ``scale``
    per row) in ``logits``' dtype, written pointwise: compiled, it is a row reduction and one
    kernel that reads the logits once and writes ``G`` once (the one-hot is a comparison with
    the column index, not a scatter into a materialised buffer)."""
    x = logits.to(_acc_dtype(logits.dtype))
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    picked = x.gather(1, safe.unsqueeze(1))
    nll = ((lse - picked).squeeze(1) * valid).sum()
    cols = torch.arange(x.size(1), device=x.device)
    onehot = (cols == safe.unsqueeze(1)).to(x.dtype)
    g = (torch.exp(x - lse) - onehot) * scale.unsqueeze(1)
    return nll, g.to(logits.dtype)


def grad_logits_inplace(
    logits: torch.Tensor, safe: torch.Tensor, valid: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``grad_logits_fused``'s values with one (chunk, vocab) buffer reused in place: the eager
    path, where each operation is its own kernel and memory matters more than passes."""
    logp = torch.log_softmax(logits, dim=-1, dtype=_acc_dtype(logits.dtype))
    nll = -(logp.gather(1, safe.unsqueeze(1)).squeeze(1) * valid).sum()
    g = logp.exp_()
    g.scatter_add_(1, safe.unsqueeze(1), -valid.to(g.dtype).unsqueeze(1))
    return nll, g.mul_(scale.unsqueeze(1)).to(logits.dtype)


_compiled: dict[str, object] = {}


def _grad_logits(device: torch.device):  # noqa: ANN202
    """The kernel for ``device``: compiled where asked (FUSED_DEVICES), made once per process.
    Inside a graph being compiled (``model.compile_regions``) the pointwise form is traced into
    that graph instead."""
    if torch.compiler.is_compiling():
        return grad_logits_fused
    if device.type not in FUSED_DEVICES:
        return grad_logits_inplace
    if "fused" not in _compiled:
        # dynamic=None: static for the full chunk, one dynamic graph for the other lengths.
        _compiled["fused"] = torch.compile(grad_logits_fused)
    return _compiled["fused"]


def add_product(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc + a @ b`` in fp32 (or wider) without rounding ``a @ b`` to ``a``'s dtype first:
    in place where the dtypes allow, a float32-output matmul on CUDA, else an upcast."""
    acc_dtype = _acc_dtype(a.dtype)
    if a.dtype == acc_dtype:
        return a @ b if acc is None else acc.addmm_(a, b)
    with torch.autocast(a.device.type, enabled=False):  # autocast would cast an fp32 matmul down
        if a.is_cuda and _MM_OUT_DTYPE:
            product = torch.mm(a, b, out_dtype=acc_dtype)
        else:
            product = a.to(acc_dtype) @ b.to(acc_dtype)
    return product if acc is None else acc.add_(product)


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss and both gradients in one chunked pass (see the module docstring)."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int, need_w: bool):  # noqa: ANN001, ANN205
        acc = _acc_dtype(h.dtype)
        valid = targets != -1
        count = valid.sum()
        safe = targets.clamp(min=0)
        valid_f = valid.to(acc)
        scale = valid_f / count  # 0 on ignored rows; nan everywhere if none valid
        total = torch.zeros((), dtype=acc, device=h.device)
        grad_h = torch.empty_like(h)
        grad_w = None
        w_low = weight.to(matmul_dtype(h, weight))  # the (vocab, n_embd) cast, once per call
        kernel = _grad_logits(h.device)
        for start in range(0, h.size(0), chunk):
            sl = slice(start, start + chunk)
            h_low = h[sl].to(w_low.dtype)
            nll, g = kernel(F.linear(h_low, w_low), safe[sl], valid_f[sl], scale[sl])
            total = total + nll
            grad_h[sl] = (g @ w_low).to(h.dtype)
            if need_w:
                grad_w = add_product(grad_w, g.t(), h_low)
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
    acc = _acc_dtype(h.dtype)
    total = torch.zeros((), dtype=acc, device=h.device)
    w_low = weight.to(matmul_dtype(h, weight))
    for start in range(0, h.size(0), chunk):
        sl = slice(start, start + chunk)
        logits = F.linear(h[sl].to(w_low.dtype), w_low)
        total = total + _nll_sum(logits, safe[sl], valid[sl].to(acc))
    return total / valid.sum()
