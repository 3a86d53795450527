"""The paper experiments (configs/experiment/owt/, configs/experiment/fineweb-edu/) against the
official AGI-Arena/MARS runs (commit 4831e28; docs/reproduction.md). The expected numbers are
written out here from the official configs and scripts, independently of the YAML files, and
every experiment is composed and typed exactly as train.py does it. Composition only: no training.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import NamedTuple

import pytest
from omegaconf import OmegaConf

from helpers import CONFIG_DIR, ROOT, compose_config
from trainer import command_line

EXPERIMENT_DIR = CONFIG_DIR / "experiment"
DATASETS = {"owt": "openwebtext", "fineweb-edu": "fineweb-edu-100b"}  # folder -> data config
SCRIPT_GPUS = 8  # every official launch script: torchrun --nproc_per_node=8
SEQ_LEN = 1024

MODEL = {  # size -> (n_layer, n_head, n_embd)
    "small": (12, 12, 768),
    "medium": (24, 16, 1024),
    "large": (36, 20, 1280),
    "xl": (48, 25, 1600),
}


class Row(NamedTuple):
    """One official run, in the official names: its config file and its launch script."""

    lr: float  # learning_rate
    lr2: float | None  # lr_1d (MARS) or muon_learning_rate (Muon)
    wd: float  # weight_decay (Muon's muon_weight_decay is 0 in every config)
    b1: float  # beta1 (MARS-M and Moonlight: the momentum)
    b2: float  # beta2 (unused by MARS-M and Moonlight)
    gamma: float | None
    min_lr: float
    bs: int  # the script's --batch_size (per GPU)
    accum: int  # the script's --gradient_accumulation_steps (per rank, losses summed)


# (size, optimizer) -> the official run's numbers (config/*.py, MARS_M/config/*.py, scripts/*.sh).
OFFICIAL = {
    ("small", "adamw"): Row(6e-4, None, 0.1, 0.9, 0.95, None, 3e-5, 15, 4),
    ("medium", "adamw"): Row(3e-4, None, 0.1, 0.9, 0.95, None, 6e-5, 15, 4),
    ("large", "adamw"): Row(2e-4, None, 0.1, 0.9, 0.95, None, 1e-5, 5, 12),
    ("xl", "adamw"): Row(2e-4, None, 0.1, 0.9, 0.95, None, 1e-5, 5, 12),
    ("small", "mars-adamw"): Row(6e-3, 3e-3, 0.01, 0.95, 0.99, 0.025, 3e-5, 15, 4),
    ("medium", "mars-adamw"): Row(3e-3, 1.5e-3, 0.01, 0.95, 0.99, 0.025, 6e-5, 15, 4),
    ("large", "mars-adamw"): Row(2e-3, 1e-3, 0.01, 0.95, 0.99, 0.025, 1e-5, 5, 12),
    ("xl", "mars-adamw"): Row(2e-3, 1e-3, 0.01, 0.95, 0.99, 0.025, 1e-5, 5, 12),
    ("small", "mars-adamw-exact"): Row(6e-3, 3e-3, 0.01, 0.95, 0.99, 0.025, 3e-5, 15, 4),
    ("small", "muon"): Row(3e-3, 2e-2, 0.1, 0.9, 0.95, None, 3e-5, 15, 4),
    ("medium", "muon"): Row(1.5e-3, 1e-2, 0.1, 0.9, 0.95, None, 6e-5, 15, 4),
    ("large", "muon"): Row(1e-3, 6.67e-3, 0.1, 0.9, 0.95, None, 1e-5, 5, 12),
    # MARS-M: weight decay 1e-2 in the configs (README 1e-1); small FineWeb-Edu runs the small
    # config's 6e-3 (README 1e-2), as Moonlight does.
    ("small", "mars-m"): Row(6e-3, None, 0.01, 0.95, 0.99, 0.025, 3e-5, 15, 4),
    ("medium", "mars-m"): Row(5e-3, None, 0.01, 0.95, 0.99, 0.025, 6e-5, 15, 4),
    ("large", "mars-m"): Row(5e-3, None, 0.01, 0.95, 0.99, 0.025, 1e-5, 5, 12),
    ("xl", "mars-m"): Row(3e-3, None, 0.01, 0.95, 0.99, 0.025, 1e-5, 5, 12),
    ("small", "moonlight"): Row(6e-3, None, 0.1, 0.95, 0.99, None, 3e-5, 15, 4),
    ("medium", "moonlight"): Row(5e-3, None, 0.1, 0.95, 0.99, None, 6e-5, 15, 4),
    ("large", "moonlight"): Row(5e-3, None, 0.1, 0.95, 0.99, None, 1e-5, 5, 12),
    ("xl", "moonlight"): Row(3e-3, None, 0.1, 0.95, 0.99, None, 1e-5, 5, 12),
}
REGISTERED_NAME = {"mars-adamw-exact": "mars-adamw"}  # the exact row is MARS-AdamW, mode exact


def optimizer_values(opt: str, r: Row) -> dict:
    """Our optimizer fields for an official run: its row plus the official scripts' and
    optimizers' fixed values (train_*.py defaults, optimizers/*.py defaults)."""
    if opt == "adamw":  # torch.optim.AdamW through MARS/model.py
        return dict(
            lr=r.lr, betas=[r.b1, r.b2], eps=1e-8, weight_decay=r.wd, decay_kinds=["matrix"]
        )
    if opt in ("mars-adamw", "mars-adamw-exact"):
        return dict(
            mode="exact" if opt.endswith("exact") else "approx",
            lr=r.lr,
            lr_1d=r.lr2,
            betas=[r.b1, r.b2],
            eps=1e-8,
            weight_decay=r.wd,
            decay_kinds=["matrix"],
            gamma=r.gamma,
            amsgrad=False,
            optimize_1d=False,
            betas_1d=[0.9, 0.95],
            weight_decay_1d=0.1,
            clip="tensor",
            second_moment="c",
            first_step="zero",
        )
    if opt == "muon":  # Muon on the 2-D tensors, the custom AdamW on the rest
        return dict(
            routing="mars-repo",
            lr=r.lr2,
            weight_decay=0.0,
            momentum=0.95,
            nesterov=True,
            ns_steps=5,
            ns_dtype="bfloat16",
            adamw_lr=r.lr,
            adamw_betas=[r.b1, r.b2],
            adamw_eps=1e-8,
            adamw_weight_decay=r.wd,
            adamw_decay_bias_corrected=True,
        )
    # MARS-M and Moonlight: one lr and wd for both parts, momentum = beta1, AdamW betas_1d
    common = dict(
        lr=r.lr,
        weight_decay=r.wd,
        momentum=r.b1,
        ns_steps=5,
        ns_dtype="bfloat16",
        adamw_betas=[0.9, 0.95],
        adamw_eps=1e-8,
    )
    if opt == "mars-m":
        return dict(
            common, mode="approx", nesterov=False, gamma=r.gamma, clip="tensor", first_step="zero"
        )
    assert opt == "moonlight", opt
    return dict(common, nesterov=True)


