"""Count the kernel launches of one optimizer step, per optimizer, route and depth.

    python -m bench.launches                          # every registered optimizer, 2/12/48 layers
    python -m bench.launches --only muon mars-m --layers 2 12
    python -m bench.launches --routes compiled        # the compiled step's count only (no Triton)
    python -m bench.launches --width 768              # GPT-2's own widths (slow on a small CPU)

What is counted. torch's profiler (CPU activities only) records one ``optimizer.step()`` on a
CPU model; the count is the number of *outermost* aten ops (ops not called from inside another
aten op: a ``torch._foreach_add_`` is one op however many tensors it takes, even though on a CPU
it runs one ``aten::add_`` per tensor inside) that launch a kernel. An op launches no kernel when
it and everything it calls is a view or metadata op (``METADATA``: ``aten::view``, ``aten::t``,
``aten::detach``, ``aten::empty``, ``aten::unbind``, ...): ``aten::to`` to the dtype a tensor
already has calls nothing and is not counted; a converting ``aten::to`` calls ``aten::copy_``
and is. A compiled call (the fused element-wise step, optim/compiled.py) counts as one op: the
bench runs its code eagerly inside a profiler range and counts the range, not what is inside.
So does each Triton kernel of the optimizer engine (optim/engine/): its launches run under
Triton's interpreter (``TRITON_INTERPRET=1`` for the kernels only, optim/engine/loader.py), each
inside a profiler range counted as one launch. Host reads (``aten::item``,
``aten::_local_scalar_dense``, ``aten::is_nonzero`` called from Python, not from inside another
op or range) are counted apart: a step should have none.

Routed as for CUDA (``--routes``). Each optimizer is built through the registry from its default
config, then takes the path it would take on CUDA by one route (``route_as_cuda``):

- ``engine`` (what ``implementation=auto`` means on CUDA where Triton is importable): the engine
  for the buckets it covers (``implementation="triton"``), the compiled step for the others, as
  on CUDA; torch's AdamW its fused kernel; the engine's CUDA block size;
- ``compiled`` (``implementation="compiled"``): the core's element-wise buckets on the compiled
  step; Schedule-Free AdamW (no compiled step) foreach; torch's AdamW its fused kernel;
- ``foreach`` (``implementation="foreach"``): the core's foreach path, Schedule-Free's foreach,
  torch's AdamW ``foreach=True``.

Every route takes the core's eager choice for CUDA (``VarianceReduced.foreach_for``) and
Newton-Schulz's ``ns_fused`` iteration (on CUDA by default). The second step is counted, on the
gradient tensors of the first, as a steady GPU loop's allocator hands them back (the first step
also creates the state and the engine's tables, once per run; exact mode, no registry default,
would build its second set of tables on the second step: its reference buffers alternate). Beside the step, the trainer's
global gradient clip of that step: ``clip_grad_norm_`` (``clip: torch``), and on the engine
route the fold into the engine's norm pass where the optimizer can (``clip: fold``,
optim/engine/clip.py; ``-`` where it falls back to torch's).

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
from optim import compiled as fused_path
from optim.core import VarianceReduced
from optim.engine import loader
from optim.registry import get_spec

COMPILED = "launches::compiled_step"  # the profiler range that stands for one compiled call
ENGINE_KERNEL = "launches::engine_kernel"  # the range that stands for one engine kernel launch
RANGES = frozenset({COMPILED, ENGINE_KERNEL})
ROUTES = ("engine", "compiled", "foreach")
STEPS = 2  # the last one counted (SOAP refreshes its bases on the second: its per-matrix work)
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
    clip: int = 0  # the trainer's global clip before the step (count_step)
    folded: bool = False  # whether that clip was folded into the engine


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
    """Outermost kernel-launching aten ops, ranges and host reads of a profiler's ``events()``."""
    launches, reads, by_op = 0, 0, {}
    for e in events:
        name, outer, parent = e.name, True, e.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::") or parent.name in RANGES:
                outer = False
                break
            parent = parent.cpu_parent
        if not outer:  # a read inside a CPU kernel (torch's fused AdamW on CPU) is not one
            continue
        if name in HOST_READS:
            reads += 1
            continue
        if name in RANGES or (name.startswith("aten::") and _launches(e)):
            launches += 1
            by_op[name] = by_op.get(name, 0) + 1
    return Count(launches, reads, by_op)


def _eager_run(grouping, args, flags, may_fall_back):
    """``optim.compiled._run`` as one profiler range (on CUDA: one compiled call)."""
    with record_function(COMPILED):
        fused_path._multi_step(*args, **flags)
    return None


_GO = loader.Go.__call__


def _counted_go(self, kernel, grid, *args, **kw):
    """The engine's launcher with each launch in one profiler range (``ENGINE_KERNEL``)."""
    if self.dry:
        return _GO(self, kernel, grid, *args, **kw)
    with record_function(ENGINE_KERNEL):
        return _GO(self, kernel, grid, *args, **kw)


