"""The project's one memory model: peak GPU memory of one training rank, part by part.

It plans a training run rather than measuring one, so it lives with the training application:
the launcher (scripts/launch.py) picks the micro-batch that fits with it, and the benchmarks
use it too (``python -m bench.memory``: the tables of docs/performance.md and docs/fsdp.md;
``python -m bench.train``: the estimate beside the measured peak). Every part is named, so a
printout shows where the memory goes:

    weights            fp32 master weights, 4 B/param
    grads              fp32 gradients, 4 B/param
    ddp_buckets        DDP's flat gradient buckets, 4 B/param with several ranks and
                       gradient_as_bucket_view=False (torch's default); 0 with True (the .grad
                       tensors are then views into the buckets) or one process
    optimizer_state    the optimizer's state, measured on the meta device (trainer/memory_plan.py)
    bf16_weights       autocast's low-precision copies of the matmul weights, 2 B per matrix
                       parameter, kept for the backward pass
    activations        the tensors autograd saves, per token per block (below); with activation
                       checkpointing only each block's fp32 input plus one block's worth
    loss               chunked: the saved fp32 dL/dh (4 n_embd/token), the fp32 dL/dW buffer
                       (4 V n_embd) and one chunk in flight: under bf16 its logits and their
                       gradient, both bf16 (4 V per chunk token; one compiled kernel turns one
                       into the other), plus the chunk's fp32 G^T h before it is added to dL/dW
                       (4 V n_embd); in fp32 the logits and the gradient (8 V per chunk token);
                       plain: 12 V bytes per token at the backward's peak (fp32 log-softmax saved,
                       its incoming gradient and its output gradient)
    step_temporaries   the optimizer step's temporaries, one fp32 tensor per parameter (the foreach
                       paths); the step runs after the activations are freed, so the peak holds the
                       larger of (activations + loss) and these (with the Newton-Schulz buffers)
    cuda_context       CUDA context, cuBLAS workspaces and NCCL buffers: outside the allocator, in
                       nvidia-smi's figure but not in torch.cuda.max_memory_allocated
    fragmentation      a margin for the caching allocator's unused pieces of its blocks
    ns_buffers         Newton-Schulz's buffers during the step (optimizers that orthogonalise):
                       the engine's stack of each batch and, over several DDP ranks, the results
                       every rank receives and its all-gathered slots, in the NS dtype
                       (optim.newton_schulz.ns_buffer_bytes; trainer/memory_plan.py finds the
                       matrices); 0 for the others

Activations of one pre-LN block per token, with ``a`` bytes per activation element (2 under
bf16 autocast, 4 in fp32), C = n_embd, H = n_head (measured with saved-tensor hooks,
tests/test_memory.py): the two LayerNorm inputs in fp32 (the residual stream stays fp32), 8 C;
c_attn's input, q/k/v, the attention output (which c_proj's input shares: the flash kernels return
it in (B, T, H, D) layout, so the transpose's .contiguous() copies nothing), c_fc's input, the GELU
input and c_proj's input: (1 + 3 + 1 + 1 + 4 + 4) C = 14 C elements; the LayerNorms' mean and
rstd, 16 B; the attention's fp32 log-sum-exp, 4 H B. Under bf16 that is 36 C + 16 + 4 H bytes
(Korthikanti et al.'s 34 C counts the residual stream in bf16); with dropout > 0 (no paper run)
the model adds the 2 C one-byte masks, an approximation. torch.compile's fusions save somewhat less:
the model is an upper bound there.

LLaMA-style blocks (``arch=llama``, model/llama.py; F = the SwiGLU width), measured the same way:
each RMSNorm keeps its fp32 input, its fp32 normalised output and the 4-byte rstd (8 C + 4 B);
c_attn's input, the q/k/v output (v keeps the whole stacked storage), the rotated q and k and
the attention output, (1 + 3 + 1 + 1 + 1) C = 7 C elements; the MLP's input (once in fp32, twice
under autocast: w1 and w2 each cast it), w1's and w2's outputs, the SiLU output and c_proj's
input, 4 F elements; the log-sum-exp, 4 H B. Under bf16: 16 C + 8 + 2 (9 C + 4 F) + 4 H bytes.
The rotary tables (cos and sin, per position, not per sequence) are left out.
"""

