"""bench/memory.py and trainer/memory_model.py: the state measured on the meta device equals a real
step's, the memory model's parts equal what autograd saves on the CPU, and the DDP bucket cap."""

import pytest
import torch

import optim
from bench.harness import model_config, optimizer_variants
from bench.memory import saved_activation_bytes
from model import GPT, GPTConfig
from model.gpt import Block
from trainer.memory_model import (
    GIB,
    activation_bytes,
    block_activation_bytes_per_token,
    estimate_memory,
    ladder,
    largest_table,
    loss_bytes,
    parameter_counts,
)
from trainer.memory_plan import meta_state_bytes, state_bytes_after_step
from trainer.trainer import ddp_bucket_cap_mb

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)


@pytest.mark.parametrize("label,opt_cfg", optimizer_variants(optim.available(), exact=True))
def test_meta_state_bytes_equal_real_ones(label, opt_cfg):
    cfg = GPTConfig(**SMALL)
    real = state_bytes_after_step(GPT(cfg), opt_cfg)
    assert meta_state_bytes(cfg, opt_cfg) == (real, GPT(cfg).num_params())


def _saved(module, x_of, tokens, low_precision, params):
    def run():
        x = x_of(tokens)
        if low_precision:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return module(x)
        return module(x)

    return saved_activation_bytes(run, params)


@pytest.mark.parametrize("low_precision", [False, True])
def test_block_activations_match_saved_tensors(low_precision):
    cfg = GPTConfig(block_size=64, vocab_size=64, n_layer=1, n_head=4, n_embd=64)
    block = Block(cfg, 0).train()
    params = list(block.parameters())

    def x_of(batch):
        return torch.randn(batch, 64, 64, requires_grad=True)

    # two token counts: their difference drops autocast's weight copies (saved, not per token)
    per_64_tokens = _saved(block, x_of, 2, low_precision, params) - _saved(
        block, x_of, 1, low_precision, params
    )
    assert per_64_tokens == 64 * block_activation_bytes_per_token(cfg, low_precision=low_precision)


@pytest.mark.parametrize("chunk", [0, 32])
@pytest.mark.parametrize("low_precision", [False, True])
def test_model_activations_and_saved_loss_match(chunk, low_precision):
    cfg = GPTConfig(block_size=64, vocab_size=128, n_layer=2, n_head=4, n_embd=64)
    model = GPT(cfg).train()
    model.loss_chunk_tokens = chunk

    def x_of(batch):
        idx = torch.randint(0, 128, (batch, 64))
        return idx

    def fwd(idx):
        return model(idx, idx)

    per_64 = _saved(fwd, x_of, 2, low_precision, model.parameters()) - _saved(
        fwd, x_of, 1, low_precision, model.parameters()
    )
    acts = activation_bytes(cfg, 64, low_precision=low_precision, checkpointing=False)
    # what the loss keeps per token between forward and backward: the chunked path its dL/dh
    # (fp32), the plain one lm_head's input and the fp32 log-probabilities
    a = 2 if low_precision else 4
    kept = 4 * 64 if chunk else a * 64 + 4 * 128
    assert per_64 == acts + 64 * kept
    if not chunk:  # the model's plain-loss peak adds the backward's two fp32 gradients
        assert loss_bytes(cfg, 64, chunk=0, low_precision=low_precision) == 64 * (kept + 8 * 128)


def test_checkpointing_keeps_only_block_inputs():
    cfg = GPTConfig(block_size=64, vocab_size=128, n_layer=3, n_head=4, n_embd=64)
    model = GPT(cfg).train()
    model.activation_checkpointing = True
    model.loss_chunk_tokens = 32

    def per(batch):
        idx = torch.randint(0, 128, (batch, 64))
        return saved_activation_bytes(lambda: model(idx, idx), model.parameters())

    kept = per(2) - per(1)  # blocks' inputs + embedding/ln_f + the loss's dL/dh, per 64 tokens
    full = activation_bytes(cfg, 64, low_precision=False, checkpointing=True)
    one_block = 64 * block_activation_bytes_per_token(cfg, low_precision=False)
    assert kept == full - one_block + 64 * 4 * 64  # the recomputed block lives in backward only


