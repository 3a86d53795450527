"""What the GPU check measures (bench/gpu_check.py runs it): each step's command, what it
measures and its time limit; the plain check's steps (``steps``) and the 15-minute one's
(``quarter_steps``), and the micro-batches the launcher would pick for them."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

FAMILIES = [
    "adamw",
    "mars-adamw",
    "muon",
    "mars-m",
    "lion",
    "mars-lion",
    "mars-shampoo",
    "moonlight",
]  # fmt: skip  (most asked-about first)
HOST_SYNC = ("tests/test_gpu_train.py::"
             "test_train_step_with_the_device_decision_makes_no_host_sync")  # fmt: skip
QUARTER_BLOCKS = (4096, 2048, 1024)  # the engine's candidate block sizes (bench/occupancy.py)


@dataclass
class Step:
    name: str
    what: str
    argv: list[str]
    limit_s: float
    junit: Path | None = None  # pytest's outcomes, turned into gpu-tests.jsonl lines


def quarter_steps(memory_gib: float, records: Path, cpu: bool = False) -> list[Step]:
    """The 15-minute check (``--plan quarter``, module docstring), most needed first; ``cpu``:
    the same steps, tiny, on the CPU (no crossover: a CPU's is the study's own)."""
    py, dev = [sys.executable], "cpu" if cpu else "cuda"
    rec = str(records)
    pytest = [*py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfEs"]
    out = [
        Step("host-sync", "the MARS-AdamW train step's host-sync test (failed on the H100)",
             [*pytest, HOST_SYNC, "--junitxml", f"{rec}/host-sync.xml"], 45,
             records / "host-sync.xml"),
        Step("gpu-tests", "every other GPU test",
             [*pytest, *(["tests/test_gpu.py"] if cpu else ["tests"]), "--deselect",
              HOST_SYNC, "--junitxml", f"{rec}/gpu-tests.xml"], 120, records / "gpu-tests.xml"),
    ]  # fmt: skip
    model = "proxy-100k" if cpu else "gpt2-small"
    size = ["--rounds", "1", "--steps", "1", "--processes", "1"] if cpu else [
        "--rounds", "3", "--steps", "5", "--processes", "3"]  # fmt: skip
    for block in QUARTER_BLOCKS:
        out.append(Step(f"optim-{block}", f"{model}'s optimizer step, engine block {block}: "
                        "torch AdamW vs MARS-AdamW, wall and kernel time, three processes",
                        [*py, "-m", "bench.optim_fused", "--device", dev, "--model", model,
                         "--only", *(["mars-adamw"] if cpu else ["adamw", "mars-adamw"]),
                         "--paths", "engine", *([] if cpu else ["--kernels"]), "--clip", "1.0",
                         *size, "--block", str(block), "--out", rec], 70))  # fmt: skip
    if cpu:
        llama, mb, accum, seq = "llama-tiny", 1, 1, ["--seq-len", "32"]
    else:
        llama, seq = "llama-124m", []
        mb, accum = experiment_batch("llama/124m-adamw")
    steps = ["--steps", "1", "--warmup", "1"] if cpu else ["--steps", "5", "--warmup", "2"]
    out.append(Step("llama", f"{llama} at the llama experiment's tokens a step ({mb} x {accum}), "
                    "AdamW, MARS-AdamW, Muon (routing recommended)",
                    [*py, "-m", "bench.train", "--device", dev, "--models", llama,
                     "--micro-batch", str(mb), "--accum", str(accum), *seq, "--no-exact",
                     "--optimizers", "adamw", "mars-adamw", "muon", "--muon-routing",
                     "recommended", *steps, "--out", rec], 170))  # fmt: skip
    if not cpu:
        limit = 200
        out.append(
            Step(
                "crossover-b131072-fp32",
                "the crossover's 131,072-byte cell, float32, TF32 off (the study's tf32: false)",
                [
                    "env",
                    f"OUT={rec}/crossover",
                    "bash",
                    "scripts/gpu_crossover.sh",
                    "--parts",
                    "b131072-fp32",
                    "--limit",
                    str(limit - 30),
                ],
                limit,
            )
        )
    return out


def launcher_micro_batch(experiment: str, memory_gib: float, gpus: int = 8) -> tuple[int, int]:
    """(micro-batch, gradient accumulation) that scripts/launch.py picks for ``experiment`` on
    ``gpus`` GPUs of ``memory_gib``: the largest divisor of the per-rank sequences that the
    launcher's own estimate (trainer.memory_plan.experiment_estimator: the Trainer's DDP
    settings) fits, so the check measures what a paper run would run."""
    from runtime.config_files import load_config
    from trainer.memory_model import fitting_micro_batch
    from trainer.memory_plan import experiment_estimator

    cfg = load_config(f"experiment/{experiment}")
    per_rank = cfg["batch_tokens"] // (cfg.get("seq_len") or cfg["model"]["block_size"]) // gpus
    divisors = [d for d in range(1, per_rank + 1) if per_rank % d == 0]
    b = fitting_micro_batch(divisors, memory_gib, experiment_estimator([experiment], gpus)) or 1
    return b, per_rank // b


def experiment_batch(experiment: str, gpus: int = 1) -> tuple[int, int]:
    """(micro-batch, gradient accumulation) of ``experiment`` as it sets them on ``gpus`` GPUs:
    its micro_batch_size, and the accumulation that makes its batch_tokens a step."""
    from runtime.config_files import load_config

    cfg = load_config(f"experiment/{experiment}")
    per_rank = cfg["batch_tokens"] // (cfg.get("seq_len") or cfg["model"]["block_size"]) // gpus
    mb = cfg["micro_batch_size"]
    return mb, per_rank // mb


def xl_micro_batch(memory_gib: float) -> int:
    """The micro-batch the launcher picks for XL with MARS-AdamW on 8 GPUs of ``memory_gib``."""
    return launcher_micro_batch("fineweb-edu/xl-mars-adamw", memory_gib)[0]


def steps(memory_gib: float, cpu: bool = False, nanogpt: Path | None = None) -> list[Step]:
    """Every step, most valuable first; ``cpu``: the same steps, tiny, on the CPU; ``nanogpt``:
    a nanoGPT checkout for the side-by-side steps (``nanogpt_steps``)."""
    py, dev = [sys.executable], "cpu" if cpu else "cuda"
    small, big = ("tiny", "tiny") if cpu else ("gpt2-small", "gpt2-xl")
    # the papers' per-GPU step on 8 GPUs: small at its micro-batch 15 with 4 micro-batches per
    # optimizer step (480 sequences); XL at the launcher's micro-batch for this GPU's memory
    xl, xl_accum = (1, 1) if cpu else launcher_micro_batch("fineweb-edu/xl-mars-adamw", memory_gib)
    accum = ["--accum", "1" if cpu else "4"]
    short = (
        ["--steps", "1", "--warmup", "1", "--rounds", "1"]
        if cpu
        else ["--steps", "5", "--warmup", "2"]
    )
    train = [*py, "-m", "bench.train", "--device", dev, *short]
    tests = ["tests/test_gpu.py"] if cpu else ["tests"]
    out = [Step("gpu-tests", "pytest -m gpu", [*py, "-m", "pytest", "-q", "-m", "gpu", *tests],
                130)]  # fmt: skip
    out.append(engine_step(py, dev, small, cpu))
    out += nanogpt_steps(train, nanogpt, small, cpu) if nanogpt else []
    out += [] if cpu else sdpa_steps(train, small)
    for i, name in enumerate(FAMILIES):  # the first compiles the model; the others hit its cache
        lim = 75 if i == 0 else 100 if name == "mars-adamw" else 60
        out.append(Step(f"small-{name}", f"{small}, {name}", [*train, "--models", small,
                        *accum, "--no-exact", "--optimizers", name], lim))  # fmt: skip
    for name in ("adamw", "mars-adamw"):
        out.append(Step(f"xl-{name}", f"{big} at micro-batch {xl} x {xl_accum}, {name}",
                        [*train, "--models", big, "--no-exact", "--optimizers", name,
                         "--micro-batch", str(xl), "--accum", str(xl_accum)], 110))  # fmt: skip
    opt_dev = ["--device", dev, "--model", small]
    out += [
        Step("exact", f"{small}, MARS-AdamW approx and exact: exact mode's cost",
             [*train, "--models", small, *accum, "--exact", "--optimizers", "mars-adamw"], 90),
        Step("xl-estimate", "the XL estimate part by part",
             [*py, "-m", "bench.memory", "--parts", "--models", big, "--optimizers", "adamw",
              "mars-adamw", "--micro-batch", str(xl)], 20),
        Step("llama", f"{'llama-tiny' if cpu else 'llama-124m'} at micro-batch 12: AdamW, "
             "MARS-AdamW, Muon (targets: MARS-AdamW within 3%, Muon within 15% of AdamW)",
             [*train, "--models", "llama-tiny" if cpu else "llama-124m", "--micro-batch",
              "1" if cpu else "12", "--accum", "1", "--no-exact", "--optimizers", "adamw",
              "mars-adamw", "muon"], 150),
        *train_run_steps(py, dev, cpu),
        Step("optim-fused", "optimizer steps vs fused AdamW, copy bandwidth",
             [*py, "-m", "bench.optim_fused", *opt_dev, "--only", "adamw", "mars-adamw",
              "mars-lion", "lion", "--paths", "foreach", "compiled", "--rounds",
              "1" if cpu else "3"], 80),
        Step("newton-schulz", "Newton-Schulz's share of a MARS-M step",
             [*py, "-m", "bench.newton_schulz", "--device", dev, "--model", small,
              *(["--layers", "1"] if cpu else [])], 45),
        Step("checkpoint", "the checkpoint stall",
             [*py, "-m", "bench.checkpoint", *opt_dev, "--saves", "1" if cpu else "2"], 45),
        Step("graphs", "graphs per block of the Trainer's compiled DDP layout",
             [*py, "-m", "bench.graphs", "--model", small], 40),
        Step("nonfinite", "the non-finite check decided on the host vs on the device",
             [*py, "-m", "bench.nonfinite", *opt_dev, "--micro-batch", "8", "--optimizer",
              "mars-adamw", "--rounds", "1" if cpu else "3"], 50),
        Step("nonfinite-muon", "the same for Muon (device: steps on copies, optim/masked.py)",
             [*py, "-m", "bench.nonfinite", *opt_dev, "--micro-batch", "8", "--optimizer",
              "muon", "--rounds", "1" if cpu else "3"], 50),
    ]  # fmt: skip
    return out


def engine_step(py: list[str], dev: str, small: str, cpu: bool) -> Step:
    """The optimizer engine (optim/engine/) per family against torch's fused AdamW: ms per step,
    share of the copy bandwidth, GPU kernels per step, each step with the trainer's global clip
    (folded into the engine where it can: optim/engine/clip.py). Targets: MARS-AdamW at most
    1.5x fused AdamW and 70% of the copy bandwidth; at most 10 kernels for an element-wise
    optimizer. On the CPU: one family on a small-vocabulary model (Triton's interpreter is
    slow)."""
    if cpu:
        argv = [*py, "-m", "bench.optim_fused", "--device", "cpu", "--model", "proxy-100k",
                "--only", "mars-adamw", "--paths", "foreach", "engine", "--rounds", "1",
                "--steps", "1"]  # fmt: skip
    else:
        argv = [*py, "-m", "bench.optim_fused", "--device", dev, "--model", small, "--only",
                "adamw", "mars-adamw", "mars-adamw-exact", "mars-lion", "lion", "ademamix",
                "adamw-schedulefree", "muon", "mars-m", "--paths", "foreach", "engine",
                "--kernels", "--rounds", "3", "--clip", "1.0"]  # fmt: skip
    return Step("optim-engine", "the optimizer engine per family vs fused AdamW", argv, 120)


def nanogpt_steps(train: list[str], nanogpt: Path, small: str, cpu: bool) -> list[Step]:
    """nanoGPT's model.py and step beside ours in one process (``bench.train --nanogpt``), at
    micro-batch 12 and 32 (target: at least 1.10x nanoGPT's tokens/s, MFU at least 50% at 32)."""
    out = []
    for mb, opts in (("12", ["adamw", "mars-adamw"]), ("32", ["adamw"])):
        out.append(Step(f"nanogpt-{mb}", f"{small} at micro-batch {mb} beside nanoGPT",
                        [*train, "--models", small, "--micro-batch", "1" if cpu else mb,
                         "--accum", "1", "--no-exact", "--optimizers", *opts, "--nanogpt",
                         str(nanogpt)], 150))  # fmt: skip
    return out


def sdpa_steps(train: list[str], small: str) -> list[Step]:
    """GPT-2 small with only the flash, then only the cuDNN attention kernel (which to choose:
    cuDNN where it is faster and equal within bf16 noise)."""
    return [Step(f"sdpa-{backend}", f"{small} at micro-batch 12, AdamW, SDPA {backend}",
                 [*train, "--models", small, "--micro-batch", "12", "--accum", "1", "--no-exact",
                  "--optimizers", "adamw", "--sdpa-backend", backend], 75)
            for backend in ("flash", "cudnn")]  # fmt: skip


def train_run_steps(py: list[str], dev: str, cpu: bool) -> list[Step]:
    """train.py itself (bench.train_run): llama-124m compiled for 300 steps with MARS-AdamW and
    Muon (the loss falls, nothing recompiles), then ``parallel=fsdp`` under torchrun, resumed
    from its DCP checkpoint (one GPU: one rank, the path and not the sharding)."""
    out = Path(tempfile.gettempdir()) / f"train_run-{os.getpid()}"  # fresh for every check
    size = (["--micro-batch", "2", "--accum", "1", "--seq-len", "32", "--eval-tokens", "256"]
            if cpu else [])  # fmt: skip
    runs = [*py, "-m", "bench.train_run", "--device", dev, "--out", str(out), *size]
    llama = ["llama-cpu/tiny-mars-adamw", "llama-cpu/tiny-muon"] if cpu else [
        "llama/124m-mars-adamw", "llama/124m-muon"]  # fmt: skip
    return [
        Step("llama-train", "llama-124m trained with compile, MARS-AdamW and Muon: the loss "
             "falls, no recompiles", [*runs, "--steps", "6" if cpu else "300", "--experiments",
                                      *llama], 240),
        Step("fsdp", "parallel=fsdp under torchrun on one GPU, stopped and resumed from DCP",
             [*runs, "--steps", "4" if cpu else "60", "--fsdp", "--no-compile", "--experiments", llama[0]], 120),
    ]  # fmt: skip