# The published runs: which (size, optimizer) each dataset has.
RUNS = {
    "owt": [
        (size, opt)
        for size in ("small", "medium", "large")
        for opt in ("adamw", "muon", "mars-adamw", "mars-m", "moonlight")
    ]
    + [("small", "mars-adamw-exact")],
    "fineweb-edu": [
        (size, opt)
        for size in ("small", "xl")
        for opt in ("adamw", "mars-adamw", "mars-m", "moonlight")
    ],
}
EXPECTED = {
    f"{data}/{size}-{opt}": (data, size, opt) for data, runs in RUNS.items() for size, opt in runs
}


def found_experiments() -> list[str]:
    """Every experiment file under the paper folders, as its selector (e.g. owt/small-adamw)."""
    return sorted(
        p.relative_to(EXPERIMENT_DIR).with_suffix("").as_posix()
        for data in DATASETS
        for p in (EXPERIMENT_DIR / data).rglob("*.yaml")
    )


FOUND = found_experiments()


def expected(name: str) -> tuple[str, str, str]:
    if name not in EXPECTED:
        pytest.fail(f"{name}: not one of the published runs ({sorted(EXPECTED)})")
    return EXPECTED[name]


def assert_value(actual, want, what: str) -> None:
    if isinstance(want, float):
        assert actual == pytest.approx(want, rel=1e-12), what
    elif isinstance(want, list) and all(isinstance(v, float) for v in want):
        assert list(actual) == pytest.approx(want, rel=1e-12), what
    elif isinstance(want, list):
        assert list(actual) == want, what
    else:
        assert actual == want, what


def test_the_published_runs_are_exactly_the_experiment_files():
    assert len(EXPECTED) == 24
    missing = sorted(set(EXPECTED) - set(FOUND))
    extra = sorted(set(FOUND) - set(EXPECTED))
    assert not missing and not extra, f"missing: {missing}; not a published run: {extra}"


