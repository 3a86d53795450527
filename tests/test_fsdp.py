"""parallel=fsdp (trainer/fsdp.py): the same numbers as DDP and as one process, DCP checkpoints
that reshard (FSDP(2) -> DDP(2), FSDP(2) -> 1 process, DDP(2) -> FSDP(2)), the config's rules.

The two-process runs are shared by the tests of this module (one DDP and one FSDP run of adamw,
each saving at steps 3 and 6, and the two MARS runs under FSDP); runs that share a torchrun are
the jobs of one --multirun (one process group for the jobs, as a sweep): the module starts five
torchruns."""

import pytest
import torch
from test_train import _cli, read_metrics, run

from helpers import FAST, fast_config
from trainer.checkpoint import latest_checkpoint, load_checkpoint, model_state
from trainer.config import TrainConfig, checkpointing

STEPS = ["max_steps=6", "ckpt_every=3", "keep_checkpoints=0", "eval_every=3",
         "schedule.decay_steps=6", "micro_batch_size=2"]  # fmt: skip
MARS = ["mars-adamw", "mars-adamw-exact"]


def metrics(out_dir, first_step=1):
    """{(step, key): value} of the train and validation records from ``first_step`` on."""
    out = {}
    for r in read_metrics(out_dir):
        for key in ("train_loss", "grad_norm", "val_loss"):
            if key in r and r["step"] >= first_step:
                out[(r["step"], key)] = r[key]
    return out


# The grad norm is float32 arithmetic over ~10^6 squares whose summation order depends on the
# sharding: DDP's and FSDP's norms of the *same* gradients (checked equal in float64) differ by up
# to ~1e-4 relative, and one process's equals DDP's. Losses and weights are held to ``rel``.
NORM_REL = 3e-4


def assert_close_metrics(a: dict, b: dict, rel: float) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        tol = max(rel, NORM_REL) if k[1] == "grad_norm" else rel
        assert b[k] == pytest.approx(a[k], rel=tol, abs=tol), (k, a[k], b[k])


def assert_close_weights(a, b, rel: float) -> None:
    wa, wb = (
        load_checkpoint(latest_checkpoint(a))["model"],
        load_checkpoint(latest_checkpoint(b))["model"],
    )
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=rel, atol=rel, msg=k)


def two(out_dir, sotu_dir, *overrides) -> None:
    args = [*FAST, f"data.dir={sotu_dir}", *STEPS, f"out_dir={out_dir}", *overrides]
    proc = _cli(args, nproc=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]


def two_sweep(root, sotu_dir, key: str, values: list[str], *overrides) -> None:
    """``two`` for each of ``values`` of ``key`` as the jobs of one --multirun in one torchrun
    (one process group for both, as a sweep); job ``value`` in ``root / value``."""
    args = ["--multirun", *FAST, f"data.dir={sotu_dir}", *STEPS, *overrides,
            f"{key}={','.join(values)}", f"hydra.sweep.dir={root}",
            "hydra.sweep.subdir=${hydra.job.num}"]  # fmt: skip
    proc = _cli(args, nproc=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for i, value in enumerate(values):  # the jobs run in the order of the values
        (root / str(i)).rename(root / value)
        assert (root / value / "summary.json").is_file(), value


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sotu_dir):
    """Uninterrupted adamw runs: one process, DDP(2) and FSDP(2), DCP checkpoints at 3 and 6."""
    root = tmp_path_factory.mktemp("fsdp_runs")
    two_sweep(root, sotu_dir, "parallel", ["fsdp", "ddp"], "checkpoint_format=dcp")
    run(root / "one", sotu_dir, *STEPS, "checkpoint_format=dcp")
    return root


@pytest.fixture(scope="module")
def mars_fsdp(tmp_path_factory, sotu_dir):
    """MARS approximate and exact (its reference pass), 3 steps under FSDP(2)."""
    root = tmp_path_factory.mktemp("fsdp_mars")
    two_sweep(root, sotu_dir, "optimizer", MARS, "parallel=fsdp", "max_steps=3")
    return root