from __future__ import annotations

import dataclasses

import torch

from model import GPTConfig, build_model
from runtime.config_files import load_config

GIB = 2**30
MIB = 2**20
CUDA_CONTEXT_BYTES = int(1.5 * GIB)  # context ~0.5 GiB on an H100 + cuBLAS workspace + NCCL
FRAGMENTATION = 0.10  # of the allocator's peak


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each part (module docstring) of one rank's peak training memory."""

    weights: int
    grads: int
    ddp_buckets: int
    optimizer_state: int
    bf16_weights: int
    activations: int
    loss: int
    step_temporaries: int
    cuda_context: int
    fragmentation: int
    ns_buffers: int = 0

    @property
    def allocated(self) -> int:
        """What torch.cuda.max_memory_allocated should report (no context, no fragmentation)."""
        static = self.weights + self.grads + self.ddp_buckets + self.optimizer_state
        step = self.step_temporaries + self.ns_buffers
        return static + self.bf16_weights + max(self.activations + self.loss, step)

    @property
    def total(self) -> int:
        """The GPU memory the run needs (nvidia-smi's view): allocated + context + margin."""
        return self.allocated + self.cuda_context + self.fragmentation

    def parts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def block_activation_bytes_per_token(cfg: GPTConfig, *, low_precision: bool) -> int:
    """Bytes one block saves for its backward pass per token (module docstring)."""
    a = 2 if low_precision else 4
    C = cfg.n_embd
    masks = 2 * C if cfg.dropout > 0 else 0
    if cfg.arch == "llama":
        mlp_inputs = 2 if low_precision else 1  # autocast casts the MLP input for w1 and w2
        return (
            2 * (8 * C + 4)
            + a * ((7 + mlp_inputs) * C + 4 * cfg.ffn_hidden)
            + 4 * cfg.n_head
            + masks
        )
    return C * (8 + 14 * a) + 16 + 4 * cfg.n_head + masks


def activation_bytes(
    cfg: GPTConfig, tokens: int, *, low_precision: bool, checkpointing: bool
) -> int:
    """Saved activations of the blocks, the embedding and the final LayerNorm for ``tokens``."""
    block = block_activation_bytes_per_token(cfg, low_precision=low_precision)
    if checkpointing:  # each block's fp32 input kept; one block recomputed at a time
        per_token = 4 * cfg.n_embd * cfg.n_layer + block
    else:
        per_token = block * cfg.n_layer
    if cfg.arch == "llama":  # int64 token ids; the final RMSNorm's fp32 input, output and rstd
        embed_and_ln_f = 8 + 8 * cfg.n_embd + 4
    else:  # int64 token ids; ln_f's fp32 input and stats
        embed_and_ln_f = 8 + 4 * cfg.n_embd + 8
    return tokens * (per_token + embed_and_ln_f)


def loss_bytes(cfg: GPTConfig, tokens: int, *, chunk: int, low_precision: bool) -> int:
    """The loss path's memory at the backward's peak (module docstring)."""
    V, C = cfg.vocab_size, cfg.n_embd
    if chunk > 0:
        rows = min(chunk, tokens)
        in_flight = 4 * V * rows + 4 * V * C if low_precision else 8 * V * rows
        return 4 * C * tokens + 4 * V * C + in_flight
    head_input = (2 if low_precision else 4) * C  # lm_head's saved (autocast-cast) input
    return tokens * (head_input + 12 * V)


def matrix_params(model: torch.nn.Module) -> int:
    """Elements of the distinct 2-D weights (the ones autocast copies to bf16)."""
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2)


_COUNTS: dict[str, tuple[int, int, int, int]] = {}


