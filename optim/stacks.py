"""Per-shape stacks for the preconditioners' per-matrix work (NorMuon's row normalisation, SOAP's
projections and eigenbases): the matrices of one shape as one ``(k, ...)`` tensor, so that each
operation is one batched kernel per shape instead of one kernel per matrix.

- ``same_shape(ts)``: the indices of ``ts`` by (shape, dtype, device), each in the order of ``ts``.
- ``stack_view(ts)``: a ``(k, ...)`` view whose slices are exactly ``ts``, where they lie at equal
  steps in one storage (the slices of a batched Newton-Schulz result, or of a stack made by
  ``adopt``); no copy. None where they do not.
- ``as_stack(ts)``: that view, or else ``torch.stack(ts)`` (one copy).
- ``adopt(states, key)``: the stack of one state key over ``states``, each state's entry a slice
  of it. The first time (or after a load, or when the set of tensors changes) the values are
  copied into a new stack and each entry is replaced by its slice: the same shape, dtype, device
  and values, so state dicts and checkpoints are unchanged (``torch.save`` writes the shared
  storage once; DCP writes each slice on its own). Later steps find the stack and copy nothing,
  and batched in-place updates of it are the updates of every state.

Every result of a batched operation is, slice by slice, the per-matrix operation's (the same
elements, the same arithmetic): see each user for where a reduction or a GEMM may round
differently from the per-matrix call.
"""

from __future__ import annotations

import torch

Tensors = list[torch.Tensor]


def same_shape(ts: Tensors) -> dict[tuple, list[int]]:
    """Indices of ``ts`` by (shape, dtype, device), each list in the order of ``ts``."""
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(ts):
        groups.setdefault((tuple(t.shape), t.dtype, t.device), []).append(i)
    return groups


def stack_view(ts: Tensors) -> torch.Tensor | None:
    """``(k, *shape)`` view over ``ts`` (same shape, strides, dtype and storage; offsets at one
    positive step, at least each tensor's extent, so that slices cannot overlap), else None."""
    first = ts[0]
    if len(ts) == 1:
        return first.unsqueeze(0)
    if first.numel() == 0 or any(s < 0 for s in first.stride()):
        return None
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    step = ts[1].storage_offset() - offset
    extent = 1 + sum((n - 1) * s for n, s in zip(first.shape, first.stride()))
    if step < extent:
        return None
    for j, t in enumerate(ts):
        if (t.shape != first.shape or t.stride() != first.stride() or t.dtype != first.dtype
                or t.device != first.device or t.storage_offset() != offset + j * step
                or t.untyped_storage().data_ptr() != storage):  # fmt: skip
            return None
    return first.as_strided((len(ts), *first.shape), (step, *first.stride()), offset)


def as_stack(ts: Tensors) -> torch.Tensor:
    """The stack of ``ts``: their ``stack_view``, or a new tensor (one copy)."""
    view = stack_view(ts)
    return view if view is not None else torch.stack(ts)


def adopt(states: list[dict], key: str) -> torch.Tensor:
    """The stack of ``state[key]`` over ``states``, each entry one of its slices (module
    docstring): found where the entries already are one, else made once."""
    ts = [s[key] for s in states]
    view = stack_view(ts)
    if view is not None:
        return view
    stack = torch.stack(ts)
    for s, t in zip(states, stack.unbind(0)):
        s[key] = t
    return stack
