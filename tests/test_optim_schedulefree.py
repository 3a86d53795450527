"""adamw-schedulefree (optim/schedulefree.py) against the reference package ``schedulefree``
(facebookresearch/schedule_free, requirements-dev.txt) on the same parameters and gradients in
float64, and its train/eval weight switch wired into evaluation, checkpoints and resume."""

import copy
import json

import pytest
import torch

import optim
import train
import trainer.trainer as trainer_mod
from helpers import fast_config
from runtime.distributed import destroy, init_distributed
from trainer.checkpoint import latest_checkpoint, load_checkpoint

schedulefree = pytest.importorskip("schedulefree")
HP = dict(lr=0.02, betas=(0.9, 0.99), eps=1e-8, warmup_steps=5, r=0.5, weight_lr_power=2.0)


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(6, 4), (4,), (3, 5)]
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64)) for s in shapes]


def groups(ps):
    return [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]


def grads(step, ps):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in ps]


@pytest.mark.parametrize("foreach", [True, False])
def test_equals_the_reference_package_for_many_steps(foreach):
    ours_p, ref_p = params(), params()
    ours = optim.AdamWScheduleFree(groups(ours_p), **HP,
                                   implementation="foreach" if foreach else "loop")  # fmt: skip
    ref = schedulefree.AdamWScheduleFree(groups(ref_p), **HP, foreach=foreach)
    ref.train()
    for step in range(60):
        for p, q, g in zip(ours_p, ref_p, grads(step, ours_p)):
            p.grad, q.grad = g.clone(), g.clone()  # the reference divides p.grad in place
        ours.step()
        ref.step()
        if step % 20 == 19:  # the evaluated weights x, then back to y
            ours.eval()
            ref.eval()
            for p, q in zip(ours_p, ref_p):
                torch.testing.assert_close(p, q, rtol=0, atol=0)
            ours.train()
            ref.train()
    for p, q in zip(ours_p, ref_p):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
        torch.testing.assert_close(ours.state[p]["z"], ref.state[q]["z"], rtol=0, atol=0)
    assert ours.param_groups[0]["k"] == ref.param_groups[0]["k"] == 60


def stepped(n=5):
    ps = params()
    opt = optim.AdamWScheduleFree(groups(ps), **HP)
    for step in range(n):
        for p, g in zip(ps, grads(step, ps)):
            p.grad = g
        opt.step()
    return ps, opt


def test_eval_weights_is_x_and_puts_y_back():
    ps, opt = stepped()
    y = [p.detach().clone() for p in ps]
    beta1 = HP["betas"][0]
    with optim.eval_weights(opt):
        for p, yy in zip(ps, y):  # x = (y - (1 - beta1) z) / beta1
            x = (yy - (1 - beta1) * opt.state[p]["z"]) / beta1
            torch.testing.assert_close(p.detach(), x)
        with pytest.raises(RuntimeError, match="eval mode"):
            opt.step()
    assert all(torch.equal(p, yy) for p, yy in zip(ps, y))  # exact: from the copy
    with optim.eval_weights(opt, exact=False):  # a save: y recomputed as a resume does
        x = [p.detach().clone() for p in ps]
        saved = copy.deepcopy(opt.state_dict())
    resumed = params(seed=1)
    opt2 = optim.AdamWScheduleFree(groups(resumed), **HP)
    opt2.load_state_dict(saved)
    with torch.no_grad():
        for p, xx in zip(resumed, x):
            p.copy_(xx)
    optim.train_weights(opt2)
    assert all(torch.equal(p, q) for p, q in zip(ps, resumed))
    torch.testing.assert_close(ps[0].detach(), y[0])  # and close to the y it came from


def test_other_optimizers_are_untouched():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    before = model.weight.detach().clone()
    with optim.eval_weights(opt):
        assert torch.equal(model.weight, before)
    optim.train_weights(opt)


def test_trainer_evaluates_and_saves_at_x(tmp_path, sotu_dir):
    typed, _ = fast_config(tmp_path, sotu_dir, "optimizer=adamw-schedulefree", "max_steps=3",
                           "schedule=constant", "schedule.warmup_steps=2")  # fmt: skip
    tr = trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=tmp_path)
    tr.logger = type("Records", (list,), {"log": list.append})()  # the records, in a list
    for _ in range(3):
        tr.train_step()
    opt, model = tr.optimizer, tr.raw_model
    weight = 1 - 1 / opt.param_groups[0]["betas"][0]
    with torch.no_grad():
        x = {k: p.lerp(opt.state[p]["z"], weight) for k, p in model.named_parameters()}
    tr.save()
    saved = load_checkpoint(latest_checkpoint(tmp_path))["model"]
    assert all(torch.equal(saved[k], v) for k, v in x.items())  # x on disk, not y
    assert not torch.equal(saved["transformer.h.0.mlp.c_fc.weight"],
                           model.transformer.h[0].mlp.c_fc.weight)  # fmt: skip
    y = [p.detach().clone() for p in model.parameters()]
    loss = tr.evaluate()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), y))  # y back, bit for bit
    opt.eval()  # the model at x: evaluate() evaluates it as it is
    assert opt.in_train_mode is False and tr.evaluate() == loss
    assert opt.in_train_mode is False
    opt.train()
    destroy()


def test_resume_equals_uninterrupted(tmp_path, sotu_dir):
    common = ["optimizer=adamw-schedulefree", "schedule=constant", "ckpt_every=3"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    for out, steps in ((straight, 6), (split, 3), (split, 6)):
        typed, plain = fast_config(out, sotu_dir, f"max_steps={steps}", *common)
        train.train(typed, plain)

    def losses(out):
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["train_loss"]) for r in rows if "train_loss" in r]

    assert losses(straight) == losses(split) and len(losses(straight)) == 6
    wa = load_checkpoint(latest_checkpoint(straight))["model"]
    wb = load_checkpoint(latest_checkpoint(split))["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