@contextlib.contextmanager
def route_as_cuda(opt: torch.optim.Optimizer, route: str = "compiled") -> Iterator[None]:
    """Make ``opt`` take, on a CPU, the path it would take on CUDA by ``route`` (``ROUTES``,
    module docstring)."""
    if isinstance(opt, torch.optim.AdamW):
        for group in opt.param_groups:
            fused = route != "foreach"
            group["fused"], group["foreach"] = fused or None, not fused
        yield
        return
    if isinstance(opt, optim.AdamWScheduleFree):
        opt.implementation = "triton" if route == "engine" else "foreach"
        opt.foreach = True
        with _engine_routed(route):
            yield
        return
    if not isinstance(opt, VarianceReduced):
        yield
        return
    opt.implementation = {"engine": "triton", "compiled": "compiled", "foreach": "foreach"}[route]
    for group in opt.param_groups:  # Newton-Schulz's ``ns_fused=None`` means on CUDA
        if group.get("ns_fused", False) is None:
            group["ns_fused"] = True
    with contextlib.ExitStack() as stack:
        stack.enter_context(_engine_routed(route))
        eager = opt.foreach_for("cuda")  # what the engine and the compiled step leave, on CUDA
        stack.enter_context(mock.patch.object(opt, "_use_foreach", lambda: eager))
        if route != "foreach":
            stack.enter_context(mock.patch.object(fused_path, "unavailable_reason", lambda d: None))
            stack.enter_context(mock.patch.object(fused_path, "_run", _eager_run))
        if route == "engine":  # what the engine leaves takes the compiled step, as on CUDA
            stack.enter_context(mock.patch.object(opt, "_want_compiled",
                                                  lambda b: not opt.private_overrides()))  # fmt: skip
        yield


@contextlib.contextmanager
def _engine_routed(route: str) -> Iterator[None]:
    """On the engine route: each launch counted once, the CUDA block size (its program count)."""
    if route != "engine":
        yield
        return
    from optim.engine import launch

    with mock.patch.object(loader.Go, "__call__", _counted_go), \
            mock.patch.dict(launch.BLOCKS, {"cpu": launch.BLOCKS["cuda"]}), \
            mock.patch.dict(launch.CHUNK, {"cpu": launch.CHUNK["cuda"]}):  # fmt: skip
        yield


def _clip(opt, params: list, route: str) -> bool:
    """The trainer's clip (trainer/trainer.py ``clip_grads``): folded into the engine where
    the optimizer can on the engine route (whether it did), else ``clip_grad_norm_``."""
    fold = getattr(opt, "fold_grad_clip", None) if route == "engine" else None
    if fold is not None and fold(1.0, params) is not None:
        return True
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    return False


def count_step(name: str, n_layer: int, width: int = 64, *, as_cuda: bool = True,
               route: str = "compiled") -> Count:  # fmt: skip
    """Launches of the second ``step()`` of optimizer ``name`` on a ``n_layer`` structure model,
    routed as for CUDA by ``route`` (``as_cuda=False``: as on a CPU), and of the trainer's
    global clip before it (``Count.clip``, ``Count.folded``)."""
    torch.manual_seed(0)
    model = structure_model(n_layer, width)
    params = list(model.parameters())
    opt = optim.build_optimizer(model, get_spec(name).config_cls())
    routing = route_as_cuda(opt, route) if as_cuda else contextlib.nullcontext()
    with routing:
        for _ in range(STEPS):
            for p in params:  # the same gradient tensors each step, as a steady GPU loop has
                g = torch.randn_like(p) * 1e-3
                p.grad = g if p.grad is None else p.grad.copy_(g)
            if getattr(opt, "needs_reference_grad", False):
                opt.store_reference_grad()
            with profile(activities=[ProfilerActivity.CPU]) as clip_prof:
                folded = _clip(opt, params, route if as_cuda else "cpu")
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                opt.step()
    count = count_events(prof.events())
    count.clip, count.folded = count_events(clip_prof.events()).launches, folded
    return count


def _cell(c: Count | None) -> str:
    if c is None:
        return "n/a"
    return f"{c.launches}" + (f" [{c.host_reads}]" if c.host_reads else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="optimizer names (default: all)")
    parser.add_argument("--layers", nargs="*", type=int, default=[2, 12, 48])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES),
                        help="the CUDA routes to count (default: all)")  # fmt: skip
    parser.add_argument("--cpu-routing", action="store_true",
                        help="count the CPU path instead of the CUDA ones")  # fmt: skip
    parser.add_argument("--top", type=int, default=0, help="also list the N most frequent ops")
    args = parser.parse_args(argv)
    names = args.only or optim.available()
    unknown = [n for n in names if n not in optim.available()]
    if unknown:
        raise SystemExit(f"--only {unknown}: valid optimizers: {', '.join(optim.available())}")
    routes = ["cpu"] if args.cpu_routing else args.routes
    missing = loader.triton_missing() if "engine" in routes else None
    print(f"kernel launches per optimizer step (width {args.width}; routed as for "
          f"{'CPU' if args.cpu_routing else 'CUDA'}: an aten op, a compiled call or an engine "
          "kernel is one; host reads in brackets when any; clip: the trainer's global clip of "
          "the step, torch's clip_grad_norm_ or folded into the engine)")  # fmt: skip
    if missing:
        print(f"engine route: n/a ({missing})")
    print(f"{'optimizer':<20}{'layers':>7}" + "".join(f"{r:>10}" for r in routes)
          + f"{'clip: fold':>12}{'clip: torch':>13}")  # fmt: skip
    for name in names:
        for n in args.layers:
            counts = {r: None if r == "engine" and missing else
                      count_step(name, n, args.width, as_cuda=r != "cpu", route=r)
                      for r in routes}  # fmt: skip
            fold = counts.get("engine")
            torch_clip = next((c.clip for c in counts.values() if c and not c.folded), None)
            if torch_clip is None:
                torch_clip = count_step(name, n, args.width, route="compiled").clip
            print(f"{name:<20}{n:>7}" + "".join(f"{_cell(counts[r]):>10}" for r in routes)
                  + f"{fold.clip if fold and fold.folded else '-':>12}{torch_clip:>13}")  # fmt: skip
            if args.top:
                by_op = next(c for c in counts.values() if c is not None).by_op
                ops = sorted(by_op.items(), key=lambda kv: -kv[1])[: args.top]
                print("    " + ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in ops))


if __name__ == "__main__":
    main()
