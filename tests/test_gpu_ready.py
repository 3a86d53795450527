"""Defects a first GPU hour would hit, caught on the CPU (docs/gpu-readiness.md)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model import GPT, GPTConfig
from model.loss import linear_cross_entropy
from runtime.device import peak_flops_of
from runtime.distributed import DistInfo
from trainer import checkpoint as ckpt
from trainer.dcp_checkpoint import DcpCheckpointer, load_dcp

TINY = dict(block_size=16, vocab_size=96, n_layer=2, n_head=2, n_embd=32)
CPU1 = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


class _CountCasts(TorchDispatchMode):
    """Counts dtype casts (``aten._to_copy``) of one tensor."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.ptr, self.count = tensor.data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() == self.ptr:
            self.count += 1
        return func(*args, **(kwargs or {}))


# Item 8: the small ones.


def test_h100_nvl_peak_is_its_dense_bf16():
    assert peak_flops_of("NVIDIA H100 NVL") == 835e12
    assert peak_flops_of("NVIDIA H100 80GB HBM3") == 989e12


def test_head_weight_is_cast_once_per_loss_call():
    h = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    y = torch.randint(0, 50, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16), _CountCasts(w) as casts:
        loss = linear_cross_entropy(h, w, y, chunk=8)  # 8 chunks
    loss.backward()
    assert casts.count == 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with _CountCasts(w) as casts:
            linear_cross_entropy(h, w, y, chunk=8)
    assert casts.count == 1


def _save(tmp_path, model, dcp: bool):
    opt = torch.optim.AdamW(model.parameters())
    loader = type("L", (), {"state_dict": lambda self: {"consumed": 0}})()
    state = type("S", (), dict(step=1, tokens=0, best_val_loss=None, last_val_loss=None,
                               last_train_loss=None, skipped_steps=0))()  # fmt: skip
    saver = DcpCheckpointer(asynchronous=False) if dcp else None
    ckpt.save_training_state(tmp_path, model, opt, loader, state, config={}, dist=CPU1,
                             keep=0, elapsed=lambda: 0.0, dcp_saver=saver)  # fmt: skip
    return ckpt.latest_checkpoint(tmp_path)


def test_tied_weight_is_stored_once_and_old_checkpoints_load(tmp_path):
    torch.manual_seed(0)
    cfg = GPTConfig(**{**TINY, "vocab_size": 4096})  # the tied matrix dominates the state
    model = GPT(cfg)
    unique = sum(p.numel() * p.element_size() for p in model.parameters())
    path = _save(tmp_path / "dcp", model, dcp=True)
    stored = load_dcp(path)["model"]
    assert "lm_head.weight" not in stored and len(stored) == len(list(model.parameters()))
    written = sum(f.stat().st_size for f in path.glob("*.distcp"))
    head = model.lm_head.weight.nbytes
    assert unique <= written < unique + head // 2  # the (vocab, n_embd) matrix once, not twice
    path = _save(tmp_path / "file", model, dcp=False)
    stored = ckpt.load_checkpoint(path)["model"]
    assert "lm_head.weight" not in stored
    for state in (stored, model.state_dict()):  # new checkpoints, and old ones with both keys
        fresh = GPT(cfg)
        ckpt.load_model_state(fresh, state, "test")
        assert fresh.lm_head.weight is fresh.transformer.wte.weight
        assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
