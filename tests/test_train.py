"""End-to-end runs of train.py on the CPU: files, falling loss, resume, bad input, 2 processes."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

import train
import trainer.trainer as trainer_mod
from helpers import FAST, ROOT, fast_config
from runtime.distributed import destroy, init_distributed
from runtime.runfiles import read_meta
from trainer.checkpoint import latest_checkpoint, load_checkpoint


def read_metrics(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def run(out_dir, data_dir, *overrides):
    typed, plain = fast_config(out_dir, data_dir, *overrides)
    return train.train(typed, plain)


def test_tiny_run_writes_files_and_learns(tmp_path, sotu_dir):
    out = tmp_path / "run"
    summary = run(out, sotu_dir, "max_steps=16")
    for name in ("metrics.jsonl", "summary.json", "config.yaml", "meta.jsonl"):
        assert (out / name).exists(), name
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and ckpt.name == "step_0000016.pt"
    c = load_checkpoint(ckpt)  # weights_only=True
    assert c["step"] == 16 and c["tokens"] == 16 * 256
    records = read_metrics(out)
    assert all("step" in r and "tokens" in r for r in records)
    train_losses = [r["train_loss"] for r in records if "train_loss" in r]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(train_losses) == 16 and len(val) == 5  # steps 0, 4, 8, 12, 16
    assert sum(train_losses[-4:]) / 4 < sum(train_losses[:4]) / 4 - 0.5
    assert val[-1] < val[0] - 0.5
    assert {"lr", "tokens_per_s", "grad_norm"} <= set(records[-1]) | set(records[-2])
    saved = json.loads((out / "summary.json").read_text())
    assert saved["steps"] == 16 and saved["final_val_loss"] == pytest.approx(val[-1])
    routes = saved["optimizer_routes"]  # which code stepped each bucket, and why
    assert routes and all(r in ("engine", "compiled", "foreach", "loop", "torch") for r in routes)
    assert all(v["buckets"] >= 1 and v["reasons"] for v in routes.values())
    assert read_meta(out)[-1]["optimizer_routes"] == routes  # after the first step, in meta.jsonl
    assert summary["best_val_loss"] == min(val)
    assert yaml.safe_load((out / "config.yaml").read_text())["max_steps"] == 16


def test_a_run_of_an_earlier_version_with_fused_is_a_different_config(tmp_path, sotu_dir, capsys):
    """A run directory whose config.yaml has ``optimizer.fused``/``optimizer.foreach`` (before
    ``implementation``) is not continued: its config differs. The routes are logged once, after
    the first step."""
    out = tmp_path / "old"
    run(out, sotu_dir, "max_steps=2", "optimizer=mars-adamw", "ckpt_every=2")
    logged = [ln for ln in capsys.readouterr().out.splitlines() if "optimizer route" in ln]
    assert len(logged) == 1 and logged[0].endswith(
        "optimizer route foreach: 3 buckets (not the engine: implementation=auto on cpu; "
        "not compiled: implementation=auto on cpu)"), logged  # fmt: skip
    config = yaml.safe_load((out / "config.yaml").read_text())
    del config["optimizer"]["implementation"]
    config["optimizer"] |= {"fused": None, "foreach": None}  # as an earlier version wrote it
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(
        SystemExit, match="(?s)different config.*optimizer.foreach: None -> '<absent>'"
    ):
        run(out, sotu_dir, "max_steps=4", "optimizer=mars-adamw")
    destroy()


def test_resume_equals_uninterrupted(tmp_path, sotu_dir):
    common = ["schedule.decay_steps=10", "ckpt_every=5", "model.dropout=0.1"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    run(straight, sotu_dir, "max_steps=10", *common)
    run(split, sotu_dir, "max_steps=5", *common)  # "interrupted" after 5 steps
    run(split, sotu_dir, "max_steps=10", *common)  # resume=auto continues from step 5
    a, b = read_metrics(straight), read_metrics(split)
    train_a = [
        (r["step"], r["train_loss"], r["lr"], r["grad_norm"]) for r in a if "train_loss" in r
    ]
    train_b = [
        (r["step"], r["train_loss"], r["lr"], r["grad_norm"]) for r in b if "train_loss" in r
    ]
    assert train_a == train_b and len(train_a) == 10  # bit for bit
    val_a = {r["step"]: r["val_loss"] for r in a if "val_loss" in r}
    val_b = {r["step"]: r["val_loss"] for r in b if "val_loss" in r}
    assert set(val_b) == set(val_a) | {5}  # the interrupted run also evaluated at its end
    assert all(val_a[s] == val_b[s] for s in val_a)
    wa = load_checkpoint(latest_checkpoint(straight))["model"]
    wb = load_checkpoint(latest_checkpoint(split))["model"]
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_finished_run_is_not_redone(tmp_path, sotu_dir):
    out = tmp_path / "run"
    run(out, sotu_dir, "max_steps=3")
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    summary = run(out, sotu_dir, "max_steps=3")
    assert summary["steps"] == 3 and summary["final_val_loss"] is not None
    after = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # summary, metrics and meta.jsonl untouched


def test_different_config_is_not_overwritten(tmp_path, sotu_dir):
    out = tmp_path / "run"
    run(out, sotu_dir, "max_steps=2")
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit, match="different config") as info:
        run(out, sotu_dir, "max_steps=2", "optimizer.lr=1e-2")
    assert "optimizer.lr" in str(info.value)
    with pytest.raises(SystemExit, match="resume=never"):
        run(out, sotu_dir, "max_steps=2", "resume=never")
    after = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert before == after


def test_batch_that_does_not_divide(tmp_path, sotu_dir):
    with pytest.raises(SystemExit, match="not a multiple of .* = 128"):
        run(tmp_path / "run", sotu_dir, "batch_tokens=300")


def test_missing_shards_say_how_to_prepare(tmp_path):
    empty = tmp_path / "owt"
    empty.mkdir()
    with pytest.raises(SystemExit, match=f"python -m data.prepare openwebtext --out {empty}"):
        run(tmp_path / "run", empty, "data=openwebtext", "max_steps=1")


def _cli(args, env_extra=None, nproc=None):
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.update(env_extra or {})
    if nproc:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "train.py",
            *args,
        ]
    else:
        cmd = [sys.executable, "train.py", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_cli_unknown_optimizer_lists_valid_ones():
    proc = _cli(["optimizer=adamx"])
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "unknown optimizer 'adamx' (did you mean optimizer=adamw?); valid: adamw," in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "mars-adamw-exact"])
def test_two_gloo_processes_match_one(tmp_path, sotu_dir, optimizer):
    """torchrun with 2 processes against the same run in this process (one thread each)."""
    common = ["max_steps=6", "eval_every=3", f"optimizer={optimizer}", "micro_batch_size=4"]
    run(tmp_path / "one", sotu_dir, *common)
    args = [*FAST, f"data.dir={sotu_dir}", *common]
    two = _cli([*args, f"out_dir={tmp_path / 'two'}"], nproc=2)
    assert two.returncode == 0, two.stdout + two.stderr
    a, b = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("train_loss", "val_loss", "grad_norm"):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-5), (key, ra, rb)
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size"] == 2


def test_exact_reference_is_the_next_batch_at_the_current_weights(tmp_path, sotu_dir):
    """With gradient accumulation, the stored reference after step t is g(x_t, batch t+1)."""
    out = tmp_path / "run"
    run(out, sotu_dir, "optimizer=mars-adamw-exact", "max_steps=3", "ckpt_every=1",
        "keep_checkpoints=0", "grad_scale=4")  # fmt: skip
    before = load_checkpoint(out / "checkpoints" / "step_0000002.pt")
    after = load_checkpoint(out / "checkpoints" / "step_0000003.pt")
    typed, _ = fast_config(out, sotu_dir, "optimizer=mars-adamw-exact")
    trainer = trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=out)
    trainer.raw_model.load_state_dict(before["model"])  # x_2
    trainer.loader.load_state_dict(after["loader"])  # positioned at batch 3
    assert trainer.accum == 2
    trainer.reference_grad(4 / 2)
    ordered = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    state = after["optimizer"]["state"]
    matrices = [i for i, p in enumerate(ordered) if p.ndim == 2]
    assert matrices
    for i in matrices:
        ref = trainer.optimizer.state[ordered[i]]["previous_grad"]
        torch.testing.assert_close(state[i]["last_grad"], ref, rtol=1e-5, atol=1e-7)
        assert ref.abs().sum() > 0
    destroy()


def test_exact_mode_resume_equals_uninterrupted(tmp_path, sotu_dir):
    """The reference gradients travel in the checkpoint: a resumed exact run is bit-identical."""
    common = ["optimizer=mars-adamw-exact", "schedule.decay_steps=6", "eval_every=0"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    run(straight, sotu_dir, "max_steps=6", *common)
    run(split, sotu_dir, "max_steps=3", *common)
    run(split, sotu_dir, "max_steps=6", *common)
    losses = [
        [(r["step"], r["train_loss"], r["grad_norm"]) for r in read_metrics(d) if "train_loss" in r]
        for d in (straight, split)
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 6
    wa = load_checkpoint(latest_checkpoint(straight))["model"]
    wb = load_checkpoint(latest_checkpoint(split))["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_run_killed_before_its_first_checkpoint_starts_over(tmp_path, sotu_dir):
    """resume=auto with a run directory but no checkpoint yet: the run starts over cleanly."""
    fresh, killed = tmp_path / "fresh", tmp_path / "killed"
    run(fresh, sotu_dir, "max_steps=3")
    run(killed, sotu_dir, "max_steps=3")
    for ckpt_file in (killed / "checkpoints").iterdir():  # as if killed before it was written
        ckpt_file.unlink()
    (killed / "summary.json").unlink()
    run(killed, sotu_dir, "max_steps=3")
    drop = ("tokens_per_s", "elapsed_s")
    a, b = ([{k: v for k, v in r.items() if k not in drop} for r in read_metrics(d)]
            for d in (fresh, killed))  # fmt: skip
    assert a == b  # no records of the killed attempt are left
    with pytest.raises(SystemExit, match="resume=never"):
        run(killed, sotu_dir, "max_steps=3", "resume=never")
