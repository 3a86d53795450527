"""The eager paths' steps under a device-side skip flag (torch's ``found_inf``), no host read.

The compiled path (optim/compiled.py) masks each write inside its kernel. The eager paths
(Newton-Schulz, the heavy-ball and one-buffer momenta, the global clip, FSDP's sharded clip,
exact mode's buffer swap) write with foreach ops, which have no masked form that is safe for
NaN: ``m + 0 * (new - m)`` is NaN where ``new`` is, and a flagged step is one whose gradients
are not finite. So under a flag these buckets step on copies of everything they write (their
parameters and every tensor of their state), and ``commit`` then writes ``where(skip, old,
new)`` back into the real tensors: bit for bit the unflagged step when the flag is 0, nothing
changed when it is 1, and no host read either way.

The price is one copy of those tensors while the step runs (memory on top of the step's, and
the bandwidth of copying and committing them); the host decision (trainer/nonfinite.py) avoids
it at the cost of one host read per step, which is why ``nonfinite.decision=auto`` takes the
host for an optimizer with eager buckets and ``device`` is the explicit choice
(``python -m bench.nonfinite`` times both).
"""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)
Tensors = list[torch.Tensor]


class Staged:
    """The eager buckets of one step moved onto copies (``buckets``' params and states are
    replaced in place); ``commit(skip)`` writes the results back under the flag."""

    def __init__(self, buckets: list) -> None:
        self.reals: Tensors = []
        self.copies: Tensors = []
        self.dicts: list[tuple[dict, dict]] = []
        for b in buckets:
            copies = [p.clone() for p in b.params]
            self.reals += b.params
            self.copies += copies
            b.params = copies
            states = []
            for s in b.states:
                copy = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                self.dicts.append((s, copy))
                states.append(copy)
            b.states = states
            b.owners = states  # exact mode's swap (``_advance_reference``) acts on the copies

    def commit(self, skip: torch.Tensor, compiled: bool) -> None:
        """Every real tensor <- ``where(skip, real, copy)`` (state keys by name: exact mode's
        swap moved tensors between keys of the copy)."""
        reals, news = list(self.reals), list(self.copies)
        for real, copy in self.dicts:
            for key, new in copy.items():
                if not isinstance(new, torch.Tensor):
                    continue
                if key in real:
                    reals.append(real[key])
                    news.append(new)
                else:  # created by this step: nothing older to keep
                    real[key] = new
        if not reals:
            return
        if compiled:
            try:
                _compiled_commit()(skip, reals, news)
                return
            except Exception as e:  # noqa: BLE001 (any compile failure: the same writes eagerly)
                log.warning("compiled masked commit failed (%s); committing eagerly", e)
        masked_commit(skip, reals, news)


def masked_commit(skip: torch.Tensor, reals: Tensors, news: Tensors) -> None:
    """``real.copy_(where(skip, real, new))`` for each pair: safe for NaN and inf in ``new``."""
    for real, new in zip(reals, news):
        real.copy_(torch.where(skip, real, new))


@functools.cache
def _compiled_commit():
    """``masked_commit`` compiled once (one wrapper call for the whole list on a GPU)."""
    return torch.compile(masked_commit, dynamic=False, fullgraph=True)


def masked_swap(skip: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Exact mode's reference swap ``a, b = b, a`` for each pair unless ``skip``: as copies
    (the buffers keep their identity), bit for bit the swap's values."""
    for a, b in pairs:
        old_a = a.clone()
        a.copy_(torch.where(skip, a, b))
        b.copy_(torch.where(skip, b, old_a))
