"""Count the kernel-launching aten ops of one optimizer step, per optimizer and depth.

    python -m bench.launches                          # every registered optimizer, 2/12/48 layers
    python -m bench.launches --only muon mars-m --layers 2 12
    python -m bench.launches --width 768              # GPT-2's own widths (slow on a small CPU)

What is counted. torch's profiler (CPU activities only) records one ``optimizer.step()`` on a
CPU model; the count is the number of *outermost* aten ops (ops not called from inside another
aten op: a ``torch._foreach_add_`` is one op however many tensors it takes, even though on a CPU
it runs one ``aten::add_`` per tensor inside) that launch a kernel. An op launches no kernel when
it and everything it calls is a view or metadata op (``METADATA``: ``aten::view``, ``aten::t``,
``aten::detach``, ``aten::empty``, ``aten::unbind``, ...): ``aten::to`` to the dtype a tensor
already has calls nothing and is not counted; a converting ``aten::to`` calls ``aten::copy_``
and is. A compiled call (the fused element-wise step, optim/fused.py) counts as one op: the
bench runs its code eagerly inside a profiler range and counts the range, not what is inside.
Host reads (``aten::item``, ``aten::_local_scalar_dense``, ``aten::is_nonzero`` called from
Python, not from inside another op) are counted apart: a step should have none.

Routed as for CUDA. Each optimizer is built through the registry from its default config and
then takes the path it takes on CUDA (``route_as_cuda``): torch's AdamW ``fused=True``, the
core's element-wise buckets on the compiled step (``fused=None`` means that on CUDA), and the
core's ``foreach`` choice for CUDA (``VarianceReduced.foreach_for("cuda")``) and Newton-Schulz's
``ns_fused`` iteration (on CUDA by default). The second step is
counted (the first also creates the state: one allocation per tensor, once per run).

Why a small width. The count depends on the number of tensors and on the set of distinct shapes,
not on their sizes, so the model keeps GPT-2's structure (``n_layer`` blocks of the same four
matrix shapes, the embeddings, the LayerNorm vectors: the same number of tensors and the same
number of distinct shapes) at width ``--width`` (64 by default; 768 is GPT-2 small's, which a
2-core CPU steps slowly). On a GPU, each counted op is at least one kernel launch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import optim
from model import GPT
from model.gpt import GPTConfig
from optim import fused as fused_path
from optim.core import VarianceReduced
from optim.registry import get_spec

COMPILED = "launches::compiled_step"  # the profiler range that stands for one compiled call
METADATA = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::t", "aten::transpose", "aten::permute",
    "aten::detach", "aten::detach_", "aten::alias", "aten::as_strided", "aten::expand",
    "aten::select", "aten::slice", "aten::unbind", "aten::split", "aten::chunk",
    "aten::unsqueeze", "aten::squeeze", "aten::reshape", "aten::flatten", "aten::numpy_T",
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::resize_",
    "aten::to", "aten::_to_copy", "aten::contiguous", "aten::lift_fresh", "aten::lift",
    "aten::resolve_conj", "aten::resolve_neg", "aten::result_type", "aten::size",
    "aten::stride", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type",
    "aten::set_", "aten::promote_types", "aten::mT", "aten::matrix_H", "aten::adjoint", "aten::record_stream",
})  # fmt: skip
HOST_READS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"})


@dataclasses.dataclass
class Count:
    """What one profiled step did."""

    launches: int
    host_reads: int
    by_op: dict[str, int]


def structure_model(n_layer: int, width: int = 64) -> GPT:
    """A CPU GPT with GPT-2's structure (module docstring): ``n_layer`` blocks at ``width``."""
    heads = max(1, width // 64)
    cfg = GPTConfig(
        n_layer=n_layer,
        n_head=heads,
        n_embd=width,
        vocab_size=8 * width + 8,
        block_size=2 * width + 16,
    )  # fmt: skip  (every shape distinct, as GPT-2's)
    return GPT(cfg)


def _launches(event) -> bool:
    """Whether ``event`` or anything it calls is a kernel-launching aten op."""
    if event.name not in METADATA and event.name not in HOST_READS:
        return True
    return any(_launches(c) for c in event.cpu_children if c.name.startswith("aten::"))


def count_events(events) -> Count:
    """Outermost kernel-launching aten ops and host reads of a profiler's ``events()``."""
    launches, reads, by_op = 0, 0, {}
    for e in events:
        name, outer, parent = e.name, True, e.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::") or parent.name == COMPILED:
                outer = False
                break
            parent = parent.cpu_parent
        if not outer:  # a read inside a CPU kernel (torch's fused AdamW on CPU) is not one
            continue
        if name in HOST_READS:
            reads += 1
            continue
        if name == COMPILED or (name.startswith("aten::") and _launches(e)):
            launches += 1
            by_op[name] = by_op.get(name, 0) + 1
    return Count(launches, reads, by_op)


def _eager_run(grouping, args, flags, may_fall_back):
    """``optim.fused._run`` as one profiler range (on CUDA: one compiled call)."""
    with record_function(COMPILED):
        fused_path._multi_step(*args, **flags)
    return None


@contextlib.contextmanager
def route_as_cuda(opt: torch.optim.Optimizer) -> Iterator[None]:
    """Make ``opt`` take, on a CPU, the path it would take on CUDA (module docstring)."""
    if isinstance(opt, torch.optim.AdamW):
        for group in opt.param_groups:
            group["fused"], group["foreach"] = True, False
        yield
        return
    if not isinstance(opt, VarianceReduced):
        yield
        return
    opt.foreach = opt.foreach if opt.foreach is not None else opt.foreach_for("cuda")
    opt.fused = True if opt.fused is None else opt.fused
    for group in opt.param_groups:  # Newton-Schulz's ``ns_fused=None`` means on CUDA
        if group.get("ns_fused", False) is None:
            group["ns_fused"] = True
    with mock.patch.object(fused_path, "unavailable_reason", lambda device: None), \
            mock.patch.object(fused_path, "_run", _eager_run):  # fmt: skip
        yield


def count_step(name: str, n_layer: int, width: int = 64, *, as_cuda: bool = True) -> Count:
    """Launches of the second ``step()`` of optimizer ``name`` on a ``n_layer`` structure model."""
    torch.manual_seed(0)
    model = structure_model(n_layer, width)
    opt = optim.build_optimizer(model, get_spec(name).config_cls())
    routing = route_as_cuda(opt) if as_cuda else contextlib.nullcontext()
    with routing:
        for i in range(2):
            for p in model.parameters():
                p.grad = torch.randn_like(p) * 1e-3
            if getattr(opt, "needs_reference_grad", False):
                opt.store_reference_grad()
            if i == 0:
                opt.step()
                continue
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                opt.step()
    return count_events(prof.events())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="optimizer names (default: all)")
    parser.add_argument("--layers", nargs="*", type=int, default=[2, 12, 48])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--cpu-routing", action="store_true",
                        help="count the CPU path instead of the CUDA one")  # fmt: skip
    parser.add_argument("--top", type=int, default=0, help="also list the N most frequent ops")
    args = parser.parse_args(argv)
    names = args.only or optim.available()
    unknown = [n for n in names if n not in optim.available()]
    if unknown:
        raise SystemExit(f"--only {unknown}: valid optimizers: {', '.join(optim.available())}")
    header = f"{'optimizer':<18}" + "".join(f"{f'{n} layers':>12}" for n in args.layers)
    print(f"kernel-launching aten ops per step (width {args.width}, routed as for "
          f"{'CPU' if args.cpu_routing else 'CUDA'}; host reads in brackets when any)")  # fmt: skip
    print(header)
    for name in names:
        cells, tops = [], []
        for n in args.layers:
            c = count_step(name, n, args.width, as_cuda=not args.cpu_routing)
            cells.append(f"{c.launches}" + (f" [{c.host_reads}]" if c.host_reads else ""))
            tops.append(c.by_op)
        print(f"{name:<18}" + "".join(f"{cell:>12}" for cell in cells))
        if args.top:
            ops = sorted(tops[-1].items(), key=lambda kv: -kv[1])[: args.top]
            print("    " + ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in ops))


if __name__ == "__main__":
    main()
