"""The contract every registered optimizer keeps (run over optim.available()), and training runs:
every optimizer lowers the loss of a small GPT; exact mode through the training loop."""

import copy
import dataclasses
import io

import numpy as np
import pytest
import torch

import optim
from model import GPT, GPTConfig

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)
NAMES = optim.available()


def make(name, seed=0, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**SMALL))
    cfg = optim.get_spec(name).config_cls(**overrides)
    opt = optim.build_optimizer(model, cfg)
    optim.set_initial_lr(opt)
    return model, opt


def batch(step, vocab=64, bsz=4, seq=16):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, vocab, (bsz, seq + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def grad_step(model, opt, step, set_to_none=True):
    if getattr(opt, "needs_reference_grad", False):
        x, y = batch(step + 1)
        model(x, y)[1].backward()
        opt.store_reference_grad()
        opt.zero_grad(set_to_none=set_to_none)
    x, y = batch(step)
    loss = model(x, y)[1]
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)
    return loss.item()


def exact_variants():
    out = []
    for name in NAMES:
        fields = {f.name for f in dataclasses.fields(optim.get_spec(name).config_cls)}
        out.append((name, {}))
        if "mode" in fields:
            out.append((name, {"mode": "exact"}))
    return out


VARIANTS = exact_variants()
IDS = [f"{n}-exact" if kw else n for n, kw in VARIANTS]


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_state_dict_round_trip_and_resume(name, kw):
    straight, opt = make(name, **kw)
    for step in range(6):
        grad_step(straight, opt, step)

    model, opt = make(name, **kw)
    for step in range(3):
        grad_step(model, opt, step)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed, opt2 = make(name, seed=1, **kw)  # different init: everything must come from disk
    resumed.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    for step in range(3, 6):
        grad_step(resumed, opt2, step)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_zero_grad_either_way(name, kw):
    finals = []
    for set_to_none in (True, False):
        model, opt = make(name, **kw)
        for step in range(4):
            grad_step(model, opt, step, set_to_none=set_to_none)
        finals.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*finals):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_parameters_without_grad_untouched(name):
    model, opt = make(name)
    frozen = [model.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].ln_1.weight]
    before = [p.detach().clone() for p in frozen]
    for step in range(3):
        x, y = batch(step)
        model(x, y)[1].backward()
        for p in frozen:
            p.grad = None
        if getattr(opt, "needs_reference_grad", False):
            opt.store_reference_grad()
        opt.step()
        opt.zero_grad()
    for p, b in zip(frozen, before):
        assert torch.equal(p, b)
        assert p not in opt.state or not opt.state[p]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("field,value", [("lr", -1.0), ("weight_decay", -0.1), ("betas", [1.5])])
def test_bad_hyperparameters_rejected(name, field, value):
    cls = optim.get_spec(name).config_cls
    names = {f.name for f in dataclasses.fields(cls)}
    if field not in names:
        field = {"betas": "adamw_betas"}.get(field, field)
    if field not in names:
        pytest.skip(f"{name} has no {field}")
    with pytest.raises(ValueError):
        cls(**{field: value})


@pytest.mark.parametrize("name", NAMES)
def test_lr_scheduler_and_groups(name):
    model, opt = make(name)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    grad_step(model, opt, 0)
    sched.step()
    assert all(g["lr"] == pytest.approx(0.5 * g["initial_lr"]) for g in opt.param_groups)
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # each exactly once


@pytest.fixture(scope="module")
def text_tokens(sotu_dir):
    from data import load_shard

    files = sorted(sotu_dir.glob("sotu_train_*.bin"))
    return np.asarray(load_shard(files[0])[:100_000], dtype=np.int64) % 256


@pytest.mark.parametrize("name,kw", VARIANTS, ids=IDS)
def test_every_optimizer_lowers_the_loss(name, kw, text_tokens):
    """40 steps of a small GPT on real text (tokens folded into 256 ids), default config."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=256, n_layer=2, n_head=2, n_embd=32))
    opt = optim.build_optimizer(model, optim.get_spec(name).config_cls(**kw))
    rng = np.random.default_rng(0)
    starts = [rng.integers(0, len(text_tokens) - 33, 8) for _ in range(41)]

    def get(i):
        w = torch.from_numpy(np.stack([text_tokens[s : s + 33] for s in starts[i]]))
        return w[:, :-1], w[:, 1:]

    losses = []
    for step in range(40):
        if getattr(opt, "needs_reference_grad", False):
            model(*get(step + 1))[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.store_reference_grad()
            opt.zero_grad()
        loss = model(*get(step))[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1, losses


def test_deepcopy_and_registry_lists_all():
    assert {"adamw", "lion", "muon", "moonlight", "mars-adamw", "mars-lion", "mars-shampoo"} <= set(
        NAMES
    )
    assert {"mars-m", "mars-m-efficient"} <= set(NAMES)
    model, opt = make("mars-adamw")
    copy.deepcopy(opt.state_dict())
