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
tuned allocator keeps freed memory) beside trainer.memory_model's estimate of the allocated peak,
each optimizer's slowdown against AdamW of the same model and settings, the first step's time
(with compile: the compile) and the case's graphs, graph breaks and recompilations. Every case
starts from ``torch._dynamo.reset()``: each compiles its own static graphs, as in its own process
(without it a second model size recompiles the model dynamic and the fused step's cache fills). With --nanogpt PATH (a nanoGPT checkout), nanoGPT's model.py GPT
and its training-loop step (AdamW, clip 1.0) run on the same model and batch, for comparison.
On the CPU the cases are interleaved over --rounds rounds (the machine's noise hits all alike).

``--out DIR`` writes one record per case the moment it is measured (bench/record.py
``measurement``, kind ``train``: the device's facts, the commit, the command, every timed step's
seconds, tokens/s, MFU, peak memory and the estimate, the compile counters); ``--processes N``
runs the whole benchmark N times, each in a process of its own (a compiled case's state differs
from process to process: compile, autotuning, the allocator), each writing its own records.
``--tf32/--no-tf32``: the float32 matmul precision (training's ``tf32`` key; the study's runs:
``--dtype float32 --no-tf32``). ``--muon-routing``: Muon's ``routing`` (the llama experiment's
``recommended``; the optimizer's default ``mars-repo`` otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import sys
from pathlib import Path

import torch

import optim
from bench.harness import (  # noqa: F401 (model_config, paper_micro_batch: bench's API here too)
    GPU_MODELS,
    best_time,
    compile_counters,
    device_line,
    model_config,
    optimizer_variants,
    paper_micro_batch,
    reset_compiled,
    time_call,
)
from data.loader import RandomBatches
from model import build_model
from runtime.attention import SDPA_BACKENDS, set_sdpa_backend
from runtime.device import autocast, configure_backends, peak_flops, resolve_dtype
from runtime.distributed import DistInfo, pick_device
from trainer.config import TrainConfig
from trainer.memory_model import estimate_memory
from trainer.trainer import Trainer


def random_batches(cfg: TrainConfig, device: torch.device) -> RandomBatches:
    """data.RandomBatches in place of the loader: micro-batches of the run's shape, token ids
    below min(vocab, 50257)."""
    return RandomBatches(cfg.micro_batch_size, cfg.sequence_length,
                         min(cfg.model.vocab_size, 50257), device=device)  # fmt: skip


class BenchTrainer(Trainer):
    """train.py's Trainer, its step as is, on random batches: no data files, run directory or
    logger (the non-finite check, part of every step, is timed with it)."""

    def __init__(self, cfg: TrainConfig, dist: DistInfo) -> None:
        super().__init__(cfg, dist, batches=random_batches(cfg, dist.device))
        self.wrap()


class NanoGPTStep:
    """nanoGPT's train.py step (autocast forward, backward, clip 1.0, AdamW step) on its model.py."""

    def __init__(self, path: Path, cfg: TrainConfig, dist: DistInfo) -> None:
        spec = importlib.util.spec_from_file_location("nanogpt_model", path / "model.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        set_sdpa_backend("torch")  # nanoGPT in a fresh process: torch's own attention kernels
        m = cfg.model
        shape = dict(n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, bias=m.bias)
        torch.manual_seed(0)
        conf = mod.GPTConfig(block_size=m.block_size, vocab_size=m.vocab_size, dropout=0.0, **shape)
        self.raw_model = mod.GPT(conf).to(dist.device)
        self.model = torch.compile(self.raw_model) if cfg.compile else self.raw_model
        self.optimizer = self.raw_model.configure_optimizers(
            0.1, 6e-4, (0.9, 0.95), dist.device.type
        )
        self.loader = random_batches(cfg, dist.device)
        self.dist, self.dtype = dist, resolve_dtype(cfg.dtype, dist.device)

    def train_step(self) -> None:
        x, y = self.loader.next_batch()
        with autocast(self.dist.device, self.dtype):
            _, loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


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


def break_reasons() -> list[tuple[str, int]]:
    """Dynamo's graph-break reasons since the last reset, most frequent first."""
    from torch._dynamo.utils import counters

    return sorted(counters["graph_break"].items(), key=lambda kv: -kv[1])


def time_steps(trainer, steps: int, device: torch.device) -> list[float]:
    """Wall-clock seconds of each of ``steps`` training steps (the best is the figure)."""
    return [time_call(trainer.train_step, device) for _ in range(steps)]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--models", nargs="+", default=None, help="configs/model presets")
    ap.add_argument("--micro-batch", type=int, default=None, help="default: the papers' / 2")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches per optimizer step (4: the papers' GPT-2 small/medium "
                         "on 8 GPUs, 12: large/XL)")  # fmt: skip
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
    ap.add_argument("--out", type=Path, default=None, help="a directory: one record per case")
    ap.add_argument("--process", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run the benchmark this many times, each in its own process",
    )
    ap.add_argument(
        "--tf32",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TF32 float32 matmuls on CUDA (training's tf32 key)",
    )
    ap.add_argument(
        "--muon-routing",
        default=None,
        choices=["mars-repo", "recommended"],
        help="Muon's routing (the llama experiment: recommended)",
    )
    ap.add_argument(
        "--sdpa-backend",
        choices=SDPA_BACKENDS,
        default="auto",
        help="training's sdpa_backend (runtime/attention.py): auto measures the kernels at the "
        "case's shapes and keeps the fastest that agrees; torch: torch's own order; a name: "
        "only that kernel (CUDA)",
    )
    return ap.parse_args()


def train_config(args, model: str, opt_cfg, chunk: int, device: torch.device) -> TrainConfig:
    m = model_config(model)
    mb = args.micro_batch or paper_micro_batch(model)
    seq = args.seq_len or (m.block_size if device.type == "cuda" else min(128, m.block_size))
    compile_ = device.type == "cuda" if args.compile is None else args.compile
    sdpa = getattr(args, "sdpa_backend", "auto")  # training's default where args has none
    return TrainConfig(model=m, optimizer=opt_cfg, micro_batch_size=mb, seq_len=seq,
                       batch_tokens=mb * seq * args.accum, compile=compile_, dtype=args.dtype,
                       device=str(device), loss_chunk_tokens=chunk, max_steps=10**6,
                       sdpa_backend=sdpa, tf32=getattr(args, "tf32", True),
                       activation_checkpointing=args.activation_checkpointing)  # fmt: skip


def build_cases(args, device: torch.device) -> list[dict]:
    models = args.models or (list(GPU_MODELS) if device.type == "cuda" else ["tiny"])
    opts = optimizer_variants(args.optimizers or optim.available(), args.exact)
    cases = []
    routing = getattr(args, "muon_routing", None)
    if routing:  # Muon's (and its family's) routing as an experiment sets it
        opts = [(label, dataclasses.replace(c, routing=routing) if hasattr(c, "routing") else c)
                for label, c in opts]  # fmt: skip
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
            c["fpt"] = build_model(c["cfg"].model).flops_per_token(c["cfg"].sequence_length)
    return cases


def make_runner(case: dict, args, dist: DistInfo):
    if case["opt"].startswith("nanoGPT"):
        return NanoGPTStep(args.nanogpt, case["cfg"], dist)
    return BenchTrainer(case["cfg"], dist)


def run_case(case: dict, args, dist: DistInfo, keep: bool) -> None:
    """Build (or reuse) the case's trainer, warm up, time; fills tokens/s, peak memory, the
    compile time (the first step) and the compile counters. Each build starts from
    ``reset_compiled``: every measurement compiles its own graphs, as a fresh process would."""
    if case.get("oom"):
        return
    try:
        if "runner" not in case:
            reset_compiled()
            mem = Memory(dist.device)
            case["runner"] = make_runner(case, args, dist)
            case["sdpa"] = getattr(case["runner"], "sdpa", None)  # the kernel chosen (training)
            first = case["runner"].train_step
            case["first_step_s"] = time_call(first, dist.device) if args.warmup else None
            for _ in range(args.warmup - 1):
                case["runner"].train_step()
            times = time_steps(case["runner"], args.steps, dist.device)
            case["peak"] = mem.peak_bytes()  # the first round's: build, warm-up and timed steps
            case["counters"] = compile_counters()
            case["break_reasons"] = break_reasons()
        else:
            times = time_steps(case["runner"], args.steps, dist.device)
    except torch.OutOfMemoryError:
        case["oom"], keep = True, False
    else:
        cfg = case["cfg"]
        tok_s = cfg.batch_tokens / min(times)  # every micro-batch of the step
        case["tok_s"] = max(case.get("tok_s", 0.0), tok_s)
        case.setdefault("step_s", []).append(times)  # each round's timed steps
    if not keep:
        case.pop("runner", None)
        gc.collect()
        if dist.device.type == "cuda":
            torch.cuda.empty_cache()


def estimate_bytes(case: dict, device: torch.device) -> int:
    """trainer.memory_model's allocated peak for the case (one process: no DDP buckets)."""
    from trainer.memory_plan import meta_state_bytes

    cfg = case["cfg"]
    state, _ = meta_state_bytes(cfg.model, cfg.optimizer)
    low = cfg.dtype in ("bfloat16", "float16") or (cfg.dtype == "auto" and device.type == "cuda")
    est = estimate_memory(cfg.model, state_bytes=state, micro_batch=cfg.micro_batch_size,
                          seq_len=cfg.sequence_length, loss_chunk_tokens=cfg.loss_chunk_tokens,
                          activation_checkpointing=cfg.activation_checkpointing,
                          low_precision=low, cuda=device.type == "cuda")  # fmt: skip
    return est.allocated


HEADER = (f"{'model':<12}{'chunk':>6} {'optimizer':<22}{'tokens/s':>12}{'MFU':>7}{'peak mem':>11}"
          f"{'estimate':>10}{'vs adamw':>10}{'1st step':>10}  graphs/breaks/recompiles")  # fmt: skip


def table_row(c: dict, cases: list[dict], device: torch.device) -> str:
    """One case's row: tokens/s, MFU, the peak against trainer.memory_model's estimate, the first
    step (the compile, with --compile), and the case's graphs / graph breaks / recompilations."""
    if c.get("oom"):
        return f"{c['model']:<12}{c['chunk']:>6} {c['opt']:<22}{'out of memory':>30}"
    peak = peak_flops(device)
    base = next((b for b in cases if (b["model"], b["chunk"], b["opt"])
                 == (c["model"], c["chunk"], "adamw")), None)  # fmt: skip
    vs = f"{100 * (base['tok_s'] / c['tok_s'] - 1):+.1f}%" if base and "tok_s" in base else "-"
    mfu = f"{100 * c['fpt'] * c['tok_s'] / peak:.1f}%" if peak else "-"
    mem = f"{c['peak'] / 2**30:.2f} GiB"
    est = f"{c['estimate'] / 2**30:.2f}" if c.get("estimate") else "-"
    first = f"{c['first_step_s']:.1f} s" if c.get("first_step_s") is not None else "-"
    n = c.get("counters", {})
    counts = f"{n.get('graphs', 0)}/{n.get('graph_breaks', 0)}/{n.get('recompiles', 0)}"
    return (f"{c['model']:<12}{c['chunk']:>6} {c['opt']:<22}{c['tok_s']:>12,.0f}{mfu:>7}"
            f"{mem:>11}{est:>10}{vs:>10}{first:>10}  {counts}")  # fmt: skip


def print_table(cases: list[dict], device: torch.device) -> None:
    print(HEADER)
    for c in cases:
        print(table_row(c, cases, device), flush=True)


def keep(case: dict, args, device: torch.device, path: Path | None = None) -> Path:
    """The case's record (bench/record.py ``measurement``, kind ``train``), written now."""
    from bench import record

    cfg, peak = case["cfg"], peak_flops(device)
    fields = dict(model=case["model"], optimizer=case["opt"],
                  routing=getattr(cfg.optimizer, "routing", None),
                  micro_batch=cfg.micro_batch_size, seq_len=cfg.sequence_length,
                  accum=args.accum, batch_tokens=cfg.batch_tokens, dtype=cfg.dtype,
                  tf32=cfg.tf32 if device.type == "cuda" else None, compile=cfg.compile,
                  loss_chunk_tokens=case["chunk"], sdpa=case.get("sdpa"),
                  warmup=args.warmup, steps=args.steps, oom=bool(case.get("oom")),
                  tok_s=case.get("tok_s"), step_s=case.get("step_s"),
                  mfu=(case["fpt"] * case["tok_s"] / peak) if peak and case.get("tok_s") else None,
                  peak_bytes=case.get("peak"), estimate_bytes=case.get("estimate"),
                  first_step_s=case.get("first_step_s"), counters=case.get("counters"),
                  process=args.process)  # fmt: skip
    rounds = [cfg.batch_tokens / min(t) for t in case.get("step_s", [])]
    path = record.measurement(path or args.out, "train", device, rounds=rounds, unit="tokens/s",
                              **fields)  # fmt: skip
    print(f"    record: {path}", flush=True)
    return path


def main() -> None:
    args = parse_args()
    if args.processes > 1:  # each in a process of its own (compile state differs by process)
        from bench.record import in_processes

        raise SystemExit(in_processes("bench.train", sys.argv[1:], args.processes))
    device = pick_device(args.device, 0)
    cpu = device.type == "cpu"
    args.steps = args.steps or (3 if cpu else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else 3)
    args.rounds = args.rounds or (3 if cpu else 1)
    dist = DistInfo(0, 0, 1, device)
    configure_backends(device, tf32=args.tf32)  # as training: its tf32, the CPU's allocator
    cases = build_cases(args, device)
    if cases[0]["cfg"].compile:
        args.rounds = 1  # each case compiles after a reset: a kept case would recompile
    for c in cases:
        c["estimate"] = estimate_bytes(c, device) if not c["opt"].startswith("nanoGPT") else None
    print(f"{device_line(device)}, dtype {args.dtype}, compile {cases[0]['cfg'].compile}, "
          f"activation checkpointing {args.activation_checkpointing}, "
          f"SDPA {args.sdpa_backend}")  # fmt: skip
    for c in cases[:1]:
        print(
            f"micro-batch {c['cfg'].micro_batch_size} x {c['cfg'].sequence_length} tokens "
            f"x {args.accum} per optimizer step, "
            f"best of {args.steps} steps x {args.rounds} rounds after {args.warmup} warm-up"
        )
    if args.rounds == 1:  # each row the moment it is measured: a run cut short keeps its rows
        print(HEADER, flush=True)
        for case in cases:
            run_case(case, args, dist, keep=False)
            print(table_row(case, cases, device), flush=True)
            if args.out is not None:
                keep(case, args, device)
            if (sdpa := case.get("sdpa")) and "ms" in sdpa:  # chosen by measurement: which, why
                print(f"    attention kernel {sdpa['choice']}: forward + backward ms "
                      f"{sdpa['ms']}, error against float32 {sdpa['errors']}")  # fmt: skip
            for reason, n in case.get("break_reasons", [])[:3]:
                print(f"    graph break x{n}: {reason[:200]}")
        return
    for _ in range(args.rounds):
        for case in cases:
            run_case(case, args, dist, keep=True)
            if args.out is not None:  # rewritten round by round: a cut-off run keeps its rounds
                case["record"] = keep(case, args, device, case.get("record"))
    print_table(cases, device)


if __name__ == "__main__":
    main()
