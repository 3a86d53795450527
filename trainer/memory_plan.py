"""What the launcher plans a run's micro-batch with: the optimizer state of an experiment,
measured on the meta device, and the memory model's estimate of its runs (trainer/memory_model.py).

State bytes are measured, not estimated: the optimizer takes one step on the model built on the
meta device (shapes only, no memory), and its state tensors are summed, each tensor once;
tests/test_memory.py checks this equals the state of a real step. scripts/launch.py picks the
micro-batch by ``experiment_estimator``; the benchmarks (``python -m bench.memory``,
``bench.gpu_check``, ``bench.train``) use the same functions.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

import optim
from model import GPTConfig, build_model
from optim import OptimizerConfig
from runtime.config_files import load_config
from trainer.config import TrainConfig
from trainer.memory_model import MemoryEstimate, estimate_memory, preset


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's state tensors, each counted once (two entries may share one)."""
    seen, total = set(), 0
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v) and id(v) not in seen:
                seen.add(id(v))
                total += v.numel() * v.element_size()
    return total


def state_bytes_after_step(model: torch.nn.Module, opt_cfg: OptimizerConfig) -> int:
    """Bytes of optimizer state after one step with gradients of the parameters' shapes (exact
    mode's stored reference gradient included: it is state too)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = optim.build_optimizer(model, opt_cfg)
    if getattr(opt, "needs_reference_grad", False):
        opt.store_reference_grad()
    opt.step()
    return state_bytes(opt)


def meta_state_bytes(cfg: GPTConfig, opt_cfg: OptimizerConfig) -> tuple[int, int]:
    """(state bytes, parameter count) of one step on ``cfg``'s model built on the meta device."""
    with torch.device("meta"):
        model = build_model(cfg)
    return state_bytes_after_step(model, opt_cfg), model.num_params()


def ns_shapes(model: torch.nn.Module, opt_cfg: OptimizerConfig) -> tuple[list, int]:
    """(the 2-D shapes the optimizer orthogonalises, the bytes of its Newton-Schulz dtype): the
    matrices of its param groups whose ``preconditioner`` is Newton-Schulz; ([], 2) for an
    optimizer without any. Builds the optimizer only (no step: the model may be on meta)."""
    opt = optim.build_optimizer(model, opt_cfg)
    shapes, itemsize = [], 2
    for g in opt.param_groups:
        if g.get("preconditioner") == "newton-schulz":
            shapes += [tuple(p.shape) for p in g["params"] if p.dim() == 2]
            itemsize = getattr(torch, str(g.get("ns_dtype", "bfloat16"))).itemsize
    return shapes, itemsize


def ns_bytes(cfg: GPTConfig, opt_cfg: OptimizerConfig, world: int) -> int:
    """Newton-Schulz's buffers a rank holds in the step of ``cfg``'s model on ``world`` DDP
    ranks (optim.newton_schulz.ns_buffer_bytes, batched as on CUDA): 0 without NS matrices."""
    from optim.newton_schulz import ns_buffer_bytes

    with torch.device("meta"):
        model = build_model(cfg)
    shapes, itemsize = ns_shapes(model, opt_cfg)
    return ns_buffer_bytes(shapes, world, merged=True, itemsize=itemsize) if shapes else 0


def experiment_optimizer(experiment: str) -> tuple[GPTConfig, OptimizerConfig]:
    """configs/experiment/<experiment>.yaml's model preset and typed optimizer config."""
    exp = load_config(f"experiment/{experiment}")
    opt = dict(exp["optimizer"])
    cls = optim.get_spec(opt.pop("name")).config_cls
    fields = {f.name for f in dataclasses.fields(cls)}
    # YAML gives lists where the typed configs hold tuples (betas)
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in opt.items() if k in fields}
    return preset(exp["model"]["name"]), cls(**kw)


@functools.cache
def experiment_state_bytes(experiment: str) -> int:
    """The optimizer state of configs/experiment/<experiment>.yaml, measured on the meta device."""
    return meta_state_bytes(*experiment_optimizer(experiment))[0]


@functools.cache
def experiment_ns_bytes(experiment: str, world: int) -> int:
    """The Newton-Schulz buffers of configs/experiment/<experiment>.yaml on ``world`` ranks."""
    return ns_bytes(*experiment_optimizer(experiment), world)


def experiment_estimator(experiments: list[str], world: int) -> Callable[[int], MemoryEstimate]:
    """micro-batch -> MemoryEstimate of these experiments (one model size; the largest optimizer
    state and Newton-Schulz buffers) on ``world`` ranks, with the Trainer's DDP settings: what scripts/launch.py picks the
    micro-batch by, and the GPU check with it."""
    from trainer.trainer import GRADIENT_AS_BUCKET_VIEW  # the Trainer (and DDP) only when asked

    cfg = load_config(f"experiment/{experiments[0]}")
    kw = dict(state_bytes=max(experiment_state_bytes(e) for e in experiments),
              ns_buffer_bytes=max(experiment_ns_bytes(e, world) for e in experiments),
              seq_len=cfg.get("seq_len"), ddp=world > 1,
              gradient_as_bucket_view=GRADIENT_AS_BUCKET_VIEW,
              loss_chunk_tokens=cfg.get("loss_chunk_tokens", TrainConfig.loss_chunk_tokens),
              activation_checkpointing=cfg.get("activation_checkpointing", False))  # fmt: skip
    model = preset(cfg["model"]["name"])
    return lambda b: estimate_memory(model, micro_batch=b, **kw)
