"""``python -m optim.conformance MODULE:NAME [--vectors PATTERN ...]``: check a MARS port.

``NAME`` is either a class taking the official constructor's keywords (``optim:MARS``: run on
the vectors of the official class of that name) or a hook ``make(params, settings)``
(optim/conformance/adapters.py; its vectors from ``--vectors`` or its ``vectors`` attribute).
Prints one line per vector (PASS, or the first step and tensor out of tolerance with the max
absolute and relative error) and exits 1 when any vector fails. docs/conformance.md has examples.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from optim.conformance.adapters import make_dropin
from optim.conformance.runner import check, for_class, manifest, report, select


def resolve(target: str):
    """The object named by ``module:attr``."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(
            f"target {target!r} is not MODULE:NAME; e.g. optim:MARS or mypkg.port:make"
        )
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"cannot import {module_name!r} ({exc}); run from the folder that "
                         "holds it or add it to PYTHONPATH") from None  # fmt: skip
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SystemExit(f"{module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def plan(obj, patterns: list[str] | None):
    """``(make, entries)`` for a class or a hook."""
    patterns = patterns or getattr(obj, "vectors", None)
    make = make_dropin(obj) if isinstance(obj, type) else obj
    if patterns:
        try:
            return make, select(list(patterns))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    if isinstance(obj, type) and for_class(obj.__name__):
        return make, for_class(obj.__name__)
    names = ", ".join(e["name"] for e in manifest()["vectors"])
    raise SystemExit(f"no vectors chosen for {obj!r}: pass --vectors PATTERN (vectors: {names})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optim.conformance", description=__doc__)
    parser.add_argument("target", nargs="?", help="MODULE:NAME of a drop-in class or a make() hook")
    parser.add_argument("--vectors", nargs="+", help="vector names or shell patterns")
    parser.add_argument(
        "--set-to-none",
        action="store_true",
        help="reset gradients with zero_grad(set_to_none=True), as the official "
        "scripts (default: False, which exposes a reference kept as an alias)",
    )
    parser.add_argument("--list", action="store_true", help="list the vectors and exit")
    args = parser.parse_args(argv)
    if args.list:
        for e in manifest()["vectors"]:
            print(f"{e['name']:20s} {e['mode']:6s} {e['official']}")
        return 0
    if args.target is None:
        parser.error("a target MODULE:NAME is needed (or --list)")
    make, entries = plan(resolve(args.target), args.vectors)
    results = check(make, entries, set_to_none=args.set_to_none)
    for r in results:
        print(report(r))
    failed = [r.name for r in results if not r.passed]
    commit = manifest()["official"]["commit"][:7]
    print(f"{len(results) - len(failed)}/{len(results)} vectors pass (official AGI-Arena/MARS "
          f"{commit})" + (f"; failing: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
