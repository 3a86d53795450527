"""Non-finite loss or gradients (trainer/nonfinite.py): a skipped step touches neither the weights
nor the optimizer state, is counted, is agreed by every rank; stopping names step and checkpoint;
a run without NaN computes exactly what it did before the check existed."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import train
import trainer.trainer as trainer_mod
from helpers import FAST, ROOT, compose_config, fast_config
from runtime.distributed import destroy, init_distributed
from trainer import command_line
from trainer.nonfinite import NonFiniteConfig

OPTIMIZERS = ["adamw", "mars-adamw", "mars-adamw-exact", "muon", "mars-m"]
TIMING = {"tokens_per_s", "elapsed_s", "mfu"}


def read_metrics(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def poison(model: torch.nn.Module, kind: str) -> None:
    """Put one NaN or inf in one gradient (in place, after DDP's averaging: this rank only)."""
    p = next(p for p in model.parameters() if p.grad is not None)
    p.grad.view(-1)[0] = float("nan") if kind == "nan" else float("inf")


def poisoning_clip(plan: dict[int, str]):
    """A Trainer.clip_grads that poisons the gradients of the steps in ``plan`` ({step: kind});
    kind ``ref`` poisons exact MARS's reference pass instead of the real one."""
    calls: dict[int, int] = {}

    def clip(self):
        step = self.state.step + 1
        calls[step] = calls.get(step, 0) + 1
        kind = plan.get(step)
        first = calls[step] == 1
        exact = getattr(self.optimizer, "needs_reference_grad", False)
        if kind == "ref" and exact and first:
            poison(self.raw_model, "nan")
        elif kind in ("nan", "inf") and (not exact or not first):
            poison(self.raw_model, kind)
        return trainer_mod.Trainer.__dict__["_orig_clip"](self)

    return clip


@pytest.fixture
def inject(monkeypatch):
    """``inject({step: kind})`` makes every Trainer poison those steps (this process only)."""
    monkeypatch.setattr(
        trainer_mod.Trainer, "_orig_clip", trainer_mod.Trainer.clip_grads, raising=False
    )

    def setup(plan):
        monkeypatch.setattr(trainer_mod.Trainer, "clip_grads", poisoning_clip(plan))

    return setup


def run(out_dir, data_dir, *overrides):
    typed, plain = fast_config(out_dir, data_dir, *overrides)
    return train.train(typed, plain)


def snapshot(trainer):
    """Weights and optimizer state; of the param groups, all but ``lr`` (the schedule's)."""
    opt = copy.deepcopy(trainer.optimizer.state_dict())
    groups = [{k: v for k, v in g.items() if k != "lr"} for g in opt["param_groups"]]
    weights = {k: v.clone() for k, v in trainer.raw_model.state_dict().items()}
    return weights, opt["state"], groups


def assert_same_state(a, b, skip=("previous_grad",)):
    """Equal tensors and values, except exact MARS's scratch buffer ``previous_grad``."""
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            if k not in skip:
                assert_same_state(a[k], b[k], skip)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y, skip)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match=r"nonfinite.policy 'sometimes'.*skip"):
        NonFiniteConfig(policy="sometimes")
    with pytest.raises(ValueError, match=r"max_consecutive must be an integer >= 1.*got 0"):
        NonFiniteConfig(max_consecutive=0)
    with pytest.raises(SystemExit, match="config error: unknown nonfinite.policy"):
        command_line.to_typed(compose_config("nonfinite.policy=never"))
    typed, _ = command_line.to_typed(compose_config("nonfinite.policy=stop"))
    assert typed.nonfinite == NonFiniteConfig(policy="stop", max_consecutive=5)


@pytest.mark.parametrize(
    "optimizer,kind",
    [*((o, "nan") for o in OPTIMIZERS), ("adamw", "inf"), ("mars-adamw-exact", "ref")],
)
def test_skipped_step_touches_neither_weights_nor_optimizer_state(
    tmp_path, sotu_dir, inject, optimizer, kind
):
    typed, _ = fast_config(tmp_path, sotu_dir, f"optimizer={optimizer}", "max_steps=3")
    trainer = trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=tmp_path)
    inject({2: kind})
    trainer.train_step()  # step 1: the optimizer state exists
    before = snapshot(trainer)
    position = copy.deepcopy(trainer.loader.state_dict())
    trainer.train_step()  # step 2: poisoned, skipped
    assert trainer.guard.skipped and trainer.state.skipped_steps == 1
    assert_same_state(snapshot(trainer), before)
    assert all(p.grad is None for p in trainer.raw_model.parameters())
    assert (trainer.state.step, trainer.state.tokens) == (2, 2 * typed.batch_tokens)
    assert trainer.loader.state_dict() != position  # the batch is consumed
    trainer.train_step()  # step 3: finite again, applied
    assert not trainer.guard.skipped and trainer.guard.consecutive == 0
    after = trainer.raw_model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(after[k], before[0][k]) for k in after)
    destroy()


