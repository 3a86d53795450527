"""The explicit rule that routes every parameter to exactly one kind.

Kinds, decided by the module that owns the parameter (not by its name):
- ``matrix``: weights of ``nn.Linear`` layers that are not tied to an embedding (the block
  matrices: attention and MLP projections);
- ``embedding``: weights of ``nn.Embedding`` modules, including a head tied to the token
  embedding (GPT-2's ``wte`` is ``lm_head``: a tied tensor is one parameter and keeps GPT-2's
  routing);
- ``head``: the output projection when it is its own parameter (an untied ``lm_head``, as
  LLaMA-style models have): the weight of a module's ``lm_head`` attribute, an ``nn.Linear``.
  The Muon family (Keller Jordan's Muon, Moonlight, MARS-M) keeps it off Newton-Schulz as it
  keeps the embeddings; docs/models.md tables every optimizer's routing of it;
- ``gain``: 1-D weights (LayerNorm gains);
- ``bias``: every parameter named ``bias``;
- ``other``: anything else (e.g. conv kernels), routed like gains by default.

The official AdamW baseline decays only the ``matrix`` kind (an untied head is not decayed, as
the EPFL benchmark's ``get_parameter_group_specs`` puts it in its no-decay set); MARS and Muon routings are built from
the same kinds in their own optimizers.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.nn as nn

KINDS = ("matrix", "embedding", "head", "gain", "bias", "other")


def classify_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Map each kind to its ``(name, parameter)`` pairs; every trainable parameter appears once."""
    owner_kind: dict[int, str] = {}
    # The output head: a module's ``lm_head`` (the model's own, or the one a wrapper holds).
    heads = {id(m.lm_head.weight) for m in model.modules()
             if isinstance(getattr(m, "lm_head", None), nn.Linear)}  # fmt: skip
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if isinstance(module, nn.Embedding):
                owner_kind[id(p)] = "embedding"  # an embedding owner wins over a tied Linear
            elif id(p) in owner_kind:
                continue
            elif id(p) in heads:
                owner_kind[id(p)] = "head"
            elif pname == "bias":
                owner_kind[id(p)] = "bias"
            elif isinstance(module, nn.Linear) and p.ndim == 2:
                owner_kind[id(p)] = "matrix"
            elif p.ndim == 1:
                owner_kind[id(p)] = "gain"
            else:
                owner_kind[id(p)] = "other"
    out: dict[str, list[tuple[str, nn.Parameter]]] = {k: [] for k in KINDS}
    for name, p in model.named_parameters():  # deduplicates tied parameters
        if p.requires_grad:
            out[owner_kind[id(p)]].append((name, p))
    return out


def decay_groups(
    model: nn.Module, weight_decay: float, decay_kinds: Iterable[str] = ("matrix",)
) -> list[dict]:
    """Two parameter groups for an AdamW-style optimizer: decayed kinds and the rest (wd 0)."""
    decay_kinds = tuple(decay_kinds)
    unknown = set(decay_kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown parameter kinds {sorted(unknown)}; valid kinds: {list(KINDS)}")
    kinds = classify_parameters(model)
    decay = [p for k in decay_kinds for _, p in kinds[k]]
    no_decay = [p for k in KINDS if k not in decay_kinds for _, p in kinds[k]]
    groups = [{"params": decay, "weight_decay": weight_decay, "kind": "decay"}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "kind": "no_decay"})
    return [g for g in groups if g["params"]]


def split_aux(model: nn.Module, groups: list[dict], aux_lr: float | None, **aux_keys) -> list[dict]:
    """Every registered optimizer's ``aux_lr`` (docs/optimizers.md): ``groups`` with each
    parameter that is not of kind ``matrix`` (embeddings, tied or untied head, gains, biases,
    other) moved to a copy of its group at peak lr ``aux_lr`` (one copy per group, right after
    it; ``aux_keys`` override further keys of the copy, e.g. MARS's ``lr_1d_factor``), labelled
    ``kind: aux``; every other key stays what it was, so only the lr of those parameters
    changes. ``aux_lr=None`` returns ``groups`` as they are. A group left without parameters is
    dropped, unless it had none to begin with (a builder may check an empty group's values)."""
    if aux_lr is None:
        return groups
    matrix = {id(p) for _, p in classify_parameters(model)["matrix"]}
    out = []
    for g in groups:
        main = [p for p in g["params"] if id(p) in matrix]
        aux = [p for p in g["params"] if id(p) not in matrix]
        out += [{**g, "params": main}] if main or not aux else []
        out += [{**g, "params": aux, "lr": aux_lr, **aux_keys, "kind": "aux"}] if aux else []
    return out


def split_by_kind(model: nn.Module, kinds: tuple[str, ...]) -> tuple[list, list]:
    """(the parameters of ``kinds``, every other parameter), each once."""
    by_kind = classify_parameters(model)
    chosen = [p for k in kinds for _, p in by_kind[k]]
    rest = [p for k, ps in by_kind.items() if k not in kinds for _, p in ps]
    return chosen, rest
