"""The LLaMA-style model (model/llama.py): interface, config checks, counting, optimizer routing,
Hugging Face export and import, training and evaluation through the entry points, memory model."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

import optim
import train
from bench.memory import saved_activation_bytes
from helpers import CONFIG_DIR, fast_config
from model import GPT, CausalLM, Llama, ModelConfig, build_model
from model.base import tied_state_dict
from model.hf import load_hf, save_hf
from model.llama import LlamaBlock, rotary_tables
from optim.moonlight import MuonLikeConfig
from trainer import cli_checks
from trainer.memory_model import activation_bytes, block_activation_bytes_per_token, estimate_memory

SMALL = dict(arch="llama", block_size=32, vocab_size=96, n_layer=2, n_head=2, n_embd=32)


def preset(name: str, **changes) -> ModelConfig:
    return ModelConfig(**{**yaml.safe_load((CONFIG_DIR / "model" / f"{name}.yaml").read_text()),
                          **changes})  # fmt: skip


def test_build_model_picks_the_architecture_and_the_interface_is_gpts():
    gpt = build_model(ModelConfig(**{**SMALL, "arch": "gpt2"}))
    llama = build_model(ModelConfig(**SMALL))
    assert type(gpt) is GPT and type(llama) is Llama
    for m in (gpt, llama):
        assert isinstance(m, CausalLM) and isinstance(m.transformer, torch.nn.ModuleDict)
        assert isinstance(m.transformer.wte, torch.nn.Embedding)
        assert isinstance(m.transformer.h, torch.nn.ModuleList) and len(m.transformer.h) == 2
        assert isinstance(m.lm_head, torch.nn.Linear) and hasattr(m.transformer, "ln_f")
        for attr in ("head", "embed", "hidden_states", "blocks", "compile_regions",
                     "num_params", "flops_per_token", "generate"):  # fmt: skip
            assert callable(getattr(m, attr)), attr
    assert not any(k.endswith("bias") for k in llama.state_dict())
    assert llama.lm_head.weight is not llama.transformer.wte.weight  # untied by default
    with pytest.raises(ValueError, match="arch=gpt2"):
        GPT(ModelConfig(**SMALL))


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(arch="mamba"), "valid: gpt2, llama"),
        (dict(scale_attn_by_inverse_layer_idx=True), "arch=gpt2 only"),
        (dict(bias=True), "arch=gpt2 only"),
        (dict(arch="gpt2", rope_theta=5e5), "arch=llama only"),
        (dict(arch="gpt2", mlp_hidden=64), "arch=llama only"),
        (dict(arch="gpt2", tie_embeddings=False), "always ties"),
        (dict(n_head=32), "must be even"),
        (dict(rope_theta=0.0), "must be > 0"),
    ],
)
def test_fields_of_the_other_arch_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**SMALL, **changes})


def test_forward_paths_agree_and_generate():
    torch.manual_seed(0)
    model = Llama(ModelConfig(**SMALL))
    idx = torch.randint(0, 96, (2, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 16, 96)
    model.loss_chunk_tokens = 7
    assert model(idx, idx)[0] is None
    torch.testing.assert_close(model(idx, idx)[1], loss)
    model.loss_chunk_tokens = 0
    grads = torch.autograd.grad(model(idx, idx)[1], list(model.parameters()))
    model.activation_checkpointing = True
    again = torch.autograd.grad(model(idx, idx)[1], list(model.parameters()))
    for a, b in zip(grads, again):
        torch.testing.assert_close(a, b)
    out = model.eval().generate(idx[:, :4], 3, temperature=0)
    assert out.shape == (2, 7) and torch.equal(out[:, :4], idx[:, :4])
    with pytest.raises(ValueError, match="exceeds the model's block_size"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_rotary_is_relative():
    """q.k after RoPE depends on the positions only through their difference."""
    cos, sin = rotary_tables(12, 8, 10000.0, torch.device("cpu"))
    from model.llama import apply_rotary

    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)

    def score(i, j):
        rq = apply_rotary(q.view(1, 1, 1, 8), cos[i : i + 1].double(), sin[i : i + 1].double())
        rk = apply_rotary(k.view(1, 1, 1, 8), cos[j : j + 1].double(), sin[j : j + 1].double())
        return (rq * rk).sum().item()

    assert score(5, 2) == pytest.approx(score(9, 6), rel=1e-6)
    assert score(0, 0) == pytest.approx((q * k).sum().item())


def test_init_follows_the_benchmark():
    torch.manual_seed(0)
    cfg = ModelConfig(**{**SMALL, "n_embd": 256, "n_head": 4, "n_layer": 8, "vocab_size": 4096})
    model = Llama(cfg)
    scaled = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, p in model.named_parameters():
        if p.ndim == 1:
            assert torch.equal(p, torch.ones_like(p)), name  # RMSNorm gains
        else:
            want = scaled if name.endswith("c_proj.weight") else 0.02
            assert p.std().item() == pytest.approx(want, rel=0.1), name


@pytest.mark.parametrize("tie", [False, True])
def test_num_params_and_flops_equal_a_direct_count(tie):
    cfg = ModelConfig(**{**SMALL, "tie_embeddings": tie, "mlp_hidden": 80})
    model = Llama(cfg)
    L, C, F, V, T = cfg.n_layer, cfg.n_embd, 80, cfg.vocab_size, cfg.block_size
    block = 4 * C * C + 3 * C * F + 2 * C  # q, k, v, o; gate, up, down; two RMSNorm gains
    body = L * block + C  # + the final norm
    embeddings = V * C * (1 if tie else 2)
    assert model.num_params() == body + embeddings
    # FLOPs count the head (a matmul) but not an untied input table (a lookup)
    assert model.num_params(non_embedding=True) == body + V * C
    assert model.flops_per_token() == 6 * (body + V * C) + 12 * L * C * T
    assert model.flops_per_token(8) == 6 * (body + V * C) + 12 * L * C * 8


def test_presets_have_the_benchmark_sizes():
    counts = {}
    for name in ("llama-124m", "llama-210m", "llama-720m", "llama-tiny"):
        with torch.device("meta"):
            counts[name] = build_model(preset(name)).num_params()
    assert counts["llama-124m"] == 123_587_328 and counts["llama-210m"] == 208_540_416
    assert counts["llama-720m"] == 719_636_480 and counts["llama-tiny"] < 15e6
    assert preset("llama-720m").ffn_hidden == 5632  # 2/3 * 4 * 2048 rounded up to 256


def test_tied_llama_checkpoints_store_the_head_once():
    cfg = ModelConfig(**{**SMALL, "tie_embeddings": True})
    a, b = Llama(cfg), Llama(cfg)
    assert a.lm_head.weight is a.transformer.wte.weight
    stored = tied_state_dict(a)
    assert "lm_head.weight" not in stored
    b.load_state_dict(stored)
    assert torch.equal(b.lm_head.weight, a.lm_head.weight)
    assert b.lm_head.weight is b.transformer.wte.weight


# --- optimizer routing ----------------------------------------------------------------------------

# Where each tensor of llama-tiny goes, per registered optimizer (defaults): "ns" Newton-Schulz
# (Muon family), "mars" the MARS branch, "adamw" an AdamW (backup) part, "lion" the Lion update;
# "+wd" decayed, "-wd" not. Kinds: wte embedding, c_attn / w1 matrices, ln_1 gain, lm_head the
# untied head. docs/models.md prints this table. A config of a family (``FAMILIES``: every
# ``MarsConfig`` on MARS's official routing, non-2-D on AdamW; every ``MuonLikeConfig`` on
# Moonlight's) takes its family's row; any other optimizer has its own row in ``ROUTING``.
PARAMS = ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
          "transformer.h.0.mlp.w1.weight", "transformer.h.0.ln_1.weight", "lm_head.weight")  # fmt: skip
FAMILIES = {
    optim.MarsConfig: ("mars-wd", "mars+wd", "mars+wd", "adamw+wd", "mars-wd"),
    MuonLikeConfig: ("adamw+wd", "ns+wd", "ns+wd", "adamw+wd", "adamw+wd"),
}
ROUTING = {
    "adamw": ("adamw-wd", "adamw+wd", "adamw+wd", "adamw-wd", "adamw-wd"),
    "lion": ("lion-wd", "lion+wd", "lion+wd", "lion-wd", "lion-wd"),
    "muon": ("ns-wd", "ns-wd", "ns-wd", "adamw+wd", "ns-wd"),  # the MARS repo: every 2-D tensor
    # the baselines of docs/optimizers.md: every tensor on the optimizer, decay on block matrices
    "adamw-schedulefree": (
        "adamwschedulefree-wd",
        "adamwschedulefree+wd",
        "adamwschedulefree+wd",
        "adamwschedulefree-wd",
        "adamwschedulefree-wd",
    ),
    "ademamix": ("ademamix-wd", "ademamix+wd", "ademamix+wd", "ademamix-wd", "ademamix-wd"),
    "soap": ("soap-wd", "soap+wd", "soap+wd", "soap-wd", "soap-wd"),
    # NorMuon: block matrices on NorMuon, the rest on its auxiliary Adam (no decay: its reference)
    "normuon": ("adam-wd", "normuon-wd", "normuon-wd", "adam-wd", "adam-wd"),
}


def expected_routing(name: str) -> tuple[str, ...]:
    """Where ``name`` puts each of ``PARAMS``: its row, else its family's; AssertionError with one
    line naming the table to extend."""
    if name in ROUTING:
        return ROUTING[name]
    cls = optim.get_spec(name).config_cls
    for family, row in FAMILIES.items():
        if issubclass(cls, family):
            return row
    raise AssertionError(
        f"tests/test_llama.py ROUTING has no row for {name!r} ({cls.__name__} is of no family of "
        "FAMILIES): add where it puts each of PARAMS (docs/adding-an-optimizer.md)"
    )


def route_of(opt: torch.optim.Optimizer, p: torch.Tensor) -> str:
    """Which update ``p`` takes in ``opt`` and whether it is decayed."""
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    wd = group["weight_decay"]
    if "use_muon" in group:
        branch = "ns" if group["use_muon"] else "adamw"
    elif group.get("split_1d") is not None and "lr_1d_factor" in group:  # MARS
        branch = "adamw" if group["split_1d"] and p.ndim != 2 else "mars"
        wd = group["weight_decay_1d"] if branch == "adamw" else wd
    elif type(opt).__name__ == "VarianceReduced":  # the core's baselines: soap, ademamix, normuon
        branch = group["preconditioner"]
    else:
        branch = type(opt).__name__.lower()
    return f"{branch}{'+' if wd > 0 else '-'}wd"


def routes_of(model: torch.nn.Module, name: str) -> tuple[str, ...]:
    """Where ``name``'s optimizer, at its defaults, puts each of ``PARAMS`` of ``model``."""
    params = dict(model.named_parameters())
    opt = optim.build_optimizer(model, optim.get_spec(name).config_cls())
    return tuple(route_of(opt, params[n]) for n in PARAMS)