def test_estimate_parts_and_bucket_view():
    cfg = model_config("gpt2-xl")
    state, n = meta_state_bytes(cfg, optim.get_spec("mars-adamw").config_cls())
    kw = dict(state_bytes=state, micro_batch=5, ddp=True)
    copy = estimate_memory(cfg, gradient_as_bucket_view=False, **kw)
    view = estimate_memory(cfg, gradient_as_bucket_view=True, **kw)
    assert copy.ddp_buckets == 4 * n and view.ddp_buckets == 0
    assert copy.weights == copy.grads == 4 * n and copy.optimizer_state == state
    assert 2 * 1.4e9 < copy.bf16_weights <= 2 * n
    assert copy.total > copy.allocated > view.allocated
    chunked, plain = copy.loss, estimate_memory(cfg, loss_chunk_tokens=0, **kw).loss
    assert chunked < plain
    ckpt = estimate_memory(cfg, activation_checkpointing=True, **kw)
    assert ckpt.activations < copy.activations / 5
    assert 50 * GIB < copy.total < 80 * GIB  # the XL run at the papers' 5 fits one 80 GB GPU


def test_the_launchers_estimate_counts_newton_schulz_buffers():
    """A Newton-Schulz optimizer's step holds its stacks (and, over ranks, the results and its
    gathered slots): the launcher's estimate counts them beside the step's temporaries, from the
    matrices its groups orthogonalise; AdamW holds none."""
    from optim.newton_schulz import ns_buffer_bytes
    from trainer.memory_plan import experiment_estimator, experiment_optimizer, ns_shapes

    cfg, opt_cfg = experiment_optimizer("owt/small-muon")
    with torch.device("meta"):
        model = GPT(cfg)
    shapes, itemsize = ns_shapes(model, opt_cfg)
    blocks = [p.shape for n, p in model.named_parameters() if ".h." in n and p.dim() == 2]
    assert len(shapes) >= len(blocks) and itemsize == 2  # bf16, as the official code
    for world in (1, 8):
        muon = experiment_estimator(["owt/small-muon"], world)(4)
        want = ns_buffer_bytes(shapes, world, merged=True, itemsize=2)
        assert muon.ns_buffers == want > 0
        adamw = experiment_estimator(["owt/small-adamw"], world)(4)
        assert adamw.ns_buffers == 0
    import dataclasses

    without = dataclasses.replace(muon, ns_buffers=0)  # the buffers live in the step's peak
    forward = muon.activations + muon.loss
    step = muon.step_temporaries + muon.ns_buffers
    assert muon.allocated - without.allocated == max(forward, step) - max(
        forward, muon.step_temporaries
    )


@pytest.mark.parametrize("name", ["tiny", "gpt2-small", "gpt2-xl"])
def test_ddp_bucket_cap_holds_a_block(name):
    with torch.device("meta"):
        model = GPT(model_config(name))
    block_bytes = sum(4 * p.numel() for p in model.transformer.h[0].parameters())
    cap = ddp_bucket_cap_mb(model)
    assert cap * 2**20 >= block_bytes and cap >= 25


def test_bench_trainer_runs_the_training_step():
    from bench.train import BenchTrainer
    from runtime.distributed import DistInfo
    from trainer.config import TrainConfig

    cfg = TrainConfig(model=GPTConfig(**SMALL), optimizer=optim.get_spec("mars-adamw").config_cls(
        mode="exact"), micro_batch_size=2, seq_len=16, batch_tokens=32, device="cpu")  # fmt: skip
    trainer = BenchTrainer(cfg, DistInfo(0, 0, 1, torch.device("cpu")))
    loss, _, _ = trainer.train_step()
    assert torch.isfinite(loss) and trainer.state.step == 1


def test_largest_model_per_gpu_count():
    """The README's table: DDP's largest size does not grow with GPUs, FSDP's does not shrink,
    and the sizes past XL are GPT-3's shapes (Brown et al. 2020, Table 2.1)."""
    sizes = ladder()
    assert list(sizes)[-3:] == ["gpt3-2.7b", "gpt3-6.7b", "gpt3-13b"]
    assert abs(sizes["gpt3-13b"][0].n_embd / sizes["gpt3-13b"][0].n_head - 128) < 1e-9
    params = {n: parameter_counts(c)[0] for n, (c, _) in sizes.items()}  # GPT on the meta device
    assert 2.6e9 < params["gpt3-2.7b"] < 2.8e9 and 12.5e9 < params["gpt3-13b"] < 13.5e9

    def adam_state(cfg, opt):  # two float32 moments per parameter, without building a step
        return 8 * parameter_counts(cfg)[0]

    table = largest_table({"adamw": None}, state_bytes=adam_state, memory_gib=78, gpus=(1, 2, 8))
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    order = list(sizes)
    ddp = [order.index(r[1].split()[0]) for r in rows]
    fsdp = [order.index(r[2].split()[0]) for r in rows]
    assert len(set(ddp)) == 1 and fsdp == sorted(fsdp) and fsdp[-1] > ddp[0]
    none = largest_table({"adamw": None}, state_bytes=adam_state, memory_gib=1, gpus=(1,))
    assert none.splitlines()[-1] == "| 1 | - | - |"
