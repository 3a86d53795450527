"""GPU paths (bf16 autocast, fused AdamW, SDPA on CUDA); skipped without a CUDA device."""

import pytest
import torch

import train
from helpers import fast_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_bf16_run_on_cuda(tmp_path, sotu_dir):
    typed, plain = fast_config(tmp_path / "run", sotu_dir, "max_steps=8", "device=cuda")
    summary = train.train(typed, plain)
    assert summary["steps"] == 8 and summary["final_val_loss"] < 10.9


def test_bf16_forward_close_to_fp32():
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=64)).cuda()
    x = torch.randint(0, 50257, (2, 64), device="cuda")
    _, ref = model(x, x)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, low = model(x, x)
    assert abs(ref.item() - low.item()) < 0.05


@pytest.mark.parametrize("name", __import__("optim").available())
def test_optimizer_step_has_no_host_sync(name):
    import optim
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=64)).cuda()
    opt = optim.build_optimizer(model, optim.get_spec(name).config_cls())
    x = torch.randint(0, 50257, (2, 32), device="cuda")
    for i in range(3):  # the first step compiles and allocates state: not checked
        model(x, x)[1].backward()
        if getattr(opt, "needs_reference_grad", False):
            opt.store_reference_grad()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if i else "default")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        opt.zero_grad()
    # a fast path ran: the engine (optim/engine/, the default on CUDA with Triton) or the
    # compiled step, not the eager run of a failed compile (torch AdamW: its fused kernel)
    counts = getattr(opt, "route_counts", None)
    if counts is None:
        assert opt.param_groups[0]["fused"], "torch AdamW is expected fused on CUDA"
    else:
        assert opt.off_reason is None, (opt.off_reason, counts)
        assert counts["engine"] + counts["compiled"] > 0, counts  # an element-wise bucket each
