"""Chunked linear + cross-entropy (model/loss.py) against the plain head + F.cross_entropy."""

import pytest
import torch
import torch.nn.functional as F

import model.loss as loss_mod
from model import GPT, GPTConfig
from model.loss import grad_logits_fused, grad_logits_inplace, linear_cross_entropy

SMALL = dict(block_size=32, vocab_size=96, n_layer=2, n_head=2, n_embd=32)


def _inputs(dtype, n=37, c=16, v=50, ignored=(0, 5, 36)):
    torch.manual_seed(0)
    h = torch.randn(n, c, dtype=dtype, requires_grad=True)
    w = torch.randn(v, c, dtype=dtype, requires_grad=True)
    y = torch.randint(0, v, (n,))
    y[list(ignored)] = -1
    return h, w, y


def _grads(loss_fn, h, w, y):
    loss = loss_fn(h, w, y)
    gh, gw = torch.autograd.grad(loss * 3.0, (h, w))  # an upstream gradient != 1
    return loss.detach(), gh, gw


def _plain(h, w, y):
    return F.cross_entropy(F.linear(h, w), y, ignore_index=-1)


@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
def test_float64_equals_formula(chunk):
    h, w, y = _inputs(torch.float64)
    ref = _grads(_plain, h, w, y)
    got = _grads(lambda *a: linear_cross_entropy(*a, chunk=chunk), h, w, y)
    assert got[0].dtype == torch.float64
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_float32_and_no_grad_path():
    h, w, y = _inputs(torch.float32)
    ref = _grads(lambda *a: F.cross_entropy(F.linear(a[0], a[1]).float(), a[2], ignore_index=-1),
                 h, w, y)  # fmt: skip
    got = _grads(lambda *a: linear_cross_entropy(*a, chunk=10), h, w, y)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, y, chunk=7), ref[0])


def test_only_hidden_needs_grad_and_all_ignored():
    h, w, y = _inputs(torch.float64)
    w = w.detach()
    (gh,) = torch.autograd.grad(linear_cross_entropy(h, w, y, chunk=4), (h,))
    (ref,) = torch.autograd.grad(_plain(h, w, y), (h,))
    torch.testing.assert_close(gh, ref)
    y_none = torch.full_like(y, -1)
    assert torch.isnan(linear_cross_entropy(h, w, y_none, chunk=4))  # as F.cross_entropy
    with pytest.raises(ValueError, match="chunk"):
        linear_cross_entropy(h, w, y, chunk=0)


def _model_grads(model, x, y, **autocast):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", **autocast) if autocast else torch.enable_grad():
        logits, loss = model(x, y)
    loss.backward()
    return logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_model_loss_and_grads_with_tied_weights(dtype):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL)).to(dtype)
    x = torch.randint(0, 96, (3, 16))
    y = torch.randint(0, 96, (3, 16))
    y[0, :5] = -1
    logits, ref_loss, ref = _model_grads(model, x, y)
    assert logits is not None
    model.loss_chunk_tokens = 10
    logits, loss, got = _model_grads(model, x, y)
    assert logits is None  # the full logits tensor is never made
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    if dtype == torch.float32:
        torch.testing.assert_close(loss, ref_loss, **tol)
    assert "transformer.wte.weight" in got  # the tied weight: head and embedding gradients
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], **tol, msg=name)


def test_bf16_autocast_close_to_plain_path():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL))
    x = torch.randint(0, 96, (2, 32))
    _, ref_loss, ref = _model_grads(model, x, x, dtype=torch.bfloat16)
    model.loss_chunk_tokens = 16
    _, loss, got = _model_grads(model, x, x, dtype=torch.bfloat16)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=2e-3, atol=2e-3)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0.05, atol=2e-3, msg=name)


def test_activation_checkpointing_same_loss_and_grads():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, dropout=0.1))
    x = torch.randint(0, 96, (2, 32))
    torch.manual_seed(1)
    _, ref_loss, ref = _model_grads(model, x, x)
    model.activation_checkpointing = True
    torch.manual_seed(1)  # the same dropout masks: checkpoint replays the RNG state
    _, loss, got = _model_grads(model, x, x)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-6, atol=1e-7, msg=name)