# --- the config -------------------------------------------------------------------------------


def test_parallel_is_checked_and_fsdp_writes_dcp():
    with pytest.raises(ValueError, match="unknown parallel 'zero'; valid: \\['ddp', 'fsdp'\\]"):
        TrainConfig(parallel="zero")
    assert TrainConfig(parallel="fsdp", checkpoint_format="file").checkpoint_format == "dcp"
    assert checkpointing(TrainConfig(parallel="fsdp"), 1)["format"] == "dcp"
    assert checkpointing(TrainConfig(), 1)["format"] == "file"
    # asynchronous under FSDP too: the shards' local blocks staged (trainer/dcp_checkpoint.py)
    assert checkpointing(TrainConfig(parallel="fsdp", async_checkpoint=True), 2)["asynchronous"]


def test_fsdp_with_one_process_is_the_plain_model(tmp_path, sotu_dir):
    """As torchtitan: nothing to shard, so the numbers are bit for bit those of parallel=ddp."""
    run(tmp_path / "ddp", sotu_dir, "max_steps=2", "checkpoint_format=dcp")
    run(tmp_path / "fsdp", sotu_dir, "max_steps=2", "parallel=fsdp")
    assert metrics(tmp_path / "ddp") == metrics(tmp_path / "fsdp")
    assert latest_checkpoint(tmp_path / "fsdp").is_dir()  # fsdp writes DCP checkpoints


# --- two gloo processes -------------------------------------------------------------------------


@pytest.mark.slow
def test_fsdp_equals_ddp_equals_one_process(runs):
    """adamw: every logged number and the final weights of FSDP(2), DDP(2) and one process."""
    one, ddp, fsdp = metrics(runs / "one"), metrics(runs / "ddp"), metrics(runs / "fsdp")
    assert_close_metrics(ddp, fsdp, 1e-5)
    assert_close_metrics(one, fsdp, 1e-5)
    assert_close_weights(runs / "ddp", runs / "fsdp", 1e-5)
    assert_close_weights(runs / "one", runs / "fsdp", 1e-5)