@pytest.mark.parametrize("name", FOUND)
def test_experiment_pins_the_official_run(name):
    data, size, opt = expected(name)
    row = OFFICIAL[(size, opt)]
    typed, plain = command_line.to_typed(compose_config(f"experiment={name}"))

    assert typed.name == name == plain["name"]
    m = typed.model
    assert m.name == f"gpt2-{size}"
    assert (m.n_layer, m.n_head, m.n_embd) == MODEL[size]
    assert (m.block_size, m.vocab_size, m.bias, m.dropout) == (SEQ_LEN, 50304, False, 0.0)
    assert m.scale_attn_by_inverse_layer_idx is True
    assert typed.sequence_length == SEQ_LEN

    assert typed.data.name == DATASETS[data]
    assert typed.data.sampling == "random"
    assert typed.wandb.group == data

    assert typed.max_steps == 100_000
    assert typed.batch_tokens == 491_520 == 480 * SEQ_LEN
    assert typed.micro_batch_size == row.bs
    assert row.bs * row.accum * SCRIPT_GPUS == 480
    assert typed.grad_scale == row.accum
    assert typed.grad_clip == 1.0
    sched = typed.schedule
    assert (sched.name, sched.warmup_steps, sched.decay_steps) == ("cosine", 2000, None)
    assert sched.min_lr == pytest.approx(row.min_lr, rel=1e-12)
    assert typed.eval_every == 1000
    assert typed.eval_tokens == 200 * row.bs * SEQ_LEN  # eval_iters 200 of the per-GPU batch
    assert (typed.ckpt_every, typed.keep_checkpoints, typed.log_every) == (1000, 2, 10)
    assert (typed.dtype, typed.compile, typed.seed) == ("bfloat16", True, 1337)

    assert typed.optimizer.name == REGISTERED_NAME.get(opt, opt)
    for key, want in optimizer_values(opt, row).items():
        assert_value(getattr(typed.optimizer, key), want, f"{name}: optimizer.{key}")


@pytest.mark.parametrize("name", FOUND)
def test_experiment_writes_every_optimizer_value_itself(name):
    """No value is left to the optimizer group's defaults (they hold GPT-2 small values)."""
    data, size, opt = expected(name)
    block = OmegaConf.to_container(OmegaConf.load(EXPERIMENT_DIR / f"{name}.yaml"))["optimizer"]
    for key, want in optimizer_values(opt, OFFICIAL[(size, opt)]).items():
        assert key in block, f"{name}: optimizer.{key} is not pinned"
        assert_value(block[key], want, f"{name}: optimizer.{key}")


# A value's comment names the official file it comes from, or says it is our own choice.
SOURCE = re.compile(r"# (.*\b(MARS_M/|MARS/|config/|scripts/)[\w/*.-]+\.(py|sh)\b|ours\b)")


def value_lines(path, only_optimizer: bool) -> list[str]:
    lines, inside = [], not only_optimizer
    for line in path.read_text().splitlines():
        if only_optimizer and not line.startswith(" "):
            inside = line.startswith("optimizer:")
            continue
        if inside and re.match(r"^\s*(- override /\S+|[a-z_0-9]+): \S", line):
            lines.append(line)
    return lines


SOURCED_FILES = [
    pytest.param(EXPERIMENT_DIR / f"{name}.yaml", True, id=f"experiment/{name}") for name in FOUND
] + [
    pytest.param(CONFIG_DIR / "shared" / f"{size}.yaml", False, id=f"shared/{size}")
    for size in MODEL
]


@pytest.mark.parametrize("path,only_optimizer", SOURCED_FILES)
def test_every_value_names_its_source(path, only_optimizer):
    lines = value_lines(path, only_optimizer)
    assert lines
    for line in lines:
        assert SOURCE.search(line), f"{path.name}: no official source named in {line!r}"


@pytest.mark.parametrize("name", FOUND)
def test_command_line_overrides_win(name):
    typed, _ = command_line.to_typed(
        compose_config(f"experiment={name}", "micro_batch_size=4", "optimizer.lr=1e-3")
    )
    assert typed.micro_batch_size == 4
    assert typed.optimizer.lr == pytest.approx(1e-3)


@pytest.mark.parametrize("name", FOUND)
def test_per_rank_batch_divides_the_global_batch(name):
    typed, _ = command_line.to_typed(compose_config(f"experiment={name}"))
    per_step = typed.micro_batch_size * typed.sequence_length * SCRIPT_GPUS
    assert typed.batch_tokens % per_step == 0
    assert typed.batch_tokens // per_step == typed.grad_scale  # the scripts' accumulation


def test_train_prints_the_resolved_experiment():
    env = {**os.environ, "WANDB_MODE": "disabled"}
    result = subprocess.run(
        [sys.executable, "train.py", "experiment=owt/small-mars-adamw", "--cfg", "job"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for line in ("lr: 0.006", "lr_1d: 0.003", "max_steps: 100000", "name: owt/small-mars-adamw",
                 "grad_scale: 4.0", "sampling: random"):  # fmt: skip
        assert re.search(rf"^\s*{re.escape(line)}$", result.stdout, re.M), line
