import math

import pytest
import torch

import optim
from model import GPT, GPTConfig
from optim import AdamWConfig, ScheduleConfig, classify_parameters, decay_groups, lr_at

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)


def test_every_parameter_in_exactly_one_kind():
    model = GPT(GPTConfig(**SMALL, bias=True))
    kinds = classify_parameters(model)
    ids = [id(p) for group in kinds.values() for _, p in group]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    names = {k: {n for n, _ in v} for k, v in kinds.items()}
    assert names["embedding"] == {"transformer.wte.weight", "transformer.wpe.weight"}
    assert all(n.endswith(".weight") and ".ln_" not in n for n in names["matrix"])
    assert len(names["matrix"]) == 4 * 2
    assert all(n.endswith(".bias") for n in names["bias"])
    assert names["gain"] == {n for n in names["gain"] if "ln" in n} and len(names["gain"]) == 5


def test_adamw_decays_matrices_only():
    model = GPT(GPTConfig(**SMALL))
    opt = optim.build_optimizer(model, AdamWConfig(weight_decay=0.1))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    kinds = classify_parameters(model)
    assert decayed == {id(p) for _, p in kinds["matrix"]}
    with pytest.raises(ValueError, match="valid kinds"):
        decay_groups(model, 0.1, ["matrices"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_adamw_matches_torch(dtype):
    """Bit for bit torch's per-tensor loop, which our CPU build replaces by foreach."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL)).to(dtype)
    ref = GPT(GPTConfig(**SMALL)).to(dtype)
    ref.load_state_dict(model.state_dict())
    opt = optim.build_optimizer(model, AdamWConfig(lr=1e-2, weight_decay=0.1))
    assert all(g["foreach"] for g in opt.param_groups)  # on the CPU
    ref_opt = torch.optim.AdamW(decay_groups(ref, 0.1), lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                                foreach=False)  # fmt: skip
    for _ in range(5):
        x = torch.randint(0, 64, (2, 16))
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x, x)[1].backward()
            o.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _adamw_transcription(params, grads_seq, lrs_seq, wds, betas=(0.9, 0.95), eps=1e-8):
    """AdamW written out (decoupled decay, bias correction), one peak lr per tensor."""
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, (grads, lrs) in enumerate(zip(grads_seq, lrs_seq), start=1):
        for i, (p, g) in enumerate(zip(params, grads)):
            p.mul_(1 - lrs[i] * wds[i])
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            mhat, vhat = m[i] / (1 - betas[0] ** t), v[i] / (1 - betas[1] ** t)
            p.sub_(lrs[i] * mhat / (vhat.sqrt() + eps))
    return params


def test_adamw_aux_lr_matches_transcription():
    """aux_lr: every non-matrix tensor (embeddings, gains, biases) at its own peak lr, both
    scaled by the schedule; 40 steps in float64 against the written-out algorithm."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, bias=True)).double()
    params = [p.detach().clone() for p in model.parameters()]
    opt = optim.build_optimizer(model, AdamWConfig(lr=1e-2, aux_lr=3e-2, weight_decay=0.1))
    assert sorted(g.get("kind") for g in opt.param_groups) == ["aux", "decay"]
    optim.set_initial_lr(opt)
    sched = ScheduleConfig(name="cosine", warmup_steps=5, min_lr_ratio=0.1)
    matrix = {id(p) for _, p in classify_parameters(model)["matrix"]}
    peaks = [1e-2 if id(p) in matrix else 3e-2 for p in model.parameters()]
    wds = [0.1 if id(p) in matrix else 0.0 for p in model.parameters()]
    grads_seq, lrs_seq = [], []
    for step in range(40):
        optim.apply_schedule(opt, step, sched, 40)
        x = torch.randint(0, 64, (2, 16))
        opt.zero_grad()
        model(x, x)[1].backward()
        grads_seq.append([p.grad.clone() for p in model.parameters()])
        lrs_seq.append([lr_at(step, peak, sched, 40) for peak in peaks])
        opt.step()
    expected = _adamw_transcription(params, grads_seq, lrs_seq, wds)
    assert len(set(peaks)) == 2
    for a, b in zip(model.parameters(), expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="optimizer.aux_lr"):
        AdamWConfig(aux_lr=0.0)


def test_unknown_optimizer_lists_valid():
    with pytest.raises(ValueError, match="valid optimizers: .*adamw"):
        optim.get_spec("adamx")


@pytest.mark.parametrize(
    "bad", [dict(lr=-1), dict(betas=[0.9]), dict(eps=0), dict(weight_decay=-1)]
)
def test_adamw_rejects_bad_hyperparameters(bad):
    with pytest.raises(ValueError):
        AdamWConfig(**bad)


def test_cosine_schedule():
    cfg = ScheduleConfig(name="cosine", warmup_steps=10, min_lr=1e-4)
    assert lr_at(0, 1e-3, cfg, 110) == 0.0
    assert lr_at(5, 1e-3, cfg, 110) == pytest.approx(5e-4)
    assert lr_at(10, 1e-3, cfg, 110) == pytest.approx(1e-3)
    assert lr_at(60, 1e-3, cfg, 110) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert lr_at(110, 1e-3, cfg, 110) == pytest.approx(1e-4)
    assert lr_at(500, 1e-3, cfg, 110) == pytest.approx(1e-4)
    r = 0.3
    step = 10 + int(r * 100)
    expected = 1e-4 + 0.5 * (1 + math.cos(math.pi * r)) * (1e-3 - 1e-4)
    assert lr_at(step, 1e-3, cfg, 110) == pytest.approx(expected)


def test_wsd_and_constant():
    wsd = ScheduleConfig(name="wsd", warmup_steps=10, min_lr=0.0, decay_frac=0.2)
    assert lr_at(50, 1.0, wsd, 100) == 1.0
    assert lr_at(80, 1.0, wsd, 100) == pytest.approx(1.0)
    assert lr_at(90, 1.0, wsd, 100) == pytest.approx(0.5)
    assert lr_at(100, 1.0, wsd, 100) == 0.0
    const = ScheduleConfig(name="constant", warmup_steps=4)
    assert lr_at(2, 1.0, const, 100) == 0.5 and lr_at(99, 1.0, const, 100) == 1.0
    with pytest.raises(ValueError, match="valid schedules"):
        ScheduleConfig(name="linear")


def test_apply_schedule_uses_each_groups_peak():
    p, q = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": 1.0}, {"params": [q], "lr": 0.5}])
    optim.set_initial_lr(opt)
    cfg = ScheduleConfig(name="cosine", warmup_steps=2, min_lr=0.0)
    optim.apply_schedule(opt, 1, cfg, 10)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.25]
