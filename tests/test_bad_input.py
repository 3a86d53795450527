"""Bad input is refused when the config is composed, with one line and no file written, and no
secret or foreign code gets in (docs/input-checks.md)."""

import copy
import functools
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

import optim
from helpers import CONFIG_DIR, FAST, ROOT, compose_config
from trainer import checks, command_line
from trainer.checkpoint import FORMAT_VERSION, REQUIRED_KEYS


@functools.cache
def _composed(optimizer: str):
    return compose_config(f"optimizer={optimizer}")


def config_with(*overrides: str):
    """The composed config with ``overrides`` (``key=value``, ``+key=value``) set as Hydra sets
    them, without composing again for each (composing takes ~0.5 s here)."""
    opt = [o.split("=", 1)[1] for o in overrides if o.startswith("optimizer=")]
    cfg = copy.deepcopy(_composed(opt[0] if opt else "adamw"))
    for override in overrides:
        key, value = override.split("=", 1)
        if key != "optimizer":
            value = yaml.safe_load(value) if value[:1] == "[" else value
            OmegaConf.update(cfg, key.lstrip("+"), value, force_add=key.startswith("+"))
    return cfg


def refused(*overrides: str) -> str:
    """The one-line message with which the config with ``overrides`` is refused."""
    with pytest.raises(SystemExit) as info:
        command_line.to_typed(config_with(*overrides))
    message = str(info.value.code)
    assert message.startswith("config error: ") and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    "override,expected",
    [
        ("+max_step=10", "max_step (did you mean max_steps?)"),
        ("+model.n_layers=2", "model.n_layers (did you mean model.n_layer?)"),
        ("+schedule.warmup=5", "schedule.warmup (did you mean schedule.warmup_steps?)"),
        ("+wandb.api_key=abc", "unknown config key wandb.api_key"),
        ("+whatever.deep.key=1", "unknown config key whatever"),
    ],
)
def test_unknown_key_is_refused_whatever_the_syntax(override, expected):
    assert expected in refused(override)


def test_unknown_key_is_refused_after_hydra_composes_it():
    message = refused("optimizer=mars-adamw", "+optimizer.gama=0.1")
    assert "optimizer.gama (did you mean optimizer.gamma?)" in message
    with pytest.raises(SystemExit, match="max_step \\(did you mean max_steps\\?\\)"):
        command_line.to_typed(compose_config("+max_step=10"))  # Hydra's own advice for max_step=10


def test_optimizer_name_must_match_the_chosen_optimizer():
    assert "optimizer.name=muon does not match" in refused("optimizer.name=muon")
    assert "unknown optimizer" in refused("optimizer.name=adamx").lower()


def test_only_real_optimizers_are_offered():
    with pytest.raises(MissingConfigException) as info:
        compose_config("optimizer=base_adamw")
    offered = str(info.value).split("Available options in 'optimizer':")[1].split("Config")[0]
    assert sorted(offered.split()) == sorted(
        p.stem for p in (CONFIG_DIR / "optimizer").glob("*.yaml")
    )
    with pytest.raises(ConfigCompositionException, match="Key 'schema' not in 'TrainConfig'"):
        compose_config("+schema/optimizer=adamw")  # the schemas are not a group of the config