def _kernel_inputs(dtype, n=19, v=50):
    torch.manual_seed(0)
    logits = (torch.randn(n, v) * 4).to(dtype)
    target = torch.randint(0, v, (n,))
    valid = torch.ones(n, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    valid[[2, 7]] = 0
    return logits, target, valid, valid / valid.sum()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_kernel_equals_inplace_sequence(dtype):
    """The pointwise form (compiled on CUDA) and the eager in-place one: the same numbers."""
    args = _kernel_inputs(dtype)
    nll_a, g_a = grad_logits_fused(*args)
    nll_b, g_b = grad_logits_inplace(*args)
    assert g_a.dtype == g_b.dtype == dtype
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(nll_a, nll_b, **tol)
    torch.testing.assert_close(g_a, g_b, **tol)
    assert g_a[[2, 7]].abs().max() == 0  # ignored rows: no gradient


def test_fused_kernel_writes_bf16_within_one_rounding():
    logits, target, valid, scale = _kernel_inputs(torch.bfloat16)
    nll, g = grad_logits_fused(logits, target, valid, scale)
    ref_nll, ref_g = grad_logits_inplace(logits.double(), target, valid.double(), scale.double())
    assert g.dtype == torch.bfloat16 and nll.dtype == torch.float32
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-6, atol=1e-6)
    # One rounding to bf16 (8 significant bits) of the float64 value, nothing more.
    assert ((g.double() - ref_g).abs() <= ref_g.abs() * 2**-8 + 1e-30).all()


def test_bf16_weight_gradient_summed_in_fp32_across_chunks():
    """Under bf16 autocast the head gradient does not depend on the chunking beyond fp32
    rounding: each chunk's G^T h is added in fp32, not rounded to bf16 first (which moved it by
    about 1e-3 relative)."""
    h, w, y = _inputs(torch.float32, n=64, c=16, v=50, ignored=(0, 5))
    grads = {}
    for chunk in (4, 64):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = linear_cross_entropy(h, w, y, chunk=chunk)
        grads[chunk] = torch.autograd.grad(loss, (h, w))
    torch.testing.assert_close(grads[4][1], grads[64][1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads[4][0], grads[64][0], rtol=0, atol=0)


@pytest.mark.slow
def test_compiled_kernel_on_cpu_matches_eager(monkeypatch):
    """The compiled kernel (what CUDA runs) through inductor on the CPU: the same loss and
    gradients as the eager path, bf16 autocast included (about a minute of compiling)."""
    monkeypatch.setattr(loss_mod, "FUSED_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(loss_mod, "_compiled", {})
    h, w, y = _inputs(torch.float32, n=40, c=16, v=50)
    for autocast in (False, True):
        results = []
        for fused in (False, True):
            monkeypatch.setattr(loss_mod, "FUSED_DEVICES", {"cpu"} if fused else set())
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = linear_cross_entropy(h, w, y, chunk=16)  # 16, 16 and 8 tokens
            results.append((loss.detach(), *torch.autograd.grad(loss, (h, w))))
        tol = dict(rtol=2e-2, atol=1e-4) if autocast else dict(rtol=1e-5, atol=1e-6)
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, **tol)
    assert "fused" in loss_mod._compiled


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_compiled_bf16_chunked_loss_matches_plain_and_saves_memory():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=256, n_layer=2, n_head=2, n_embd=128)).cuda()
    x = torch.randint(0, 50257, (8, 256), device="cuda")
    results = {}
    for chunk in (0, 512):
        model.loss_chunk_tokens = chunk
        compiled = torch.compile(model)
        for _ in range(2):  # the second call: compiled, measured
            model.zero_grad(set_to_none=True)
            torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = compiled(x, x)[1]
            loss.backward()
        peak = torch.cuda.max_memory_allocated()
        results[chunk] = (loss.detach(), model.lm_head.weight.grad.clone(), peak)
    torch.testing.assert_close(results[512][0], results[0][0], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(results[512][1], results[0][1], rtol=0.05, atol=1e-3)
    assert results[512][2] < results[0][2]


def test_bench_counts_fewer_bytes_after(capsys):
    from bench.chunked_loss import main, passes

    total = {f: sum(r + w for _, r, w in passes(4096, 50304, 768, 2, fused=f)) for f in (0, 1)}
    assert total[True] < 0.5 * total[False]  # bf16, GPT-2 small, a 4096-token chunk
    main(["--model", "tiny", "--no-time"])
    out = capsys.readouterr().out
    assert out.startswith("device: cpu") and "after / before" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fused_kernel_and_fp32_head_gradient():
    """What CUDA runs: the compiled kernel within one bf16 rounding of float64, and each
    chunk's G^T h added in fp32 (a float32-output matmul where torch has one)."""
    logits, target, valid, scale = (t.cuda() for t in _kernel_inputs(torch.bfloat16, n=64, v=512))
    nll, g = loss_mod._grad_logits(logits.device)(logits, target, valid, scale)
    ref_nll, ref_g = grad_logits_inplace(logits.double(), target, valid.double(), scale.double())
    assert g.dtype == torch.bfloat16
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=1e-5)
    assert ((g.double() - ref_g).abs() <= ref_g.abs() * 2**-8 + 1e-30).all()
    h = torch.randn(64, 32, device="cuda").to(torch.bfloat16)
    acc = loss_mod.add_product(None, g[:32].t(), h[:32])
    acc = loss_mod.add_product(acc, g[32:].t(), h[32:])
    assert acc.dtype == torch.float32
    torch.testing.assert_close(acc.double(), g.t().double() @ h.double(), rtol=1e-5, atol=1e-6)
