"""bench/memory.py and bench/train.py: the state measured on the meta device equals
a real step's, and the benchmark's trainer runs train.py's step."""

import pytest
import torch

import optim
from bench.memory import estimate_peak_bytes, meta_state_bytes, state_bytes_after_step
from bench.train import optimizer_variants
from model import GPT, GPTConfig

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)


@pytest.mark.parametrize("label,opt_cfg", optimizer_variants(optim.available(), exact=True))
def test_meta_state_bytes_equal_real_ones(label, opt_cfg):
    cfg = GPTConfig(**SMALL)
    real = state_bytes_after_step(GPT(cfg), opt_cfg)
    assert meta_state_bytes(cfg, opt_cfg) == (real, GPT(cfg).num_params())


def test_chunked_loss_estimate_is_smaller_for_long_batches():
    cfg = GPTConfig()
    kw = dict(params=124_000_000, state=0, tokens=16 * 1024, checkpointing=False)
    assert estimate_peak_bytes(cfg, chunk=4096, **kw) < estimate_peak_bytes(cfg, chunk=0, **kw)


def test_bench_trainer_runs_the_training_step():
    from bench.train import BenchTrainer
    from runtime.distributed import DistInfo
    from trainer.config import TrainConfig

    cfg = TrainConfig(model=GPTConfig(**SMALL), optimizer=optim.get_spec("mars-adamw").config_cls(
        mode="exact"), micro_batch_size=2, seq_len=16, batch_tokens=32, device="cpu")  # fmt: skip
    trainer = BenchTrainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")))
    loss, _, _ = trainer.train_step()
    assert torch.isfinite(loss) and trainer.state.step == 1
