"""Checkpoints in the DCP format (trainer/dcp_checkpoint.py): resume equals an uninterrupted run,
asynchronous saves, incomplete directories ignored, conversion to the single-file format."""

import json
import shutil

import pytest
import torch
from test_train import _cli, read_metrics, run

from evals.loading import load_model
from helpers import FAST
from scripts.convert_checkpoint import main as convert
from trainer.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from trainer.config import TrainConfig, checkpointing
from trainer.dcp_checkpoint import DcpCheckpointer, load_dcp, my_share

COMMON = ["schedule.decay_steps=6", "ckpt_every=3", "model.dropout=0.1", "eval_every=3"]


def train_losses(out_dir):
    return [(r["step"], r["train_loss"], r["grad_norm"]) for r in read_metrics(out_dir)
            if "train_loss" in r]  # fmt: skip


def assert_same_state(a: dict, b: dict) -> None:
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for name, value in sa[i].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb[i][name])), (i, name)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["loader"] == b["loader"] and a["step"] == b["step"]


def test_dcp_resume_equals_uninterrupted(tmp_path, sotu_dir):
    """Saved synchronously, resumed and saved asynchronously: the same run as one in the file
    format, bit for bit."""
    dcp = ["checkpoint_format=dcp", "optimizer=mars-adamw"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    run(straight, sotu_dir, "max_steps=6", *COMMON, "optimizer=mars-adamw")  # the file format
    run(split, sotu_dir, "max_steps=3", *COMMON, *dcp)  # "interrupted" after 3 steps
    first = latest_checkpoint(split)
    assert first.is_dir() and first.name == "step_0000003"
    run(split, sotu_dir, "max_steps=6", *COMMON, *dcp, "async_checkpoint=true")  # resume=auto
    assert train_losses(straight) == train_losses(split)  # bit for bit
    assert [p.name for p in list_checkpoints(split)] == ["step_0000003", "step_0000006"]
    assert_same_state(load_checkpoint(latest_checkpoint(straight)),
                      load_checkpoint(latest_checkpoint(split)))  # fmt: skip


def test_incomplete_dcp_dir_is_ignored_and_conversion(tmp_path, sotu_dir):
    out = tmp_path / "run"
    run(out, sotu_dir, "max_steps=4", "ckpt_every=2", "keep_checkpoints=0", "eval_every=0",
        "checkpoint_format=dcp")  # fmt: skip
    ckpts = out / "checkpoints"
    assert [p.name for p in list_checkpoints(out)] == ["step_0000002", "step_0000004"]
    # A save killed before its rename, and one whose directory lacks DCP's index: both ignored.
    shutil.copytree(ckpts / "step_0000004", ckpts / ".step_0000006.partial")
    shutil.copytree(ckpts / "step_0000004", ckpts / "step_0000008")
    (ckpts / "step_0000008" / ".metadata").unlink()
    assert latest_checkpoint(out).name == "step_0000004"
    with pytest.raises(ValueError, match="not a complete DCP checkpoint"):
        load_checkpoint(ckpts / "step_0000008")

    target = convert([str(ckpts / "step_0000004"), "--out", str(tmp_path / "s4.pt")])
    as_file, as_dir = load_checkpoint(target), load_checkpoint(ckpts / "step_0000004")
    assert_same_state(as_file, as_dir)
    assert as_file["rng"][0]["torch"].equal(as_dir["rng"][0]["torch"])
    assert as_file["config"] == as_dir["config"] and as_file["tokens"] == 4 * 256
    assert set(load_dcp(ckpts / "step_0000004", parts=("model",))) >= {"model", "config", "step"}
    from_dir, from_file = load_model(ckpts / "step_0000004"), load_model(target)
    assert from_dir.step == 4 and from_dir.run_dir == out
    for k, v in from_file.model.state_dict().items():
        assert torch.equal(v, from_dir.model.state_dict()[k]), k


def test_async_save_copies_before_training_goes_on(tmp_path):
    """What the loop does after an asynchronous save returns never reaches the checkpoint."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = DcpCheckpointer(asynchronous=True)
    states = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    saver.save(tmp_path, 3, states, {"step": 3}, lambda final: None)
    with torch.no_grad():
        model.weight.add_(1.0)
    saver.wait()
    loaded = load_dcp(tmp_path / "step_0000003")
    assert all(torch.equal(before[k], loaded["model"][k]) for k in before)
    assert loaded["optimizer"]["state"].keys() == {0, 1}  # int keys survive


def test_async_needs_dcp(tmp_path, sotu_dir):
    with pytest.raises(SystemExit, match="async_checkpoint=true needs checkpoint_format=dcp"):
        run(tmp_path / "run", sotu_dir, "async_checkpoint=true", "checkpoint_format=file")


def test_the_default_is_dcp_and_asynchronous_on_several_processes():
    """checkpoint_format=auto and async_checkpoint unset: one file for one process, the sharded
    DCP directory written asynchronously for several (and DCP for FSDP, as before); an explicit
    value is kept, and the reason is stated."""

    def choice(world, **kw):
        c = checkpointing(TrainConfig(**kw), world)
        return c["format"], c["asynchronous"]

    assert TrainConfig().checkpoint_format == "auto" and TrainConfig().async_checkpoint is None
    assert choice(1) == ("file", False)
    assert choice(2) == choice(4) == ("dcp", True)
    assert choice(1, parallel="fsdp") == ("dcp", False)
    assert choice(4, parallel="fsdp") == ("dcp", True)
    assert choice(4, checkpoint_format="file") == ("file", False)
    assert choice(4, async_checkpoint=False) == ("dcp", False)
    assert choice(1, async_checkpoint=True) == ("dcp", True)
    assert choice(1, checkpoint_format="dcp") == ("dcp", False)
    assert "4 processes" in checkpointing(TrainConfig(), 4)["why"]
    assert TrainConfig(parallel="fsdp", async_checkpoint=True).checkpoint_format == "auto"


@pytest.mark.slow
def test_four_fsdp_ranks_save_two_resume(tmp_path, sotu_dir):
    """The defaults on 4 gloo ranks under FSDP: a DCP checkpoint written asynchronously (each rank
    its own shards); 2 ranks resume from it (resharded) and go on; the choice in meta.jsonl."""
    out = tmp_path / "run"
    args = [*FAST, f"data.dir={sotu_dir}", *COMMON, f"out_dir={out}", "parallel=fsdp",
            "optimizer=mars-adamw", "micro_batch_size=2"]  # fmt: skip
    four = _cli([*args, "max_steps=3"], nproc=4)
    assert four.returncode == 0, four.stdout + four.stderr
    step3 = out / "checkpoints" / "step_0000003"
    assert sorted(p.name for p in step3.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    two = _cli([*args, "max_steps=5"], nproc=2)
    assert two.returncode == 0, two.stdout + two.stderr
    assert [r["step"] for r in read_metrics(out) if "train_loss" in r] == [1, 2, 3, 4, 5]
    assert len(load_checkpoint(step3)["rng"]) == 4
    assert len(load_checkpoint(latest_checkpoint(out))["rng"]) == 2
    metas = [json.loads(line) for line in (out / "meta.jsonl").read_text().splitlines()]
    chosen = [m["checkpointing"] for m in metas if "checkpointing" in m]
    assert [(c["format"], c["asynchronous"]) for c in chosen] == [("dcp", True)] * 2, chosen


@pytest.mark.slow
def test_two_gloo_processes_save_one_resumes(tmp_path, sotu_dir):
    """Two ranks write one DCP checkpoint (each its share); one process resumes from it."""
    dcp = ["checkpoint_format=dcp", "async_checkpoint=true"]
    out = tmp_path / "run"
    args = [*FAST, f"data.dir={sotu_dir}", *COMMON, *dcp, f"out_dir={out}"]
    two = _cli([*args, "max_steps=3"], nproc=2)
    assert two.returncode == 0, two.stdout + two.stderr
    step3 = out / "checkpoints" / "step_0000003"
    sizes = {p.name: p.stat().st_size for p in step3.glob("*.distcp")}
    assert sorted(sizes) == ["__0_0.distcp", "__1_0.distcp"]
    assert max(sizes.values()) < 0.75 * sum(sizes.values())  # each rank wrote about half
    run(out, sotu_dir, "max_steps=5", *COMMON, *dcp)
    assert len(load_checkpoint(step3)["rng"]) == 2
    assert [r["step"] for r in read_metrics(out) if "train_loss" in r] == [1, 2, 3, 4, 5]
    assert len(load_checkpoint(latest_checkpoint(out))["rng"]) == 1  # saved by one process


def test_shares_are_disjoint_complete_and_balanced():
    tensors = {f"t{i}": torch.empty(n) for i, n in enumerate([100, 7, 60, 50, 3, 40, 1, 1])}
    shares = [my_share(tensors, r, 3) for r in range(3)]
    assert sorted(k for s in shares for k in s) == sorted(tensors)
    sizes = [sum(tensors[k].numel() for k in s) for s in shares]
    assert sizes == [100, 72, 90]  # largest first, each to the rank with the fewest bytes
    assert my_share(tensors, 0, 1) == sorted(tensors, key=lambda k: -tensors[k].numel())