def test_every_optimizer_routes_llama_as_its_official_code():
    model = build_model(preset("llama-tiny"))
    assert set(ROUTING) <= set(optim.available())
    kinds = {k: [n for n, _ in v] for k, v in optim.classify_parameters(model).items()}
    assert kinds["head"] == ["lm_head.weight"] and kinds["embedding"] == [PARAMS[0]]
    for name in optim.available():
        assert routes_of(model, name) == expected_routing(name), name


def test_recommended_muon_keeps_head_and_embeddings_on_adamw():
    model = build_model(preset("llama-tiny"))
    opt = optim.build_optimizer(model, optim.get_spec("muon").config_cls(routing="recommended"))
    params = dict(model.named_parameters())
    assert route_of(opt, params["lm_head.weight"]) == "adamw+wd"
    assert route_of(opt, params["transformer.wte.weight"]) == "adamw+wd"
    assert route_of(opt, params["transformer.h.0.mlp.w1.weight"]) == "ns-wd"


def test_a_tied_head_stays_an_embedding():
    model = build_model(preset("llama-tiny", tie_embeddings=True))
    kinds = optim.classify_parameters(model)
    assert kinds["head"] == [] and [n for n, _ in kinds["embedding"]] == [PARAMS[0]]


# --- Hugging Face ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tie,theta", [(False, 10000.0), (True, 500000.0)])
def test_export_equals_transformers_and_round_trips_exactly(tmp_path, tie, theta):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    torch.manual_seed(0)
    cfg = preset("llama-tiny", n_layer=2, block_size=32, tie_embeddings=tie, rope_theta=theta)
    model = Llama(cfg).eval()
    save_hf(model, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is tie
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "a").eval()
    x = torch.randint(0, 50257, (2, 24))
    with torch.no_grad():
        ours, theirs = model(x)[0][..., :50257], hf(x).logits
    assert theirs.shape == (2, 24, 50257)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    back = load_hf(tmp_path / "a")
    assert back.config.tie_embeddings is tie and back.config.rope_theta == theta
    save_hf(back, tmp_path / "b")
    a, b = (
        load_file(tmp_path / "a" / "model.safetensors"),
        load_file(tmp_path / "b" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "b" / "config.json").read_text() == (
        tmp_path / "a" / "config.json"
    ).read_text()


def test_import_random_transformers_llama(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    hf_cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=72,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, max_position_embeddings=40,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False)  # fmt: skip
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # HF initialises the norms to one: make them matter
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert (ours.config.mlp_hidden, ours.config.norm_eps, ours.config.block_size) == (72, 1e-6, 40)
    x = torch.randint(0, 300, (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], hf(x).logits, atol=1e-4, rtol=1e-4)
    gqa = json.loads((tmp_path / "config.json").read_text()) | {"num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(gqa))
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        load_hf(tmp_path)


# --- training, evaluation and export through the entry points ----------------------------------


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, sotu_dir):
    """A 6-step llama-tiny run (narrowed by the fast settings) with a checkpoint at step 6."""
    out = tmp_path_factory.mktemp("llama") / "run"
    typed, plain = fast_config(out, sotu_dir, "model=llama-tiny", "max_steps=6", "eval_every=3",
                               "model.rope_theta=5e5")  # fmt: skip
    assert typed.model.arch == "llama" and typed.model.rope_theta == 5e5
    train.train(typed, plain)
    return out


def test_train_py_trains_llama(llama_run):
    records = [json.loads(x) for x in (llama_run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert all(r["mfu"] >= 0 for r in records if "mfu" in r)
    saved = yaml.safe_load((llama_run / "config.yaml").read_text())
    assert saved["model"]["arch"] == "llama" and saved["model"]["tie_embeddings"] is False


def test_eval_and_export_of_a_llama_checkpoint(llama_run, tmp_path, capsys):
    import importlib

    from hydra import compose, initialize_config_dir

    from helpers import compose_config  # noqa: F401  (Hydra's schemas registered)

    eval_py = importlib.import_module("eval")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="eval", overrides=[f"checkpoint={llama_run}", "tasks=[val]",
                                                      "progress=false"])  # fmt: skip
    rec = eval_py.evaluate(eval_py.to_typed(cfg))
    logged = [json.loads(x) for x in (llama_run / "metrics.jsonl").read_text().splitlines()]
    assert rec["step"] == 6
    assert rec["results"]["val"]["loss"] == [r for r in logged if "val_loss" in r][-1]["val_loss"]
    from scripts.export_hf import main as export_main

    out = export_main([str(llama_run), str(tmp_path / "hf")])
    assert "check: transformers' logits differ" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_command_line_names_are_checked_before_torch():
    Override = cli_checks.Override
    cli_checks.check_train_overrides([Override("model", ("llama-tiny",)),
                                      Override("model.rope_theta"), Override("model.norm_eps"),
                                      Override("model.tie_embeddings"), Override("model.arch")])  # fmt: skip
    with pytest.raises(ValueError, match="did you mean model.rope_theta"):
        cli_checks.check_train_overrides([Override("model.rope_thetta")])
    with pytest.raises(ValueError, match="did you mean model=llama-tiny"):
        cli_checks.check_train_overrides([Override("model", ("llama-tinny",))])


# --- memory model --------------------------------------------------------------------------------


def _per_64_tokens(fn_of_batch, params) -> int:
    """Saved bytes per 64 more tokens (two batch sizes: autocast's weight copies cancel)."""
    return saved_activation_bytes(lambda: fn_of_batch(2), params) - saved_activation_bytes(
        lambda: fn_of_batch(1), params
    )


@pytest.mark.parametrize("low_precision", [False, True])
def test_llama_activations_match_saved_tensors(low_precision):
    cfg = ModelConfig(**{**SMALL, "block_size": 64, "n_embd": 64, "n_head": 4, "mlp_hidden": 160})
    block = LlamaBlock(cfg).train()
    cos, sin = rotary_tables(64, 16, 1e4, torch.device("cpu"))

    def block_of(batch):
        x = torch.randn(batch, 64, 64, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low_precision):
            return block(x, cos, sin)

    want = 64 * block_activation_bytes_per_token(cfg, low_precision=low_precision)
    assert _per_64_tokens(block_of, list(block.parameters())) == want
    model = Llama(cfg).train()
    model.loss_chunk_tokens = 32

    def model_of(batch):
        idx = torch.randint(0, 96, (batch, 64))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low_precision):
            return model(idx, idx)

    acts = activation_bytes(cfg, 64, low_precision=low_precision, checkpointing=False)
    assert _per_64_tokens(model_of, list(model.parameters())) == acts + 64 * 4 * 64  # + dL/dh


def test_memory_estimate_of_a_llama_preset():
    cfg = preset("llama-124m")
    est = estimate_memory(cfg, state_bytes=0, micro_batch=8)
    assert est.weights == 4 * 123_587_328
    untied = estimate_memory(
        preset("llama-124m", tie_embeddings=False), state_bytes=0, micro_batch=8
    )
    assert untied.weights - est.weights == 4 * 50304 * 768
