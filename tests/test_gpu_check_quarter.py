"""The 15-minute GPU check (bench.gpu_check --plan quarter): its parts fit calls of 540 s, the
steps come in the order the issue asks, every step leaves its record before the next starts,
and pytest's outcomes become the gpu-tests record that bench.tables says in a sentence."""

import json
import subprocess
import sys
from pathlib import Path

from bench import gpu_check, gpu_steps, tables

ROOT = Path(__file__).resolve().parent.parent


def test_the_quarter_plan_fits_its_calls_in_order(tmp_path):
    every = gpu_steps.quarter_steps(80.0, tmp_path)
    names = [s.name for s in every]
    assert names == ["host-sync", "gpu-tests", "optim-4096", "optim-2048", "optim-1024", "llama",
                     "crossover-b131072-fp32"]  # fmt: skip
    packed = gpu_check.parts(every, gpu_check.QUARTER_BUDGET_S)
    assert len(packed) == 2
    assert all(sum(s.limit_s for s in p) + gpu_check.STARTUP_S <= 540 for p in packed)
    assert sum(s.limit_s for s in every) + 2 * gpu_check.STARTUP_S <= 15 * 60 - 60
    assert gpu_steps.HOST_SYNC in every[0].argv
    assert gpu_steps.HOST_SYNC in every[1].argv[every[1].argv.index("--deselect") + 1]


def test_the_llama_step_is_the_experiments_batch_and_routing(tmp_path):
    step = {s.name: s for s in gpu_steps.quarter_steps(80.0, tmp_path)}["llama"]
    argv = step.argv
    mb, accum = int(argv[argv.index("--micro-batch") + 1]), int(argv[argv.index("--accum") + 1])
    assert mb * accum * 512 == 131072  # configs/shared/llama-124m.yaml: 64 x 4 x 512
    assert argv[argv.index("--muon-routing") + 1] == "recommended"
    assert "--out" in argv


def test_the_optimizer_steps_time_three_blocks_in_three_processes(tmp_path):
    steps = {s.name: s for s in gpu_steps.quarter_steps(80.0, tmp_path)}
    for block in (4096, 2048, 1024):
        argv = steps[f"optim-{block}"].argv
        assert argv[argv.index("--block") + 1] == str(block)
        assert argv[argv.index("--processes") + 1] == "3"
        assert "--kernels" in argv and argv[argv.index("--out") + 1] == str(tmp_path)


def test_the_crossover_cell_runs_in_true_float32(tmp_path):
    import yaml

    step = {s.name: s for s in gpu_steps.quarter_steps(80.0, tmp_path)}["crossover-b131072-fp32"]
    assert "b131072-fp32" in step.argv
    study = yaml.safe_load((ROOT / "configs/experiment/study.yaml").read_text())
    assert (study["dtype"], study["tf32"]) == ("float32", False)


def test_dry_run_prints_parts_and_limits():
    out = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--plan", "quarter",
                          "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout  # fmt: skip
    assert "part 1:" in out and "part 2:" in out and "<= budget 540 s" in out
    assert out.index("host-sync (45 s)") < out.index("gpu-tests (") < out.index("llama (")


def test_junit_outcomes_become_the_gpu_tests_record(tmp_path):
    xml = tmp_path / "t.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok" time="0.5"/>'
        '<testcase classname="tests.test_a" name="test_bad[x]" time="1.0">'
        '<failure message="RuntimeError: called a synchronizing CUDA operation">tb</failure>'
        "</testcase>"
        '<testcase classname="tests.test_b" name="test_skip" time="0">'
        '<skipped message="needs a CUDA device"/></testcase>'
        "</testsuite></testsuites>"
    )
    lines = gpu_check.junit_lines(xml)
    assert [(t["test"], t["outcome"]) for t in lines] == [
        ("tests.test_a::test_ok", "passed"), ("tests.test_a::test_bad[x]", "failed"),
        ("tests.test_b::test_skip", "skipped")]  # fmt: skip
    assert lines[1]["message"].startswith("RuntimeError")
    assert gpu_check.junit_lines(tmp_path / "absent.xml") == []
    step = gpu_steps.Step("gpu-tests", "w", ["pytest"], 10, xml)
    gpu_check.keep_step(tmp_path, step, {"status": "failed", "rc": 1, "seconds": 2.0}, set())
    rec = [json.loads(x) for x in (tmp_path / "gpu-tests.jsonl").read_text().splitlines()]
    assert [r["event"] for r in rec] == ["about", "device", "gpu-tests", "test", "test", "test"]
    rec[1].update(gpu="GPU X", torch="2.x", triton="3.y", commit="abc")
    said = tables.gpu_tests(rec)
    assert "1 passed, 1 failed, 1 skipped" in said and "GPU X" in said
    steps = [json.loads(x) for x in (tmp_path / "gpu-check.jsonl").read_text().splitlines()]
    assert steps[0]["step"] == "gpu-tests" and "gpu-tests.jsonl" in steps[0]["files"]


def test_each_step_writes_its_record_before_the_next(tmp_path):
    """On the CPU: the optimizer step at block 1024 and the llama step, tiny; each step's line
    in gpu-check.jsonl names the record files it wrote."""
    rec, out = tmp_path / "rec", tmp_path / "report.md"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--plan", "quarter", "--cpu",
                           "--skip-preflight", "--only", "optim-1024", "llama", "--records",
                           str(rec), "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (rec / "gpu-check.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines] == ["device", "step", "step"]
    optim_step, llama = lines[1], lines[2]
    assert optim_step["step"] == "optim-1024" and optim_step["status"] == "ok"
    (first,) = [f for f in optim_step["files"] if f.startswith("optim-step-")]
    r = json.loads((rec / first).read_text())
    assert (r["kind"], r["block"], r["warps"], r["process"]) == ("optim-step", 1024, 4, 1)
    assert r["facts"]["torch"] and "commit" in r and len(r["rounds"]) == 1
    trains = [json.loads((rec / f).read_text()) for f in llama["files"]]
    assert {t["optimizer"] for t in trains} == {"adamw", "mars-adamw", "muon"}
    assert {t["routing"] for t in trains if t["optimizer"] == "muon"} == {"recommended"}
    assert all(t["kind"] == "train" and t["tok_s"] > 0 for t in trains)
