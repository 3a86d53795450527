"""The reference gradient g_ref that MARS-style optimizers keep, in approx and exact mode.

Approx mode: after each step, g_ref <- a copy of this step's gradient (never an alias of p.grad,
which may be zeroed in place). Exact mode: before step t the training loop computes the gradient
of batch t+1 at the current weights and calls ``store_reference_grad()``; step t uses the
reference stored one step earlier, then promotes the new one (a buffer swap, no copy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from optim.sharded import local


class ReferenceGradMixin:
    """Exact-mode protocol shared by MARS and MARS-M (``needs_reference_grad`` and friends).

    A subclass sets ``self.is_approx`` and ``self._reference_pending = False`` and says which
    tensors keep a reference through ``_uses_reference(p, group)``."""

    is_approx: bool
    _reference_pending: bool

    def _uses_reference(self, p: torch.Tensor, group: dict) -> bool:
        raise NotImplementedError

    @property
    def needs_reference_grad(self) -> bool:
        """True in exact mode: the loop must call store_reference_grad() before each step."""
        return not self.is_approx and any(
            self._uses_reference(p, g) for g in self.param_groups for p in g["params"]
        )

    @torch.no_grad()
    def store_reference_grad(self) -> None:
        """Keep the current gradients (the next batch at the current weights) for the next step;
        times the factor of a global clip folded into it (optim/engine/clip.py), as torch's
        in-place clip would have left them."""
        coef = getattr(self, "_take_clip_fold", lambda: None)()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or not self._uses_reference(p, group):
                    continue
                state = self.state[p]
                if "previous_grad" not in state:
                    state["previous_grad"] = torch.zeros_like(p)  # a DTensor under FSDP2
                if coef is None:
                    local(state["previous_grad"]).copy_(local(p.grad))  # FSDP2: local blocks
                else:
                    torch.mul(local(p.grad), coef, out=local(state["previous_grad"]))
        self._reference_pending = True

    update_previous_grad = store_reference_grad  # the official name

    def update_last_grad(self) -> None:
        """Official API; a no-op here because step() already promotes the stored gradient."""

    def _check_reference(self) -> None:
        if self.needs_reference_grad and not self._reference_pending:
            raise RuntimeError(
                f"{type(self).__name__} in exact mode (is_approx=False) needs "
                "store_reference_grad() before every step: compute the next batch's gradient "
                "at the current weights first"
            )

    def _advance_reference(self, state: dict, g: torch.Tensor) -> None:
        """After a tensor's update: approx keeps a copy of g, exact promotes the stored one."""
        if self.is_approx:  # ``g`` may be a local block (FSDP2): copy into the local block
            local(state["last_grad"]).copy_(g)
        elif "previous_grad" in state:
            state["last_grad"], state["previous_grad"] = state["previous_grad"], state["last_grad"]


def reference_pass(optimizer: torch.optim.Optimizer, compute_grads: Callable[[], object]) -> bool:
    """Exact mode's extra gradient, the one thing a loop does around ``step()`` for it.

    If ``optimizer.needs_reference_grad``: ``compute_grads()`` (forward/backward, and the clip the
    real step uses, on the *next* step's batches at the current weights), then
    ``store_reference_grad()`` and ``zero_grad(set_to_none=True)``. Call it before the real
    forward/backward of each step; returns whether it ran. Any optimizer without the flag: no-op.
    """
    if not getattr(optimizer, "needs_reference_grad", False):
        return False
    compute_grads()
    optimizer.store_reference_grad()
    optimizer.zero_grad(set_to_none=True)
    return True