BAD_VALUES = [
    ("optimizer.lr=0", "optimizer.lr must be > 0"),
    ("optimizer.lr=-1e-3", "lr must be"),
    ("optimizer.betas=[0.9,1.0]", "betas must be two numbers in [0, 1)"),
    ("optimizer.betas=[0.9]", "betas must be two numbers"),
    ("optimizer.eps=0", "eps must be > 0"),
    ("optimizer.eps=nan", "optimizer.eps must be a finite number"),
    ("optimizer.weight_decay=-0.1", "weight_decay must be >= 0"),
    ("optimizer.lr=inf", "optimizer.lr must be a finite number"),
    ("micro_batch_size=0", "micro_batch_size must be >= 1"),
    ("batch_tokens=0", "batch_tokens must be >= 1"),
    ("max_steps=0", "max_steps must be >= 1"),
    ("log_every=0", "log_every must be >= 1"),
    ("eval_every=-1", "eval_every must be >= 0"),
    ("ckpt_every=-5", "ckpt_every must be >= 0"),
    ("keep_checkpoints=-1", "keep_checkpoints must be >= 0"),
    ("eval_tokens=0", "eval_tokens must be >= 1"),
    ("seq_len=0", "seq_len=0 must be between 1 and model.block_size"),
    ("seq_len=100000", "must be between 1 and model.block_size"),
    ("grad_clip=-1", "grad_clip must be >= 0"),
    ("grad_scale=0", "grad_scale must be > 0"),
    ("model.n_head=3", "divisible by model.n_head"),
    ("model.dropout=1.5", "model.dropout must be in [0, 1)"),
    ("schedule.warmup_steps=-1", "warmup_steps must be >= 0"),
    ("schedule.min_lr=1.0", "schedule.min_lr (1.0) must not exceed optimizer.lr"),
    ("schedule.decay_steps=0", "schedule.decay_steps must be >= 1"),
    ("schedule.name=linear", "valid schedules"),
    ("wandb.mode=loud", "valid modes"),
    ("data.sampling=sometimes", "unknown data.sampling"),
    ("device=tpu", "unknown device 'tpu'"),
    ("dtype=fp16", "unknown dtype 'fp16'"),
]


@pytest.mark.parametrize("override,expected", BAD_VALUES)
def test_bad_value_is_refused_with_one_line(override, expected):
    assert expected in refused(override)


@pytest.mark.parametrize(
    "optimizer,override,expected",
    [
        ("mars-adamw", "optimizer.gamma=-0.1", "optimizer.gamma must be >= 0"),
        ("mars-adamw", "optimizer.betas_1d=[1.0,0.9]", "betas_1d must be two numbers"),
        ("mars-adamw", "optimizer.clip=sometimes", "unknown optimizer.clip"),
        ("muon", "optimizer.momentum=1.0", "optimizer.momentum must be in [0, 1)"),
        ("muon", "optimizer.ns_steps=0", "ns_steps must be >= 1"),
        ("mars-m", "optimizer.gamma=-1", "optimizer.gamma must be >= 0"),
        ("lion", "optimizer.betas=[1.2,0.9]", "betas must be two numbers"),
    ],
)
def test_bad_optimizer_value_is_refused(optimizer, override, expected):
    assert expected in refused(f"optimizer={optimizer}", override)


@pytest.mark.parametrize("optimizer", ["adamw", "mars-adamw", "mars-m", "muon", "lion"])
def test_lr_has_one_rule_and_one_message(optimizer):
    """lr=0 and lr<0 are refused by the same rule, with the same words (optim/options.py)."""
    zero = refused(f"optimizer={optimizer}", "optimizer.lr=0")
    negative = refused(f"optimizer={optimizer}", "optimizer.lr=-1e-3")
    assert "optimizer.lr must be > 0, got 0" in zero
    assert "optimizer.lr must be > 0, got -0.001" in negative


@pytest.mark.parametrize(
    "override,key",
    [
        ("optimizer.lr=-1", "optimizer.lr must be"),
        ("optimizer.adamw_betas=[0.9,1.5]", "optimizer.adamw_betas must be"),
        ("optimizer.adamw_eps=0", "optimizer.adamw_eps must be"),
        ("optimizer.weight_decay=-1", "optimizer.weight_decay must be"),
        ("optimizer.momentum=1.5", "optimizer.momentum must be"),
        ("optimizer.ns_steps=0", "optimizer.ns_steps must be"),
        ("optimizer.ns_dtype=float17", "optimizer.ns_dtype 'float17'"),
        ("optimizer.clip=sometimes", "unknown optimizer.clip"),
    ],
)
def test_mars_m_errors_name_the_full_key(override, key):
    """Every optimizer error names the key as it is set on the command line."""
    assert key in refused("optimizer=mars-m", override)


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "device=cuda was asked for but CUDA is not available" in refused("device=cuda")


