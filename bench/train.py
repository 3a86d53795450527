"""Training throughput, MFU and peak memory of whole training steps, per model and optimizer.

    python -m bench.train                          # CUDA: GPT-2 small..XL, every optimizer
    python -m bench.train --models gpt2-small --optimizers adamw mars-adamw
    python -m bench.train --device cpu             # CPU: the tiny model, the same table
    python -m bench.train --device cpu --loss-chunk-tokens 0 4096 --optimizers adamw
    python -m bench.train --device cpu --optimizers adamw --nanogpt /path/to/nanoGPT

Each case times ``Trainer.train_step`` of train.py (the lr schedule, the exact modes' extra
forward/backward through optim.reference_pass, forward/backward over the micro-batches, the grad
clip, the optimizer step) on random tokens: exactly what a training step does, less the data
loader. Defaults on CUDA: bf16 autocast, SDPA (flash) attention, torch.compile, the papers'
micro-batch per GPU (configs/shared/*.yaml) and 1024 tokens; on the CPU: fp32, no compile, the
demo's micro-batch 2 x 128 tokens.

Prints tokens/s (best step after --warmup), MFU (model FLOPs of the trained tokens, 6N + 12LHQT,
over the device's bf16 peak; exact modes do a second forward/backward that is not counted),
peak memory (CUDA: torch.cuda.max_memory_allocated; CPU: peak RSS above the RSS before the case
was built: exact for the first case of a process, a lower bound for the others, since the
tuned allocator keeps freed memory)  and each optimizer's slowdown against AdamW of
the same model and settings. With --nanogpt PATH (a nanoGPT checkout), nanoGPT's model.py GPT
and its training-loop step (AdamW, clip 1.0) run on the same model and batch, for comparison.
On the CPU the cases are interleaved over --rounds rounds (the machine's noise hits all alike).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import platform
import time
from pathlib import Path

import torch
import yaml

import optim
from model import GPT, GPTConfig
from runtime.device import autocast, configure_backends, peak_flops, resolve_dtype
from runtime.distributed import DistInfo, pick_device
from trainer.config import TrainConfig
from trainer.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
GPU_MODELS = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")
SHARED = {"gpt2-small": "small", "gpt2-medium": "medium", "gpt2-large": "large", "gpt2-xl": "xl"}


def model_config(name: str) -> GPTConfig:
    path = ROOT / "configs" / "model" / f"{name}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise SystemExit(f"unknown model {name!r}; valid models: {', '.join(names)}")
    spec = yaml.safe_load(path.read_text())
    return GPTConfig(**{k: v for k, v in spec.items() if not str(k).startswith("_")})


def paper_micro_batch(name: str) -> int:
    """The official runs' micro-batch per GPU (configs/shared/<size>.yaml), else 2 (the demo's)."""
    shared = ROOT / "configs" / "shared" / f"{SHARED.get(name, '')}.yaml"
    return yaml.safe_load(shared.read_text())["micro_batch_size"] if shared.is_file() else 2


class RandomBatches:
    """Stands in for data.TokenLoader: the same few random batches, on the device."""

    def __init__(self, cfg: TrainConfig, device: torch.device, n: int = 2) -> None:
        g = torch.Generator().manual_seed(0)
        shape = (cfg.micro_batch_size, cfg.sequence_length + 1)
        vocab = min(cfg.model.vocab_size, 50257)
        tokens = [torch.randint(0, vocab, shape, generator=g) for _ in range(n)]
        self.batches = [
            (t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)) for t in tokens
        ]
        self.i = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.i += 1
        return self.batches[self.i % len(self.batches)]

    def peek_batch(self, k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[(self.i + 1 + k) % len(self.batches)]


class BenchTrainer(Trainer):
    """train.py's Trainer, its step as is, on random batches: no data files, run directory or
    logger (the non-finite check, part of every step, is timed with it)."""

    def __init__(self, cfg: TrainConfig, dist: DistInfo) -> None:
        super().__init__(cfg, dist, batches=RandomBatches(cfg, dist.device))
        self.wrap()


class NanoGPTStep:
    """nanoGPT's train.py step (autocast forward, backward, clip 1.0, AdamW step) on its model.py."""

    def __init__(self, path: Path, cfg: TrainConfig, dist: DistInfo) -> None:
        spec = importlib.util.spec_from_file_location("nanogpt_model", path / "model.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        m = cfg.model
        shape = dict(n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, bias=m.bias)
        torch.manual_seed(0)
        conf = mod.GPTConfig(block_size=m.block_size, vocab_size=m.vocab_size, dropout=0.0, **shape)
        self.raw_model = mod.GPT(conf).to(dist.device)
        self.model = torch.compile(self.raw_model) if cfg.compile else self.raw_model
        self.optimizer = self.raw_model.configure_optimizers(
            0.1, 6e-4, (0.9, 0.95), dist.device.type
        )
        self.loader = RandomBatches(cfg, dist.device)
        self.dist, self.dtype = dist, resolve_dtype(cfg.dtype, dist.device)

    def train_step(self) -> None:
        x, y = self.loader.next_batch()
        with autocast(self.dist.device, self.dtype):
            _, loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def optimizer_variants(names: list[str], exact: bool) -> list[tuple[str, object]]:
    """(label, optimizer config) for each name, plus its exact mode where it has one."""
    out = []
    for name in names:
        cls = optim.get_spec(name).config_cls
        out.append((name, cls()))
        if exact and "mode" in {f.name for f in dataclasses.fields(cls)}:
            out.append((f"{name} exact", cls(mode="exact")))
    return out


class Memory:
    """Peak memory of a case: CUDA allocator peak, or on the CPU the peak RSS above a baseline."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.base = 0
        else:
            self.base = _proc_kib("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux)

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return (_proc_kib("VmHWM") - self.base) * 1024


def _proc_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def time_steps(trainer, steps: int, device: torch.device) -> float:
    """Best wall-clock seconds of ``steps`` training steps."""
    best = float("inf")
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--models", nargs="+", default=None, help="configs/model presets")
    ap.add_argument("--micro-batch", type=int, default=None, help="default: the papers' / 2")
    ap.add_argument("--seq-len", type=int, default=None, help="default: block_size / 128 on CPU")
    ap.add_argument("--optimizers", nargs="+", default=None, help="default: all registered")
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA) | float32 | bfloat16")
    ap.add_argument(
        "--loss-chunk-tokens", type=int, nargs="+", default=[TrainConfig.loss_chunk_tokens]
    )
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 10 / 3 on CPU)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed (default: 3 / 1 on CPU)")
    ap.add_argument("--rounds", type=int, default=None, help="CPU interleaving (default: 3)")
    ap.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout to compare")
    return ap.parse_args()


def train_config(args, model: str, opt_cfg, chunk: int, device: torch.device) -> TrainConfig:
    m = model_config(model)
    mb = args.micro_batch or paper_micro_batch(model)
    seq = args.seq_len or (m.block_size if device.type == "cuda" else min(128, m.block_size))
    compile_ = device.type == "cuda" if args.compile is None else args.compile
    return TrainConfig(model=m, optimizer=opt_cfg, micro_batch_size=mb, seq_len=seq,
                       batch_tokens=mb * seq, compile=compile_, dtype=args.dtype, device=str(device),
                       loss_chunk_tokens=chunk, max_steps=10**6,
                       activation_checkpointing=args.activation_checkpointing)  # fmt: skip


def build_cases(args, device: torch.device) -> list[dict]:
    models = args.models or (list(GPU_MODELS) if device.type == "cuda" else ["tiny"])
    opts = optimizer_variants(args.optimizers or optim.available(), args.exact)
    cases = []
    for model in models:
        for chunk in args.loss_chunk_tokens:
            for label, opt_cfg in opts:
                cfg = train_config(args, model, opt_cfg, chunk, device)
                cases.append(dict(model=model, chunk=chunk, opt=label, cfg=cfg))
            if args.nanogpt is not None:
                cfg = train_config(args, model, optim.AdamWConfig(), chunk, device)
                cases.append(dict(model=model, chunk=chunk, opt="nanoGPT adamw", cfg=cfg))
    for c in cases:  # model FLOPs per token (nanoGPT's model has the same shape)
        with torch.device("meta"):
            c["fpt"] = GPT(c["cfg"].model).flops_per_token(c["cfg"].sequence_length)
    return cases


def make_runner(case: dict, args, dist: DistInfo):
    if case["opt"].startswith("nanoGPT"):
        return NanoGPTStep(args.nanogpt, case["cfg"], dist)
    return BenchTrainer(case["cfg"], dist)


def run_case(case: dict, args, dist: DistInfo, keep: bool) -> None:
    """Build (or reuse) the case's trainer, warm up, time; fills tokens/s and peak memory."""
    if case.get("oom"):
        return
    try:
        if "runner" not in case:
            mem = Memory(dist.device)
            case["runner"] = make_runner(case, args, dist)
            for _ in range(args.warmup):
                case["runner"].train_step()
            best = time_steps(case["runner"], args.steps, dist.device)
            case["peak"] = mem.peak_bytes()  # the first round's: build, warm-up and timed steps
        else:
            best = time_steps(case["runner"], args.steps, dist.device)
    except torch.OutOfMemoryError:
        case["oom"], keep = True, False
    else:
        cfg = case["cfg"]
        tok_s = cfg.micro_batch_size * cfg.sequence_length / best
        case["tok_s"] = max(case.get("tok_s", 0.0), tok_s)
    if not keep:
        case.pop("runner", None)
        gc.collect()
        if dist.device.type == "cuda":
            torch.cuda.empty_cache()


def print_table(cases: list[dict], device: torch.device) -> None:
    peak = peak_flops(device)
    print(f"{'model':<12}{'chunk':>6} {'optimizer':<22}{'tokens/s':>12}{'MFU':>7}{'peak mem':>11}"
          f"{'vs adamw':>10}")  # fmt: skip
    for c in cases:
        if c.get("oom"):
            print(f"{c['model']:<12}{c['chunk']:>6} {c['opt']:<22}{'out of memory':>30}")
            continue
        base = next((b for b in cases if (b["model"], b["chunk"], b["opt"])
                     == (c["model"], c["chunk"], "adamw")), None)  # fmt: skip
        vs = f"{100 * (base['tok_s'] / c['tok_s'] - 1):+.1f}%" if base and "tok_s" in base else "-"
        mfu = f"{100 * c['fpt'] * c['tok_s'] / peak:.1f}%" if peak else "-"
        mem = f"{c['peak'] / 2**30:.2f} GiB"
        print(f"{c['model']:<12}{c['chunk']:>6} {c['opt']:<22}{c['tok_s']:>12,.0f}{mfu:>7}"
              f"{mem:>11}{vs:>10}")  # fmt: skip


def main() -> None:
    args = parse_args()
    device = pick_device(args.device, 0)
    cpu = device.type == "cpu"
    args.steps = args.steps or (3 if cpu else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else 3)
    args.rounds = args.rounds or (3 if cpu else 1)
    dist = DistInfo(0, 0, 1, device)
    configure_backends(device)  # as training: TF32 on CUDA, glibc's allocator tuned on the CPU
    cases = build_cases(args, device)
    name = torch.cuda.get_device_name(device) if not cpu else platform.processor()
    print(f"device: {device} ({name or platform.machine()}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, dtype {args.dtype}, compile {cases[0]['cfg'].compile}, "
          f"activation checkpointing {args.activation_checkpointing}")  # fmt: skip
    for c in cases[:1]:
        print(
            f"micro-batch {c['cfg'].micro_batch_size} x {c['cfg'].sequence_length} tokens, "
            f"best of {args.steps} steps x {args.rounds} rounds after {args.warmup} warm-up"
        )
    for _ in range(args.rounds):
        for case in cases:
            run_case(case, args, dist, keep=args.rounds > 1)
    print_table(cases, device)


if __name__ == "__main__":
    main()
