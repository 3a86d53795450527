"""The steady state: a step's launch list built once and reused while nothing it depends on moves.

A step through the core (optim/core.py) builds its buckets (a rule per tensor, state, step
counts), asks the engine which it takes (``tensors_fit`` over every tensor), and builds a launch
per bucket and step count (plan keys from every tensor's address): about 2.5 ms of Python a step
for GPT-2 small's 75 tensors on a busy 2-core CPU, more than torch's fused AdamW with
``clip_grad_norm_``. Where a step ran wholly on the engine (every bucket of the step: a list
that left a bucket to another route would skip it), its launches are kept as a ``Program``; the
next step checks, in one pass over the parameters, that it may run them again:

- the same parameters in the same groups, each at the same address, each with a gradient at
  the same address as when the program was built (or without one where it had none), and the
  same state dicts (a loaded state makes new ones);
- the same hyperparameter structure: every group key but the scalars the kernels take as
  arguments (``SCALARS``: lr, weight decay, betas, gamma, momentum and MARS's 1-D ones) equal
  to when it was built (a new ``eps``, clip scope or rule rebuilds);
- the same optimizer setting (``implementation``, the engine not turned off since), whether the
  step is flagged (``found_inf``) and whether a folded clip is pending (the kernel variants
  compiled).

Then the step counts advance, each bucket's view of its group is made anew (the scalars of
this step: a schedule's lr, the bias corrections) and the kept launches run: no bucket, no
``tensors_fit``, no plan key. Anything else falls back to the full step, which builds a new
program. Exact mode (its reference buffers swap every step) is not kept. A gradient at the
same address is taken to keep the dtype and layout it was checked with when the program was
built (the allocator's and DDP's buckets give it so). FSDP2 shards are kept as plain tensors
are, by their local blocks' addresses (the clips' all-reduce runs in the kept launches).
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from optim.sharded import local

SCALARS = frozenset({"lr", "weight_decay", "betas", "gamma", "momentum", "initial_lr",
                     "lr_1d_factor", "betas_1d", "weight_decay_1d"})  # fmt: skip


def structure(group: dict) -> dict:
    """The group's keys that are not per-step scalars, copied (compared on later steps)."""
    return copy.deepcopy({k: v for k, v in group.items() if k != "params" and k not in SCALARS})


def addresses(opt) -> tuple:
    """What a program's tables and buckets hold of the parameters: per group its identity and
    per parameter its address, its gradient's address (-1: none) and its state dict's identity
    (FSDP2: the addresses of the local blocks)."""
    state = opt.state
    return tuple(
        (
            id(g),
            tuple(
                (
                    id(p),
                    local(p).data_ptr(),
                    -1 if p.grad is None else local(p.grad).data_ptr(),
                    id(state.get(p)),
                )
                for p in g["params"]
            ),
        )  # fmt: skip
        for g in opt.param_groups
    )


class Program:
    """The launches of one step, kept (module docstring). ``items``: the engine's ``(bucket,
    kind)`` pairs of the step it was built from; ``launches``: its launch list; ``route``:
    the core's ``route`` (a bucket's view of its group this step)."""

    def __init__(self, opt, items: list, launches: list, route, flags: tuple) -> None:
        self.keys = (opt.implementation, flags, addresses(opt))
        self.structure = [structure(g) for g in opt.param_groups]
        self.route = route
        self.counted = [s for b, _ in items for s in b.owners]
        groups = {id(p): g for g in opt.param_groups for p in g["params"]}
        # no gradient kept alive: a freed gradient's block is where the next one is allocated
        lean = {id(b): dataclasses.replace(b, gs=[], cs=[]) for b, _ in items}
        # (FSDP2: the group holds the DTensor, ``shards``; the bucket its local block)
        self.buckets = [(lean[id(b)], groups[id(b.params[0] if b.shards[0] is None else b.shards[0])])
                        for b, _ in items]  # fmt: skip
        self.launches = launches
        for ln in launches:
            ln.b = lean[id(ln.b)]

    def matches(self, opt, flags: tuple) -> bool:
        """Whether this program may run the step (module docstring)."""
        if opt.engine_state.off or self.keys[:2] != (opt.implementation, flags):
            return False
        groups = opt.param_groups
        if len(groups) != len(self.structure) or self.keys[2] != addresses(opt):
            return False
        return all(
            {k: v for k, v in g.items() if k != "params" and k not in SCALARS} == s
            for g, s in zip(groups, self.structure)
        )

    def prepare(self, opt, gscale: torch.Tensor | None, sums=None) -> None:
        """This step's counts, views and folded clip (its factor, its merged sums) on the kept
        buckets and launches."""
        for state in self.counted:
            state["step"] += 1
        opt._last_counted = self.counted
        for b, group in self.buckets:
            b.view = self.route(b.params[0], group)[1]
            b.preconditioner.group = b.view
        for ln in self.launches:  # (``owners``: the optimizer's own state dicts)
            ln.gscale, ln.sums, ln.t = gscale, sums, ln.b.owners[ln.first]["step"]


def flags(skip: torch.Tensor | None, gscale: torch.Tensor | None,
          sums=None) -> tuple[bool, bool, bool]:  # fmt: skip
    """What the kernel variants depend on beyond the tensors: a flagged step, a folded clip,
    its norm pass merged with MARS's (optim/engine/clip.py ``Sums``)."""
    return skip is not None, gscale is not None, sums is not None