def test_unusable_paths_are_refused(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "out_dir=" in refused(f"out_dir={a_file}")
    assert "data.dir=" in refused(f"data.dir={a_file / 'below'}")
    typed, _ = command_line.to_typed(config_with(f"out_dir={tmp_path / 'new' / 'dir'}"))
    assert typed.out_dir.endswith("dir")  # a directory that can be created is fine


def test_data_dir_that_does_not_exist_is_refused(tmp_path):
    """A mistyped data.dir is not filled with a corpus: only the embedded corpus's default
    directory is prepared on first use."""
    from data import ensure_prepared

    nope = tmp_path / "nope"
    message = refused(f"data.dir={nope}")
    assert f"data.dir={nope} does not exist" in message
    assert f"python -m data.prepare sotu --out {nope}" in message
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ensure_prepared("sotu", nope)
    assert not nope.exists()
    # the default: prepared on first use
    command_line.to_typed(config_with("data.dir=data/shards/sotu"))


def test_unreadable_checkpoint_says_what_and_how_to_fix(tmp_path):
    from trainer.checkpoint import read_checkpoint

    path = tmp_path / "step_0000001.pt"
    torch.save({"x": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:1000])  # cut short, as by a kill while writing
    with pytest.raises(ValueError) as info:
        read_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path} is not a readable checkpoint: ")
    assert "high likelihood" not in message  # torch's long text, once cut mid-sentence
    assert message.endswith("resume=auto falls back to the previous checkpoint; or delete the "
                            "file, or pick another with resume=PATH")  # fmt: skip


class Foreign:  # an object that weights_only loading refuses
    pass


def fake_checkpoint(path, *overrides, **changes):
    """A checkpoint (no weights: it is refused before they would be read) of ``overrides``."""
    _, config = command_line.to_typed(config_with(*overrides))
    payload = {k: {} for k in REQUIRED_KEYS} | {"format_version": FORMAT_VERSION, "step": 1}
    payload |= {"config": config, **changes}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def test_checkpoint_of_this_run_is_accepted(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000001.pt")
    command_line.to_typed(config_with(f"resume={ckpt}", "optimizer.lr=1e-3", "model.dropout=0.1"))
    command_line.to_typed(config_with(f"resume={tmp_path / 'run'}"))  # a run directory


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda p: (p.write_text("hello\n"), p)[1], "is not a checkpoint (not a PyTorch file)"),
        (lambda p: torch.save({"x": Foreign()}, p) or p, "objects other than tensors"),
        (lambda p: torch.save({"model": {}}, p) or p, "is not a checkpoint of this code"),
        (lambda p: fake_checkpoint(p, format_version=99), "format 99, this code reads format 1"),
        (lambda p: fake_checkpoint(p, "model.n_layer=2"), "model.n_layer: checkpoint 2, configured 4"),
        (lambda p: fake_checkpoint(p, "model.n_embd=64"), "model.n_embd: checkpoint 64, configured 128"),
        (lambda p: fake_checkpoint(p, "optimizer=muon"), "optimizer: checkpoint 'muon', configured 'adamw'"),
    ],
)  # fmt: skip
def test_foreign_checkpoint_is_refused_before_loading(tmp_path, make, expected):
    path = make(tmp_path / "step_0000001.pt")
    assert expected in refused(f"resume={path}")


def test_secrets_are_redacted():
    secrets = checks.secret_values({"WANDB_API_KEY": "s3cr3t-value", "HOME": "/home/someone"})
    assert secrets == ["s3cr3t-value"]
    argv = ["train.py", "hydra.job.env_set.WANDB_API_KEY=other-secret", "name=x-s3cr3t-value"]
    assert checks.redact(argv, secrets) == [
        "train.py",
        "hydra.job.env_set.WANDB_API_KEY=<redacted>",
        "name=x-<redacted>",
    ]
    assert checks.redact({"wandb": {"name": "s3cr3t-value"}}, secrets) == {
        "wandb": {"name": "<redacted>"}
    }


def test_nothing_is_loaded_as_code():
    """Checkpoints load with weights_only=True; no pickle, unsafe YAML, eval/exec or Hydra
    instantiate on user input anywhere in the code."""
    unsafe = re.compile(
        r"weights_only\s*=\s*False|pickle\.loads?\(|yaml\.load\(|yaml\.unsafe_load|"
        r"(?<![\w.`])(?<!def )(eval|exec)\(|instantiate\(|_target_|allow_pickle\s*=\s*True"
    )
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests") or any(p.startswith(".") for p in rel.parts):
            continue
        text = path.read_text()
        found += [f"{rel}: {m.group(0)}" for m in unsafe.finditer(text)]
        for call in re.finditer(r"torch\.load\(([^)]*)\)", text):
            if "weights_only=True" not in call.group(1):
                found.append(f"{rel}: {call.group(0)}")
    assert not found


