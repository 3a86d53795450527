"""The Trainer's step and its batches (trainer/trainer.py): the loader reads a whole step ahead,
each micro-batch is fetched inside the micro-step loop, and the batches are the same bit for bit
as taking them one after another (exact MARS's reference pass included)."""

import pytest
import torch

import trainer.trainer as trainer_mod
from data import TokenLoader
from helpers import fast_config
from runtime.distributed import destroy, init_distributed


def _trainer(tmp_path, sotu_dir, *overrides):
    typed, _ = fast_config(tmp_path, sotu_dir, "micro_batch_size=2", *overrides)  # accum 4
    return trainer_mod.Trainer(typed, init_distributed("cpu"), out_dir=tmp_path)


def _record(monkeypatch, trainer):
    """Every event in order: ("fetch", x) when the loader hands out a batch, ("forward", x) when
    the model runs on one."""
    events = []
    loader = trainer.loader
    real_next, real_peek = loader.next_batch, loader.peek_batch

    def next_batch():
        batch = real_next()
        events.append(("fetch", batch[0]))
        return batch

    def peek_batch(ahead=0):
        batch = real_peek(ahead)
        events.append(("peek", batch[0]))
        return batch

    monkeypatch.setattr(loader, "next_batch", next_batch)
    monkeypatch.setattr(loader, "peek_batch", peek_batch)
    model = trainer.model
    model.register_forward_pre_hook(lambda _m, args: events.append(("forward", args[0])))
    return events


@pytest.mark.parametrize("optimizer", ["adamw", "mars-adamw-exact"])
def test_step_fetches_inside_the_loop_the_same_batches(tmp_path, sotu_dir, monkeypatch, optimizer):
    trainer = _trainer(tmp_path, sotu_dir, f"optimizer={optimizer}")
    accum = trainer.accum
    assert accum == 4 and trainer.loader.prefetch >= accum  # a whole step read ahead
    events = _record(monkeypatch, trainer)
    steps = 2
    for _ in range(steps):
        trainer.train_step()
    exact = optimizer.endswith("exact")
    # The batches one plain loader hands out, one after another, with no read-ahead.
    cfg = trainer.cfg
    plain = TokenLoader(trainer.loader.files, batch_size=cfg.micro_batch_size,
                        seq_len=cfg.sequence_length, seed=cfg.seed, prefetch=0)  # fmt: skip
    expected = [plain.next_batch()[0] for _ in range((steps + 1) * accum)]
    fetched = [x for kind, x in events if kind == "fetch"]
    assert len(fetched) == steps * accum
    assert all(torch.equal(a, b) for a, b in zip(fetched, expected, strict=False))
    per_step = 2 * accum * (2 if exact else 1)  # (peek, forward)* + (fetch, forward)*
    assert len(events) == steps * per_step
    for s in range(steps):
        mine = events[s * per_step : (s + 1) * per_step]
        real = mine[-2 * accum :]
        # fetch, forward, fetch, forward, ...: each batch taken when its micro-step begins
        assert [k for k, _ in real] == ["fetch", "forward"] * accum
        assert all(torch.equal(real[2 * i][1], real[2 * i + 1][1]) for i in range(accum))
        if exact:  # the reference pass: the next step's batches, peeked in the same way
            ahead = mine[: 2 * accum]
            assert [k for k, _ in ahead] == ["peek", "forward"] * accum
            nxt = expected[(s + 1) * accum : (s + 2) * accum]
            assert all(torch.equal(ahead[2 * i][1], nxt[i]) for i in range(accum))
    trainer.loader.close()
    destroy()


def test_micro_batches_are_sized_and_lazy():
    taken = []
    batches = trainer_mod.MicroBatches(lambda i: taken.append(i) or (i, i), 3)
    assert len(batches) == 3 and taken == []
    it = iter(batches)
    assert next(it) == (0, 0) and taken == [0]
    assert list(it) == [(1, 1), (2, 2)] and taken == [0, 1, 2]