def test_skips_are_counted_in_metrics_summary_and_checkpoint(tmp_path, sotu_dir, inject):
    inject({2: "nan", 3: "inf"})
    summary = run(tmp_path, sotu_dir, "max_steps=5", "eval_every=0", "ckpt_every=5")
    records = read_metrics(tmp_path)
    skipped = [r for r in records if r.get("skipped")]
    assert [(r["step"], r["tokens"], r["skipped_steps"]) for r in skipped] == [
        (2, 512, 1),
        (3, 768, 2),
    ]
    logged = [r for r in records if "train_loss" in r]
    assert [r["step"] for r in logged] == [1, 4, 5]  # skipped steps log no loss
    assert [r["skipped_steps"] for r in logged] == [0, 2, 2]
    assert summary["skipped_steps"] == 2 and summary["steps"] == 5
    assert json.loads((tmp_path / "summary.json").read_text())["skipped_steps"] == 2
    ckpt = torch.load(tmp_path / "checkpoints" / "step_0000005.pt", weights_only=True)
    assert ckpt["skipped_steps"] == 2


def test_nan_loss_on_finite_gradients_is_skipped(tmp_path, sotu_dir, monkeypatch):
    calls = []
    real = trainer_mod.forward_backward

    def nan_loss_at_step_2(*args):
        calls.append(1)
        loss = real(*args)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(trainer_mod, "forward_backward", nan_loss_at_step_2)
    summary = run(tmp_path, sotu_dir, "max_steps=3", "eval_every=0")
    assert summary["skipped_steps"] == 1
    assert [r["step"] for r in read_metrics(tmp_path) if r.get("skipped")] == [2]


@pytest.mark.parametrize("policy,stop_at", [("skip", 4), ("stop", 3)])
def test_stop_names_the_step_and_the_last_checkpoint(tmp_path, sotu_dir, inject, policy, stop_at):
    inject({s: "nan" for s in range(3, 9)})
    overrides = [f"nonfinite.policy={policy}", "nonfinite.max_consecutive=2", "ckpt_every=2"]
    with pytest.raises(SystemExit) as exc:
        run(tmp_path, sotu_dir, "max_steps=8", "eval_every=0", *overrides)
    msg = str(exc.value)
    assert f"stopping at step {stop_at}: non-finite gradient norm (" in msg
    assert str(tmp_path / "checkpoints" / "step_0000002.pt") in msg
    assert "those of step 2" in msg
    summary = json.loads((tmp_path / "summary.json").read_text())  # recorded, never finished
    assert summary["stopped"] == "diverged" and summary["final_val_loss"] is None


def test_no_nan_run_is_identical_with_and_without_the_check(tmp_path, sotu_dir):
    """policy=off is the loop as it was before the check (checked against it when added)."""
    common = ["max_steps=3", "eval_every=2", "optimizer=mars-adamw-exact"]
    run(tmp_path / "off", sotu_dir, "nonfinite.policy=off", *common)
    run(tmp_path / "skip", sotu_dir, *common)
    off, skip = read_metrics(tmp_path / "off"), read_metrics(tmp_path / "skip")
    assert len(off) == len(skip) == 6  # val 0, train 1, 2, val 2, train 3, val 3
    for a, b in zip(off, skip):
        assert b.pop("skipped_steps", 0) == 0
        assert {k: v for k, v in a.items() if k not in TIMING} == {
            k: v for k, v in b.items() if k not in TIMING
        }