def _cli(args, cwd, env_extra=None):
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", **(env_extra or {})}
    cmd = [sys.executable, str(ROOT / "train.py"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def snapshot(d):
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_cli_refuses_with_one_line_and_touches_no_run(tmp_path, sotu_dir):
    """A real command line: one line on stderr, exit status 1, the existing run unchanged and
    no new run directory."""
    run_dir = tmp_path / "runs" / "old"
    ckpt = fake_checkpoint(run_dir / "checkpoints" / "step_0000001.pt", "model.n_layer=2")
    (run_dir / "config.yaml").write_text("max_steps: 1\n")
    before = snapshot(tmp_path)
    proc = _cli([f"out_dir={run_dir}", f"resume={ckpt}", f"data.dir={sotu_dir}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("config error: resume=") and "model.n_layer" in proc.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_secret_reaches_no_file_of_the_run(tmp_path, sotu_dir):
    secret = "fake-wandb-key-0123456789abcdef"
    out = tmp_path / "run"
    args = [*FAST, f"data.dir={sotu_dir}", f"out_dir={out}", "max_steps=1", "eval_every=0",
            f"+hydra.job.env_set.WANDB_API_KEY={secret}", f"wandb.group={secret}"]  # fmt: skip
    proc = _cli(args, cwd=tmp_path, env_extra={"WANDB_API_KEY": secret})
    assert proc.returncode == 0, proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "meta.jsonl" for p in files) and any(p.suffix == ".pt" for p in files)
    assert not [p for p in files if secret.encode() in p.read_bytes()]
    assert secret not in proc.stdout + proc.stderr


def test_eval_refuses_an_unknown_key():
    import eval as eval_py

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="eval", overrides=["checkpoint=x", "+tasc=[val]"])
    with pytest.raises(SystemExit, match="unknown config key tasc \\(did you mean tasks\\?\\)"):
        eval_py.to_typed(cfg)


def test_data_dir_of_text_files_is_refused_with_the_prepare_command_and_left_alone(tmp_path):
    """A folder of .txt files as data.dir was once filled with the embedded corpus's shards and
    trained on: it is refused at once, with the command that makes shards of those files."""
    texts = tmp_path / "notes"
    texts.mkdir()
    (texts / "one.txt").write_text("first document")
    (texts / "two.txt").write_text("second document")
    message = refused(f"data.dir={texts}")
    assert len(message.splitlines()) == 1
    assert f"python -m data.prepare {texts} --out data/shards/notes" in message
    assert sorted(p.name for p in texts.iterdir()) == ["one.txt", "two.txt"]


@pytest.mark.parametrize(
    "optimizer",
    [
        "mars-adamw",
        "lion",
        "muon",
        "moonlight",
        "mars-m",
        "soap",
        "normuon",
        "adamw",
        "adamw-schedulefree",
    ],
)
def test_the_implementation_is_reachable_from_the_command_line(optimizer):
    """``optimizer.implementation`` (docs/optim-engine.md) passes Hydra's typed config and
    reaches the optimizer's config; a value the optimizer does not have is refused naming its
    values; the earlier switches ``optimizer.fused``/``optimizer.foreach`` are refused in one
    line naming the replacement."""
    valid = optim.get_spec(optimizer).config_cls.valid_implementations
    for how in valid:
        typed, _ = command_line.to_typed(compose_config(f"optimizer={optimizer}",
                                                 f"optimizer.implementation={how}"))  # fmt: skip
        assert typed.optimizer.implementation == how
    message = refused(f"optimizer={optimizer}", "optimizer.implementation=turbo")
    assert f"'turbo' for {optimizer}; valid: {', '.join(valid)}" in message
    for old in ("+optimizer.fused=true", "+optimizer.foreach=false"):  # (the CLI: test_cli.py)
        message = refused(f"optimizer={optimizer}", old)
        assert len(message.splitlines()) == 1, message
        assert "was replaced by optimizer.implementation (docs/optim-engine.md)" in (message), (
            message
        )
