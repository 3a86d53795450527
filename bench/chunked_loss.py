"""Bytes moved per chunk by the chunked loss's gradient (model/loss.py), before and after the
softmax-minus-one-hot became one compiled kernel, with each version timed on this device.

    python -m bench.chunked_loss                                  # CPU: GPT-2 small, 256 tokens
    python -m bench.chunked_loss --device cuda                    # bf16, 4096 tokens per chunk
    python -m bench.chunked_loss --device cuda --model gpt2-xl --chunk 4096

One chunk of ``n`` tokens, vocabulary V, width C, matmul dtype of ``l`` bytes. The bytes are a
count of what each kernel reads and writes once (a softmax that re-reads its row from cache is
counted once), the same rule before and after:

- before (commit 0452d41): the logits (l), an fp32 log-softmax (l in, 4 out), ``exp_`` (4 in,
  4 out), ``scatter_add_`` of the one-hot, a ``mul_`` by 1/count (4 in, 4 out) and the cast to
  the matmul dtype (4 in, l out); then the two gradient matmuls, the weight one rounding each
  chunk's G^T h to l bytes before adding it to the fp32 buffer;
- after: the logits (l), the log-sum-exp reduction (l in), one pointwise kernel (l in, l out)
  that writes G = (softmax - onehot) / count; the two gradient matmuls, the weight one writing
  fp32 (a float32-output matmul on CUDA) added to the fp32 buffer.

Timed (median of ``--steps``, the device synchronised around each call): the old sequence, the
new eager sequence (what the CPU runs) and the compiled kernel (what CUDA runs), each the whole
chunk (logits, G, dL/dh, dL/dW).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from bench.harness import add_device_args, device_line, model_config, time_call
from model.loss import add_product, grad_logits_fused, grad_logits_inplace
from runtime.distributed import pick_device

GB = 1e9


def passes(n: int, V: int, C: int, low: int, *, fused: bool) -> list[tuple[str, int, int]]:
    """(kernel, bytes read, bytes written) for one chunk (module docstring)."""
    nV, VC, nC = n * V, V * C, n * C
    common = [("logits = h W^T", nC * low + VC * low, nV * low)]
    if not fused:
        cast = [("G to the matmul dtype", nV * 4, nV * low)] if low != 4 else []
        grad = [
            ("log_softmax (fp32)", nV * low, nV * 4),
            ("exp_", nV * 4, nV * 4),
            ("mul_ by 1/count", nV * 4, nV * 4),
            *cast,
        ]
        rounded = low != 4  # the product rounded to the matmul dtype, then added to fp32
        acc = [("dL/dW += G^T h", nV * low + nC * low + VC * (low + 4 if rounded else 4),
                VC * (low + 4 if rounded else 4))]  # fmt: skip
    else:
        grad = [
            ("log-sum-exp (reduction)", nV * low, n * 4),
            ("G (one pointwise)", nV * low, nV * low),
        ]
        extra = 2 * VC * 4 if low != 4 else VC * 4  # fp32 product, then added to the buffer
        acc = [
            ("dL/dW += G^T h (fp32)", nV * low + nC * low + extra, VC * 4 * (2 if low != 4 else 1))
        ]
    dh = [("dL/dh = G W", nV * low + VC * low, nC * low)]
    return common + grad + dh + acc


def chunk_before(h_low, w_low, safe, valid, scale, acc):  # noqa: ANN001, ANN201
    """One chunk as the loss computed it before (commit 0452d41), for timing."""
    low = w_low.dtype
    logp = torch.log_softmax(F.linear(h_low, w_low), dim=-1, dtype=torch.float32)
    nll = -(logp.gather(1, safe.unsqueeze(1)).squeeze(1) * valid).sum()
    g = logp.exp_()
    g.scatter_add_(1, safe.unsqueeze(1), -valid.to(g.dtype).unsqueeze(1))
    g = g.mul_(scale.unsqueeze(1)).to(low)
    grad_h = g @ w_low
    return nll, grad_h, acc.add_(g.t() @ h_low) if low != acc.dtype else acc.addmm_(g.t(), h_low)


def chunk_after(kernel, h_low, w_low, safe, valid, scale, acc):  # noqa: ANN001, ANN201
    """One chunk as model/loss.py computes it now, with ``kernel`` the G kernel."""
    nll, g = kernel(F.linear(h_low, w_low), safe, valid, scale)
    return nll, g @ w_low, add_product(acc, g.t(), h_low)


def report(n: int, V: int, C: int, low: int) -> None:
    totals = {}
    for label, fused in (("before", False), ("after", True)):
        print(f"\n{label}: kernel | read GB | written GB")
        rows = passes(n, V, C, low, fused=fused)
        for name, r, w in rows:
            print(f"  {name:28s} | {r / GB:7.3f} | {w / GB:7.3f}")
        totals[label] = sum(r + w for _, r, w in rows)
        print(f"  {'total':28s} | {totals[label] / GB:7.3f} GB moved per chunk")
    print(f"\nafter / before: {totals['after'] / totals['before']:.2f} of the bytes")


def measure(n: int, V: int, C: int, dtype: torch.dtype, device: torch.device, steps: int) -> None:
    torch.manual_seed(0)
    h = torch.randn(n, C, device=device).to(dtype)
    w = (torch.randn(V, C, device=device) * 0.02).to(dtype)
    safe = torch.randint(0, V, (n,), device=device)
    valid = torch.ones(n, device=device)
    scale = valid / n
    acc = torch.zeros(V, C, device=device)
    compiled = torch.compile(grad_logits_fused)
    cases = {
        "before": lambda: chunk_before(h, w, safe, valid, scale, acc),
        "after, eager in-place": lambda: chunk_after(grad_logits_inplace, h, w, safe, valid, scale, acc),
        "after, compiled": lambda: chunk_after(compiled, h, w, safe, valid, scale, acc),
    }  # fmt: skip
    for fn in cases.values():
        fn()  # warm-up (the compile)
    times = {k: [] for k in cases}
    for _ in range(steps):  # interleaved, so that a busy machine slows every case alike
        for k, fn in cases.items():
            times[k].append(time_call(fn, device))
    print("\ntime per chunk (median):")
    base = statistics.median(times["before"])
    for k, ts in times.items():
        t = statistics.median(ts)
        print(f"  {k:24s} {1e3 * t:9.2f} ms  ({base / t:.2f}x)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_args(ap, model="gpt2-small")
    ap.add_argument("--chunk", type=int, default=None, help="tokens per chunk (CUDA 4096, CPU 256)")
    ap.add_argument(
        "--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32"
    )
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-time", action="store_true", help="print the byte counts only")
    args = ap.parse_args(argv)
    device = pick_device(args.device, 0)
    cuda = device.type == "cuda"
    if args.dtype not in ("auto", "bf16", "fp32"):
        raise SystemExit(f"unknown --dtype {args.dtype!r}; valid: auto, bf16, fp32")
    dtype = (
        torch.bfloat16 if args.dtype == "bf16" or (args.dtype == "auto" and cuda) else torch.float32
    )
    n = args.chunk or (4096 if cuda else 256)
    cfg = model_config(args.model)
    V, C, low = cfg.vocab_size, cfg.n_embd, torch.finfo(dtype).bits // 8
    print(device_line(device))
    print(f"chunk: {n} tokens x vocab {V} x n_embd {C}, matmul dtype {str(dtype)[6:]}")
    report(n, V, C, low)
    if not args.no_time:
        measure(n, V, C, dtype, device, args.steps)


if __name__ == "__main__":
    main()