@pytest.mark.slow
def test_two_gloo_processes_agree_on_skips_and_stop(tmp_path, sotu_dir):
    """NaN/inf in rank 1's gradients (after DDP's averaging) and a NaN loss on rank 1 only:
    both ranks skip the same steps, keep identical weights, and both stop with status 1."""
    out = tmp_path / "run"
    args = [*FAST, f"data.dir={sotu_dir}", f"out_dir={out}", "max_steps=6", "eval_every=0",
            "ckpt_every=3", "nonfinite.max_consecutive=2"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "NONFINITE_TEST_PLAN": "2:loss,4:nan,5:inf"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "tests/nonfinite_inject.py", *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "stopping at step 5: non-finite gradient norm on 1 of 2 ranks (" in proc.stderr
    # several processes save the sharded DCP directory by default (checkpoint_format=auto)
    ckpt = out / "checkpoints" / "step_0000003"
    assert str(ckpt) in proc.stderr and f"{ckpt}.pt" not in proc.stderr and ckpt.is_dir()
    digests = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert digests[0] == digests[1] and len(digests[0]) == 4  # steps 1..4, identical weights
    d = digests[0]
    assert d["1"] == d["2"] != d["3"] == d["4"]  # 2 (loss on rank 1) and 4 (its grads) skipped
    skipped = [(r["step"], r["skipped_steps"]) for r in read_metrics(out) if r.get("skipped")]
    assert skipped == [(2, 1), (4, 2)]


# The device decision (nonfinite.decision=device): torch's found_inf protocol, read one step late;
# the default optimizer (adamw) on torch's fused kernel, the only one that honours it.
DEVICE = ["nonfinite.decision=device", "log_every=10"]
TORCH_FUSED = "optimizer.implementation=torch-fused"
COMPILED = "optimizer.implementation=compiled"


# the compiled path (masks in its kernels) and the eager paths (steps on copies, optim/masked.py):
# Newton-Schulz (muon, mars-m, mars-shampoo), the global clip, exact mode's swap, the loop
DEVICE_CASES = {
    "adamw": ["optimizer=adamw", TORCH_FUSED],
    "mars-adamw": ["optimizer=mars-adamw", COMPILED],
    "muon": ["optimizer=muon", COMPILED],
    "mars-m": ["optimizer=mars-m", COMPILED],
    "mars-m-exact": ["optimizer=mars-m", "optimizer.mode=exact", COMPILED],
    "mars-shampoo": ["optimizer=mars-shampoo", COMPILED],
    "mars-adamw-exact": ["optimizer=mars-adamw", "optimizer.mode=exact", COMPILED],
    "mars-adamw-global": ["optimizer=mars-adamw", "optimizer.clip=global", COMPILED],
    "mars-adamw-eager": ["optimizer=mars-adamw", "optimizer.implementation=foreach"],
}


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_device_decision_skip_touches_nothing_and_is_read_a_step_late(
    tmp_path, sotu_dir, inject, case
):
    typed, _ = fast_config(tmp_path, sotu_dir, "max_steps=4", *DEVICE, *DEVICE_CASES[case])
    trainer = trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=tmp_path)
    assert trainer.guard.on_device
    inject({2: "nan"})
    trainer.train_step()  # step 1: the optimizer state exists
    trainer.guard.resolve()
    before = snapshot(trainer)
    trainer.train_step()  # step 2: poisoned; the optimizer ran, masked on the device
    assert trainer.guard.pending.step == 2 and trainer.state.skipped_steps == 0  # not read yet
    trainer.guard.resolve()
    assert trainer.guard.skipped and trainer.state.skipped_steps == 1
    assert_same_state(snapshot(trainer), before)  # step counts taken back, buffers untouched
    trainer.train_step()  # step 3: finite, applied; it reads step 2's flags first
    trainer.guard.resolve()
    assert not trainer.guard.skipped and trainer.guard.consecutive == 0
    after = trainer.raw_model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(after[k], before[0][k]) for k in after)
    destroy()


def test_device_decision_reads_only_the_previous_steps_flags(tmp_path, sotu_dir, monkeypatch):
    """Within a step, the one host read is of the step before's flags (copied when that step's
    backward ended): the host never waits for the work it has just queued."""
    typed, _ = fast_config(tmp_path, sotu_dir, "optimizer=adamw", TORCH_FUSED, "max_steps=4",
                           *DEVICE)  # fmt: skip
    trainer = trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=tmp_path)
    trainer.train_step()
    reads = []
    for name in ("tolist", "item", "__bool__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda t, *a, _r=real, **k: (reads.append(t), _r(t, *a, **k))[1]
        )
    for _ in range(2):
        previous = trainer.guard.pending.flags
        reads.clear()
        trainer.train_step()
        assert len(reads) == 1 and reads[0] is previous
    monkeypatch.undo()
    destroy()


