"""Hugging Face export and import: logits equal both ways, tokenizer files equal to tiktoken."""

import json
from dataclasses import asdict

import pytest
import torch

from data.tokenizer import encode
from model import GPT, GPTConfig
from model.hf import load_hf, save_hf
from model.hf_tokenizer import gpt2_vocab_and_merges
from trainer import checkpoint as ckpt

transformers = pytest.importorskip("transformers")

SAMPLE = (
    "Mr. Speaker, Mr. Vice President, Members of Congress: it's 2024, and we've   got\n\n"
    "work to do -- 1,234.56 dollars! Ünïcödé, 中文, emoji 😀 and\ttabs; don't stop.  "
)


def _ids(n=2, t=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50257, (n, t), generator=g)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random bias-free GPT with the papers' 1/(layer+1) attention scaling, exported."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        block_size=32, n_layer=2, n_head=2, n_embd=32, scale_attn_by_inverse_layer_idx=True
    )
    model = GPT(cfg).eval()
    out = tmp_path_factory.mktemp("hf") / "export"
    save_hf(model, out)
    return model, out


def test_export_loads_in_transformers_with_equal_logits(exported):
    model, out = exported
    config = json.loads((out / "config.json").read_text())
    assert config["scale_attn_by_inverse_layer_idx"] is True and config["vocab_size"] == 50257
    assert config["n_positions"] == 32 and config["activation_function"] == "gelu_new"
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    x = _ids()
    with torch.no_grad():
        ours, theirs = model(x)[0], hf(x).logits
    assert theirs.shape == (2, 24, 50257)
    torch.testing.assert_close(theirs, ours[..., :50257], atol=1e-5, rtol=1e-5)


def test_exported_tokenizer_equals_tiktoken(exported):
    _, out = exported
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok(SAMPLE, add_special_tokens=False)["input_ids"] == encode(SAMPLE)
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok.eos_token_id == 50256


def test_merges_rebuilt_from_ranks():
    vocab, merges = gpt2_vocab_and_merges()
    assert len(vocab) == 50257 and len(merges) == 50000  # as GPT-2's vocab.json / merges.txt
    assert merges[0] == ("Ġ", "t") and vocab["Ġthe"] == 262


def test_import_random_transformers_model(tmp_path):
    torch.manual_seed(1)
    hf_cfg = transformers.GPT2Config(
        vocab_size=50257,
        n_positions=40,
        n_embd=32,
        n_layer=3,
        n_head=4,
        scale_attn_by_inverse_layer_idx=True,
    )
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():  # HF initialises biases to zero: make them matter
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert ours.config.bias and ours.config.scale_attn_by_inverse_layer_idx
    assert (ours.config.block_size, ours.config.vocab_size) == (40, 50257)
    x = _ids(3, 40, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], hf(x).logits, atol=1e-5, rtol=1e-5)
    # and back out again: the round trip keeps the function
    save_hf(ours, tmp_path / "again")
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, hf(x).logits, atol=1e-5, rtol=1e-5)


def test_import_of_our_export_is_exact_and_bias_free(exported, tmp_path):
    model, out = exported
    back = load_hf(out)
    assert not back.config.bias and back.config.vocab_size == 50257
    x = _ids()
    with torch.no_grad():
        assert torch.equal(back(x)[0], model(x)[0][..., :50257])
    torch.save(
        transformers.GPT2LMHeadModel.from_pretrained(out).state_dict(),
        tmp_path / "pytorch_model.bin",
    )
    (tmp_path / "config.json").write_text((out / "config.json").read_text())
    with torch.no_grad():  # the older pytorch_model.bin layout loads too
        torch.testing.assert_close(load_hf(tmp_path)(x)[0], back(x)[0])


def test_export_script_from_a_checkpoint(tmp_path, capsys):
    from scripts.export_hf import main as export_main

    torch.manual_seed(0)
    cfg = GPTConfig(name="t", block_size=16, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg)
    payload = {
        "model": model.state_dict(),
        "optimizer": {},
        "loader": {},
        "rng": [],
        "config": {"model": asdict(cfg)},
    }
    path = ckpt.save_checkpoint(tmp_path / "run", 7, payload, keep=0)
    out = export_main([str(tmp_path / "run"), str(tmp_path / "hf"), "--keep-vocab-padding"])
    printed = capsys.readouterr().out
    assert f"from {path} (step 7)" in printed and "check:" in printed
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 50304
    with pytest.raises(SystemExit, match="no such file"):
        export_main([str(tmp_path / "nothing"), str(tmp_path / "hf2")])
