"""bench.train_run: real train.py runs read back and checked (the loss falls, no recompiles, an
FSDP run resumed), on planted files and once end to end on the CPU."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import train_run


def planted(tmp_path, losses, *, resumed=False, log="", sdpa="cudnn"):
    out = tmp_path / "run"
    out.mkdir()
    rows = [{"step": i + 1, "train_loss": x, "tokens_per_s": 1000.0 + i}
            for i, x in enumerate(losses)] + [{"step": len(losses), "val_loss": 3.5}]  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metas = [{"resume_from": None, "sdpa": {"choice": sdpa}}]
    metas += [{"resume_from": str(out / "checkpoints/step_5"), "sdpa": {"choice": sdpa}}] * resumed
    (out / "meta.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metas))
    (tmp_path / "run.log").write_text(log)
    return train_run.read_run(out, tmp_path / "run.log")


def test_a_falling_loss_without_recompiles_passes(tmp_path):
    run = planted(tmp_path, [10.0] * 10 + [6.0] * 10)
    assert (run["first"], run["last"], run["val"], run["steps"]) == (10.0, 6.0, 3.5, 20)
    assert run["tok_s"] == 1009.5 and run["sdpa"] == "cudnn" and not run["resumed"]
    assert train_run.checks(run, 0, 20, fsdp=False) == []


def test_each_failure_is_named(tmp_path):
    log = ("12:00:01 step 1/20 | loss 10.9 | lr 0\nV1126 Recompiling function forward in "
           "model/gpt.py\nok\nRecompiling function f\n")  # fmt: skip
    run = planted(tmp_path, [10.0] * 5 + [9.95] * 5, log=log)
    failed = train_run.checks(run, 1, 20, fsdp=True)
    assert failed[0] == "exit 1"
    assert "stopped at step 10 of 20" in failed and "2 recompiles" in failed
    assert any(f.startswith("loss did not fall") for f in failed)
    assert "no resume from the DCP checkpoint" in failed


def test_overrides_set_the_batch_and_fsdp(tmp_path):
    args = argparse.Namespace(
        device="cuda", no_compile=False, micro_batch=12, accum=2, seq_len=512, steps=300,
        eval_tokens=65536, fsdp=True, extra=["seed=3"])  # fmt: skip
    over = train_run.overrides(args, "llama/124m-muon", tmp_path, 150)
    assert "compile=true" in over and "batch_tokens=12288" in over and "max_steps=150" in over
    assert "parallel=fsdp" in over and "ckpt_every=150" in over and over[-1] == "seed=3"
    assert train_run.command(args, over)[1:5] == ["-m", "torch.distributed.run", "--standalone",
                                                  "--nproc_per_node=1"]  # fmt: skip


@pytest.mark.slow
def test_fsdp_run_under_torchrun_stops_resumes_and_passes(tmp_path, capsys):
    """The CPU form of gpu_check's fsdp step: llama-tiny under torchrun with parallel=fsdp, two
    steps, then resumed from its DCP checkpoint to four."""
    rc = train_run.main(["--device", "cpu", "--experiments", "llama-cpu/tiny-adamw", "--steps",
                         "4", "--micro-batch", "2", "--accum", "1", "--seq-len", "32",
                         "--eval-tokens", "256", "--fsdp", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out + (tmp_path / "llama-cpu-tiny-adamw-fsdp.log").read_text()[-3000:]
    assert "PASS" in out
    with pytest.raises(SystemExit, match="exists"):  # nothing overwritten
        train_run.main(["--device", "cpu", "--experiments", "llama-cpu/tiny-adamw", "--fsdp",
                        "--out", str(tmp_path)])  # fmt: skip


def test_only_recompiles_after_a_process_first_step_fail():
    """The graphs a run needs come before its first logged step, in every process: the step-0
    evaluation's no-grad graph, then the grad-mode one, and the loss's dynamic last chunk (the
    pattern a compiled llama-124m run and an FSDP run stopped and resumed printed on an H200)."""
    log = "\n".join([
        "+ python train.py max_steps=20",
        "V1127 [0/1] [__recompiles] Recompiling function embed in model/llama.py:148",
        "V1127 [0/1] [__recompiles]     - 0/0: GLOBAL_STATE changed: grad_mode",
        "V1127 [1/1] [__recompiles] Recompiling function head in model/base.py:80",
        "12:23:37 step 1/20 | loss 10.9997 | lr 0.00e+00 | - tok/s | eta -",
        "12:23:37 step 2/20 | loss 11.0033 | lr 7.50e-04 | 71,990 tok/s",
        "+ python train.py max_steps=40",
        "V1127 [0/1] [__recompiles] Recompiling function grad_logits_fused in model/loss.py:58",
        "12:24:09 step 21/40 | loss 6.9734 | lr 1.76e-03 | - tok/s | eta -",
        "V1127 [0/2] [__recompiles] Recompiling function grad_logits_fused in model/loss.py:58",
    ])  # fmt: skip
    assert train_run.count_recompiles(log) == (1, 3)
    assert train_run.count_recompiles(log.rsplit("\n", 1)[0]) == (0, 3)
