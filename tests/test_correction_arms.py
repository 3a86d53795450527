"""The correction on AdamW's own configuration (study/studies/crossover.yaml, corr-* and chain-*
parts; docs/study.md): MARS-AdamW with every value AdamW's and gamma = 0 *is* AdamW, on a model
with every kind of parameter (tied embedding, positions, gains, matrices), in float64, so the arm
with gamma > 0 minus AdamW's rows is the correction alone; and the arms' names carry exactly the
values the issue names."""

import torch

from model import ModelConfig, build_model
from optim import build_optimizer, get_spec
from study.variant import Variant

# AdamW's carried values at the crossover (results/referee/batch, proxy-100k 1x): the arm's.
ADAMW_VALUES = {"betas": [0.9, 0.95], "weight_decay": 0.3162, "aux_lr": 0.512}


def _model():
    torch.manual_seed(0)
    cfg = ModelConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)
    return build_model(cfg).double()


def _train(opt_name, steps=25, **values):
    model = _model()
    cfg = get_spec(opt_name).config_cls(lr=0.008, **values)
    opt = build_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, 64, (4, 16), generator=gen)
        loss = model(x, x)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the trainer's global clip
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_mars_adamw_at_gamma_zero_with_adamws_values_is_adamw_on_a_model():
    ours = _train("mars-adamw", gamma=0.0, weight_decay_1d=0.0, **ADAMW_VALUES)
    theirs = _train("adamw", **ADAMW_VALUES)
    worst = max(float((a - b).abs().max()) for a, b in zip(ours, theirs))
    assert worst < 1e-12, worst
    corrected = _train("mars-adamw", gamma=0.0528, weight_decay_1d=0.0, **ADAMW_VALUES)
    assert max(float((a - b).abs().max()) for a, b in zip(corrected, theirs)) > 1e-4


def test_the_gains_decay_is_the_one_value_between_a0_and_a1():
    a1 = _train("mars-adamw", gamma=0.0, **ADAMW_VALUES)  # weight_decay_1d: its default 0.1
    theirs = _train("adamw", **ADAMW_VALUES)
    assert max(float((a - b).abs().max()) for a, b in zip(a1, theirs)) > 1e-6


def test_the_correction_arm_fixes_every_value_adamw_differs_in():
    from study import definition as defs

    parts = defs.load("crossover").parts
    names = {p: parts[p].values["optimizers"] for p in ("corr-b2048", "corr-b8192", "corr-b32768")}
    assert len({n for v in names.values() for n in v}) == 1  # one arm at every batch
    corr = Variant.parse(names["corr-b2048"][0])
    fixed = dict(corr.fixed)
    assert fixed["gamma"] == "0.0528" and fixed["betas"] == "[0.9,0.95]"
    assert fixed["weight_decay"] == "0.3162" and fixed["weight_decay_1d"] == "0"
    assert dict(corr.run) == {"warmup_steps": "386"}
    # kappa = gamma beta1 / (1 - beta1): the paper's 0.475 (gamma 0.025 at beta1 0.95)
    assert abs(0.0528 * 0.9 / 0.1 - 0.025 * 0.95 / 0.05) < 1e-3