def test_device_decision_counts_and_stops_like_the_host_one(tmp_path, sotu_dir, inject):
    inject({2: "nan", **{s: "nan" for s in range(5, 9)}})
    overrides = ["max_steps=8", "eval_every=0", "ckpt_every=3", "nonfinite.max_consecutive=2"]
    with pytest.raises(SystemExit) as exc:
        run(tmp_path, sotu_dir, *overrides, TORCH_FUSED, *DEVICE)
    msg = str(exc.value)
    assert "stopping at step 6: non-finite gradient norm (" in msg and "those of step 4" in msg
    assert str(tmp_path / "checkpoints" / "step_0000003.pt") in msg
    skipped = [(r["step"], r["tokens"], r["skipped_steps"])
               for r in read_metrics(tmp_path) if r.get("skipped")]  # fmt: skip
    assert skipped == [(2, 512, 1), (5, 1280, 2)]
    ckpt = torch.load(tmp_path / "checkpoints" / "step_0000003.pt", weights_only=True)
    assert ckpt["skipped_steps"] == 1  # the skip of step 2 was read before the save


def test_device_decision_refuses_an_optimizer_that_cannot_mask(tmp_path, sotu_dir):
    typed, _ = fast_config(tmp_path, sotu_dir, "optimizer=adamw",
                           "optimizer.implementation=foreach",
                           "nonfinite.decision=device")  # fmt: skip
    with pytest.raises(
        ValueError,
        match="nonfinite.decision=device: .*only with its fused kernel "
        r"\(optimizer.implementation=torch-fused\)",
    ):
        trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=tmp_path)
    destroy()


@pytest.mark.parametrize("case", ["muon", "mars-m-exact", "mars-adamw-exact"])
def test_device_decision_on_copies_computes_the_host_decisions_run(tmp_path, sotu_dir, case):
    """Without NaN, the eager buckets' steps on copies (optim/masked.py) and the masked swap give
    the host decision's numbers bit for bit; ``auto`` takes the host for them (their cost)."""
    host = run(tmp_path / "host", sotu_dir, "max_steps=3", *DEVICE_CASES[case], *DEVICE[1:])
    dev = run(tmp_path / "dev", sotu_dir, "max_steps=3", *DEVICE_CASES[case], *DEVICE)
    strip = [
        {k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(tmp_path / "host")
    ]
    assert strip == [{k: v for k, v in r.items() if k not in TIMING}
                     for r in read_metrics(tmp_path / "dev")]  # fmt: skip
    del host, dev
    a = torch.load(tmp_path / "host" / "checkpoints" / "step_0000003.pt", weights_only=True)
    b = torch.load(tmp_path / "dev" / "checkpoints" / "step_0000003.pt", weights_only=True)
    assert_same_state(a["model"], b["model"])
    assert_same_state(a["optimizer"], b["optimizer"], skip=())


def test_auto_takes_the_host_where_the_device_would_copy():
    from optim import build_optimizer
    from optim.registry import get_spec
    from trainer.nonfinite import device_skip_reason

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    for name, cost in (
        ("muon", "steps on copies"),
        ("mars-adamw", "not compiled: implementation=auto"),
    ):
        opt = build_optimizer(model, get_spec(name).config_cls())
        assert device_skip_reason(opt) is None and cost in opt.device_skip_cost()
    opt = build_optimizer(model, get_spec("mars-adamw").config_cls(implementation="compiled"))
    assert opt.device_skip_cost() is None


def test_stop_message_waits_for_the_checkpoint_in_flight(tmp_path):
    """An asynchronous save still in flight when the run stops is waited for and named: the
    message is written after ``settle_checkpoints`` (the Trainer's wait on its DCP saver)."""
    from runtime.distributed import DistInfo
    from trainer.checkpoint import checkpoint_dir
    from trainer.nonfinite import Diverged, NonFiniteGuard
    from trainer.run import RunState

    dist = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    guard = NonFiniteGuard(NonFiniteConfig(policy="stop"), dist, RunState(step=4), tmp_path, 8)
    committed = checkpoint_dir(tmp_path) / "step_0000003.pt"

    def settle():  # the save of step 3 commits only now
        committed.parent.mkdir(parents=True)
        committed.write_bytes(b"")

    guard.settle_checkpoints = settle
    with pytest.raises(Diverged) as stop:
        guard._judge(5, 40, [1.0, 0.0, 0.0], None)
    assert f"last checkpoint: {committed}" in stop.value.message