def parameter_counts(cfg: GPTConfig) -> tuple[int, int, int, int]:
    """(parameters, elements of the 2-D weights, the FSDP root unit's parameters, the largest
    block's) of ``cfg``'s model, built once per config on the meta device: a launcher choosing a
    micro-batch estimates the same model many times, and building GPT-2 XL on the meta device
    takes seconds (its initialisers run as Python there)."""
    key = repr(cfg)
    if key not in _COUNTS:
        with torch.device("meta"):
            model = build_model(cfg)
        n = model.num_params()
        blocks = [sum(p.numel() for p in b.parameters()) for b in model.transformer.h]
        _COUNTS[key] = (n, matrix_params(model), n - sum(blocks), max(blocks, default=0))
    return _COUNTS[key]


def estimate_memory(
    cfg: GPTConfig,
    *,
    state_bytes: int,
    micro_batch: int,
    seq_len: int | None = None,
    loss_chunk_tokens: int = 4096,
    activation_checkpointing: bool = False,
    low_precision: bool = True,
    ddp: bool = False,
    gradient_as_bucket_view: bool = True,
    cuda: bool = True,
    ns_buffer_bytes: int = 0,
) -> MemoryEstimate:
    """Peak memory of one rank training ``cfg`` (GPT-2 or LLaMA) with ``micro_batch`` sequences
    of ``seq_len``.

    ``state_bytes`` is the optimizer's state (``trainer.memory_plan.meta_state_bytes``);
    ``ns_buffer_bytes`` Newton-Schulz's buffers in the step (``trainer.memory_plan.ns_bytes``);
    ``low_precision`` is bf16/fp16 autocast; ``ddp`` means several ranks (DDP buckets exist);
    ``cuda`` adds the CUDA context and the allocator margin.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    n, matrices, _, _ = parameter_counts(cfg)
    tokens = micro_batch * (seq_len or cfg.block_size)
    parts = dict(
        weights=4 * n,
        grads=4 * n,
        ddp_buckets=4 * n if ddp and not gradient_as_bucket_view else 0,
        optimizer_state=state_bytes,
        bf16_weights=2 * matrices if low_precision else 0,
        activations=activation_bytes(
            cfg, tokens, low_precision=low_precision, checkpointing=activation_checkpointing
        ),
        loss=loss_bytes(cfg, tokens, chunk=loss_chunk_tokens, low_precision=low_precision),
        step_temporaries=4 * n,
        cuda_context=0,
        fragmentation=0,
        ns_buffers=ns_buffer_bytes,
    )
    est = MemoryEstimate(**parts)
    if not cuda:
        return est
    margin = int(FRAGMENTATION * est.allocated)
    return dataclasses.replace(est, cuda_context=CUDA_CONTEXT_BYTES, fragmentation=margin)


def fitting_micro_batch(candidates: list[int], memory_gib: float, estimate) -> int | None:
    """The largest of ``candidates`` whose ``estimate(micro_batch).total`` fits ``memory_gib``;
    None when none fits."""
    fits = [b for b in candidates if estimate(b).total <= memory_gib * GIB]
    return max(fits, default=None)


def describe(est: MemoryEstimate) -> str:
    """One line per part, GiB."""
    rows = [f"  {k:<18}{v / GIB:8.2f} GiB" for k, v in est.parts().items()]
    rows.append(f"  {'allocated peak':<18}{est.allocated / GIB:8.2f} GiB")
    rows.append(f"  {'total':<18}{est.total / GIB:8.2f} GiB")
    return "\n".join(rows)


def preset(name: str) -> GPTConfig:
    """configs/model/<name>.yaml as a GPTConfig (the tables below take the GPT-2 presets)."""
    return GPTConfig(**load_config(f"model/{name}"))


# --- FSDP (parallel=fsdp, trainer/fsdp.py) -------------------------------------------------------

# The papers' micro-batch: 480 sequences on 8 GPUs with the official grad accumulation of 4
# (small, medium) or 12 (large, XL): 480 / 8 / 4 = 15 and 480 / 8 / 12 = 5.
PAPER_MICRO_BATCH = {"gpt2-small": 15, "gpt2-medium": 15, "gpt2-large": 5, "gpt2-xl": 5}
GPU_COUNTS = (1, 2, 4, 8)
# Past GPT-2 XL: GPT-2 models of GPT-3's shapes (Brown et al. 2020, "Language Models are Few-Shot
# Learners", Table 2.1: layers, d_model, heads; 13B's d_model is printed as 5140 there, 40 heads of
# 128 make 5120), context 1024 and XL's micro-batch of 5, to find where a GPU count runs out.
LARGER = {"gpt3-2.7b": (32, 2560, 32), "gpt3-6.7b": (32, 4096, 32), "gpt3-13b": (40, 5120, 40)}
LARGER_MICRO_BATCH = 5


@dataclasses.dataclass(frozen=True)
class FsdpMemoryEstimate(MemoryEstimate):
    """One FSDP rank: ``weights``, ``grads``, ``optimizer_state`` and ``step_temporaries`` are
    this rank's shards (1/world size); ``bf16_weights`` is autocast's copy of the tied head alone
    (the blocks are gathered in the compute dtype, the root in float32); ``gathered`` is what
    FSDP gathers at its peak: the root unit in float32 (kept gathered from its forward to its
    backward; float32 so that the residual stream is, as under DDP), the block being computed
    and the next one (prefetched) in the compute dtype, and the largest unit's unsharded float32
    gradients before their reduce-scatter."""

    gathered: int = 0

    @property
    def allocated(self) -> int:
        return super().allocated + self.gathered


def fsdp_units_params(cfg: GPTConfig) -> tuple[int, int]:
    """(root unit's parameters, largest block's parameters): the FSDP units of trainer/fsdp.py;
    the root holds every parameter outside the blocks (embeddings, ln_f, the tied head)."""
    return parameter_counts(cfg)[2:]


def estimate_fsdp_memory(
    cfg: GPTConfig,
    *,
    state_bytes: int,
    micro_batch: int,
    world_size: int,
    seq_len: int | None = None,
    loss_chunk_tokens: int = 4096,
    activation_checkpointing: bool = False,
    low_precision: bool = True,
    cuda: bool = True,
) -> FsdpMemoryEstimate:
    """Peak memory of one of ``world_size`` FSDP ranks (``FsdpMemoryEstimate``); activations and
    the loss are a DDP rank's (``estimate_memory``): each rank runs its own micro-batch."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ddp = estimate_memory(
        cfg, state_bytes=state_bytes, micro_batch=micro_batch, seq_len=seq_len,
        loss_chunk_tokens=loss_chunk_tokens, activation_checkpointing=activation_checkpointing,
        low_precision=low_precision, cuda=False,
    )  # fmt: skip
    root, block = fsdp_units_params(cfg)
    a = 2 if low_precision else 4
    est = FsdpMemoryEstimate(
        weights=-(-ddp.weights // world_size),
        grads=-(-ddp.grads // world_size),
        ddp_buckets=0,
        optimizer_state=-(-state_bytes // world_size),
        bf16_weights=2 * cfg.vocab_size * cfg.n_embd if low_precision else 0,
        activations=ddp.activations,
        loss=ddp.loss,
        step_temporaries=-(-ddp.step_temporaries // world_size),
        cuda_context=0,
        fragmentation=0,
        gathered=4 * root + a * 2 * block + 4 * max(root, block),
    )
    if not cuda:
        return est
    margin = int(FRAGMENTATION * est.allocated)
    return dataclasses.replace(est, cuda_context=CUDA_CONTEXT_BYTES, fragmentation=margin)


def rank_memory(cfg: GPTConfig, *, parallel: str, world_size: int, **kw) -> MemoryEstimate:
    """One rank's estimate under ``parallel`` (ddp | fsdp) on ``world_size`` GPUs: the function
    the launcher calls; ``kw`` as ``estimate_memory``'s."""
    if parallel == "fsdp" and world_size > 1:
        return estimate_fsdp_memory(cfg, world_size=world_size, **kw)
    if parallel not in ("ddp", "fsdp"):
        raise ValueError(f"unknown parallel {parallel!r}; valid: ['ddp', 'fsdp']")
    return estimate_memory(cfg, ddp=world_size > 1, **kw)


def fsdp_table(optimizers: dict, *, state_bytes, memory_gib: float = 80.0, gpus=GPU_COUNTS) -> str:
    """Markdown: for each optimizer (label -> config), parallel mode and GPU count, one rank's
    GiB for each GPT-2 size at the papers' micro-batch and the largest size that fits
    ``memory_gib`` (docs/fsdp.md). ``state_bytes(cfg, opt_cfg)``: the optimizer state's bytes
    (``trainer.memory_plan.meta_state_bytes(...)[0]``, passed in: memory_plan imports this
    module).

        fsdp_table({"adamw": AdamWConfig()}, state_bytes=lambda c, o: meta_state_bytes(c, o)[0])
    """
    sizes = list(PAPER_MICRO_BATCH)
    head = "| optimizer | parallel | GPUs | " + " | ".join(sizes) + " | largest that fits |"
    rows = [head, "|" + "---|" * (len(sizes) + 4)]
    for label, opt_cfg in optimizers.items():
        cfgs = {s: preset(s) for s in sizes}
        states = {s: state_bytes(c, opt_cfg) for s, c in cfgs.items()}
        for parallel in ("ddp", "fsdp"):
            for n in gpus:
                gib = {s: rank_memory(cfgs[s], parallel=parallel, world_size=n,
                                      state_bytes=states[s],
                                      micro_batch=PAPER_MICRO_BATCH[s]).total / GIB
                       for s in sizes}  # fmt: skip
                fits = [s for s in sizes if gib[s] <= memory_gib]
                cells = " | ".join(f"{gib[s]:.1f}" for s in sizes)
                rows.append(
                    f"| {label} | {parallel} | {n} | {cells} | {fits[-1] if fits else '-'} |"
                )
    return "\n".join(rows)


def ladder() -> dict[str, tuple[GPTConfig, int]]:
    """The sizes ``largest_table`` tries, smallest first: each GPT-2 preset at the papers'
    micro-batch, then ``LARGER`` at XL's (name -> (config, micro-batch))."""
    sizes = {s: (preset(s), PAPER_MICRO_BATCH[s]) for s in PAPER_MICRO_BATCH}
    xl = preset("gpt2-xl")
    for name, (layers, width, heads) in LARGER.items():
        cfg = dataclasses.replace(xl, name=name, n_layer=layers, n_embd=width, n_head=heads)
        sizes[name] = (cfg, LARGER_MICRO_BATCH)
    return sizes


def largest_table(optimizers: dict, *, state_bytes, memory_gib: float = 80.0,
                  gpus=GPU_COUNTS) -> str:  # fmt: skip
    """Markdown: per GPU count, the largest size of ``ladder()`` whose one-rank estimate fits
    ``memory_gib``, for each optimizer (label -> config) under DDP and under FSDP (README,
    docs/fsdp.md); ``state_bytes`` as ``fsdp_table``'s."""
    sizes = ladder()
    states = {(label, s): state_bytes(cfg, opt) for label, opt in optimizers.items()
              for s, (cfg, _) in sizes.items()}  # fmt: skip
    cols = [(label, parallel) for label in optimizers for parallel in ("ddp", "fsdp")]
    rows = ["| GPUs | " + " | ".join(f"{label}, {p.upper()}" for label, p in cols) + " |",
            "|---|" + "---|" * len(cols)]  # fmt: skip
    for n in gpus:
        cells = []
        for label, parallel in cols:
            fits = "-"
            for s, (cfg, micro) in sizes.items():
                est = rank_memory(cfg, parallel=parallel, world_size=n, micro_batch=micro,
                                  state_bytes=states[label, s])  # fmt: skip
                if est.total / GIB <= memory_gib:
                    fits = f"{s} ({est.total / GIB:.0f} GiB)"
            cells.append(fits)
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