@pytest.mark.slow
def test_fsdp_checkpoint_reads_whole_with_ddp_keys(runs):
    """Every rank wrote its shards; read back on one process: full tensors under DDP's keys."""
    step3 = runs / "fsdp" / "checkpoints" / "step_0000003"
    assert sorted(p.name for p in step3.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    sharded, replicated = (
        load_checkpoint(step3),
        load_checkpoint(runs / "ddp" / "checkpoints" / "step_0000003"),
    )
    assert sharded["model"].keys() == replicated["model"].keys()
    for k, v in replicated["model"].items():
        assert sharded["model"][k].shape == v.shape, k
    so, ro = sharded["optimizer"], replicated["optimizer"]
    assert so["param_groups"] == ro["param_groups"] and so["state"].keys() == ro["state"].keys()
    for i, s in ro["state"].items():
        assert so["state"][i].keys() == s.keys()
        for name, v in s.items():
            assert torch.as_tensor(so["state"][i][name]).shape == torch.as_tensor(v).shape
    from evals.loading import load_model  # eval.py and export read it as they read DDP's

    loaded = load_model(step3)
    assert loaded.step == 3
    for k, v in loaded.model.state_dict().items():
        assert torch.equal(v, sharded["model"].get(k, v)), k


@pytest.mark.slow
def test_fsdp_resumes_under_ddp(runs, sotu_dir, tmp_path):
    out = tmp_path / "ddp_from_fsdp"
    two(out, sotu_dir, f"resume={runs / 'fsdp' / 'checkpoints' / 'step_0000003'}")
    assert_close_metrics(metrics(runs / "fsdp", 4), metrics(out), 1e-6)
    assert_close_weights(runs / "fsdp", out, 1e-6)


@pytest.mark.slow
def test_ddp_resumes_under_fsdp(runs, sotu_dir, tmp_path):
    out = tmp_path / "fsdp_from_ddp"
    resume = f"resume={runs / 'ddp' / 'checkpoints' / 'step_0000003'}"
    two(out, sotu_dir, "parallel=fsdp", resume)
    assert_close_metrics(metrics(runs / "ddp", 4), metrics(out), 1e-6)
    assert_close_weights(runs / "ddp", out, 1e-6)


@pytest.mark.slow
def test_fsdp_resumes_under_fsdp(runs, sotu_dir, tmp_path):
    out = tmp_path / "fsdp_again"
    two(out, sotu_dir, "parallel=fsdp", f"resume={runs / 'fsdp' / 'checkpoints' / 'step_0000003'}")
    assert_close_metrics(metrics(runs / "fsdp", 4), metrics(out), 1e-6)
    assert_close_weights(runs / "fsdp", out, 1e-6)


@pytest.mark.slow
def test_fsdp_resumes_in_one_process(runs, sotu_dir, tmp_path):
    out = tmp_path / "one_from_fsdp"
    run(out, sotu_dir, *STEPS, f"resume={runs / 'fsdp' / 'checkpoints' / 'step_0000003'}")
    assert_close_metrics(metrics(runs / "fsdp", 4), metrics(out), 1e-5)  # 1 vs 2 processes
    assert_close_weights(runs / "fsdp", out, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", MARS)
def test_mars_under_fsdp_equals_one_process(tmp_path, sotu_dir, mars_fsdp, optimizer):
    """MARS (approximate, and exact with its reference pass) under FSDP(2) and one process."""
    fsdp = mars_fsdp / optimizer
    run(tmp_path / "one", sotu_dir, *STEPS, f"optimizer={optimizer}", "max_steps=3")
    assert_close_metrics(metrics(tmp_path / "one"), metrics(fsdp), 1e-5)
    assert_close_weights(tmp_path / "one", fsdp, 1e-5)


def test_model_state_of_a_plain_model_stores_the_tied_head_once(tmp_path, sotu_dir):
    typed, _ = fast_config(tmp_path, sotu_dir)
    from model import GPT

    state = model_state(GPT(typed.model))
    assert "transformer.wte.weight" in state and "lm_head.weight" not in state


# --- the memory model -----------------------------------------------------------------------------


def test_fsdp_memory_parts_are_the_arithmetic():
    """trainer/memory_model.py: the sharded parts are 1/N of DDP's, plus the gathered units."""
    from bench.harness import model_config
    from model import GPT
    from trainer.memory_model import estimate_fsdp_memory, estimate_memory, rank_memory

    cfg = model_config("gpt2-medium")
    with torch.device("meta"):
        model = GPT(cfg)
    n = model.num_params()
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    root = n - cfg.n_layer * block  # embeddings, ln_f, the tied head
    kw = dict(state_bytes=8 * n, micro_batch=15)
    ddp = estimate_memory(cfg, ddp=True, **kw)
    four = estimate_fsdp_memory(cfg, world_size=4, **kw)
    assert (four.weights, four.grads, four.optimizer_state) == (n, n, 2 * n)  # 4n, 4n, 8n over 4
    assert four.step_temporaries == n and four.ddp_buckets == 0
    assert four.bf16_weights == 2 * cfg.vocab_size * cfg.n_embd  # autocast's copy of the head
    assert four.gathered == 4 * root + 2 * 2 * block + 4 * max(root, block)  # the root in fp32
    assert (four.activations, four.loss) == (ddp.activations, ddp.loss)
    static = 4 * n + four.bf16_weights + four.gathered
    assert four.allocated == static + max(ddp.activations + ddp.loss, n)
    assert four.total == four.allocated + four.cuda_context + four.fragmentation
    assert four.total < rank_memory(cfg, parallel="fsdp", world_size=2, **kw).total < ddp.total
    assert rank_memory(cfg, parallel="fsdp", world_size=1, **kw) == estimate_memory(cfg, **kw)
    with pytest.raises(ValueError, match="unknown parallel 'zero'"):
        rank_memory(cfg, parallel="zero", world_size=2, **kw)
