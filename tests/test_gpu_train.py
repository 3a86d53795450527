"""GPU checks of docs/gpu-readiness.md (prefetch from pinned memory, pinned flat staging,
the regionally compiled bf16 model, a compiled run with evaluations); skipped without CUDA."""

import json

import pytest
import torch

import train
from helpers import fast_config
from model import GPT, GPTConfig
from runtime.distributed import destroy, init_distributed
from trainer.dcp_checkpoint import DcpCheckpointer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_prefetched_batches_on_cuda_equal_the_cpu_ones(sotu_dir):
    from data import TokenLoader, shard_files
    from data.config import DataConfig

    files, _ = shard_files(DataConfig(dir=str(sotu_dir)))
    cpu = TokenLoader(files, batch_size=4, seq_len=64, prefetch=0)
    gpu = TokenLoader(files, batch_size=4, seq_len=64, device="cuda", prefetch=3)
    for _ in range(10):
        a, b = cpu.next_batch(), gpu.next_batch()
        assert b[0].is_cuda and torch.equal(a[0], b[0].cpu()) and torch.equal(a[1], b[1].cpu())


def test_staging_of_cuda_tensors_is_one_pinned_buffer_per_dtype():
    state = {"w": torch.randn(100, 7, device="cuda"), "step": torch.tensor(3.0, device="cuda")}
    saver = DcpCheckpointer(asynchronous=True)
    staged = saver.stage(state)
    assert list(saver.flat) == [torch.float32] and saver.flat[torch.float32].is_pinned()
    assert saver.staged_bytes == 701 * 4
    assert all(torch.equal(staged[k], v.cpu()) for k, v in state.items())
    saver.close()


def test_regional_compile_bf16_matches_eager():
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=64, n_layer=4, n_head=2, n_embd=64)
    eager = GPT(cfg).cuda()
    compiled = GPT(cfg).cuda()
    compiled.load_state_dict(eager.state_dict())
    compiled.loss_chunk_tokens = eager.loss_chunk_tokens = 64
    compiled.compile_regions(dynamic=False)
    x = torch.randint(0, 50257, (2, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = eager(x, x)[1], compiled(x, x)[1]
    assert torch.isfinite(b) and abs(a.item() - b.item()) < 1e-2


def test_compiled_cuda_run_with_evaluations(tmp_path, sotu_dir):
    """compile=true on CUDA, with uneven validation batches and an async DCP checkpoint."""
    out = tmp_path / "run"
    typed, plain = fast_config(out, sotu_dir, "max_steps=6", "device=cuda", "compile=true",
                               "eval_tokens=992", "eval_every=2", "checkpoint_format=dcp",
                               "async_checkpoint=true", "ckpt_every=3")  # fmt: skip
    summary = train.train(typed, plain)
    assert summary["steps"] == 6
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 2, 4, 6]


@pytest.mark.parametrize("optimizer", ["adamw", "mars-adamw", "muon", "mars-m"])
def test_train_step_with_the_device_decision_makes_no_host_sync(tmp_path, sotu_dir, optimizer):
    """nonfinite.decision=device: a training step (forward, backward, clip, check, optimizer
    step) between log steps waits for no queued GPU work; the one read is of the step before's
    flags (an event on a finished copy, which the sync debug mode does not count)."""
    import trainer.trainer as trainer_mod

    typed, _ = fast_config(tmp_path, sotu_dir, f"optimizer={optimizer}", "device=cuda",
                           "nonfinite.decision=device", "log_every=100")  # fmt: skip
    trainer = trainer_mod.Trainer(typed, init_distributed("cuda"), out_dir=tmp_path)
    for _ in range(3):  # warm-up: compiles, state, the loader's prefetch
        trainer.train_step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            trainer.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    trainer.guard.resolve()
    assert trainer.state.skipped_steps == 0
    destroy()
