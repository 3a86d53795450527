"""``python -m study``: the one door to the study (docs/study.md).

    python -m study --out DIR --optimizers ...   # the flag command: a study (study/cli.py)
    python -m study run|publish|compare <study>  # a study defined as data (study/parts.py)
    python -m study <subcommand> ...             # an instrument or tool (SUBCOMMANDS below)
    python -m study help                         # every subcommand, one line each

Each subcommand is a module's ``main(argv)``, given the words after its name; the table below is
the registry (a new instrument: its module in study/findings/ with a ``main(argv)``, and one row
here).
"""

import importlib
import sys

# name -> (module, one line of help); run, publish and compare are study/parts.py's commands
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("study.parts", "run a study defined as data, or some of its parts"),
    "publish": ("study.parts", "copy a study's finished parts into results/"),
    "compare": ("study.parts", "write a study definition's comparisons across its parts"),
    "cells": ("study.compare", "a ranking across cells: results.csv files side by side"),
    "crossover": (
        "study.findings.crossover",
        "the batch crossover: `report` (table, figure), `corpus`",
    ),
    "rerun": ("study.rerun", "does this checkout reproduce committed runs?"),
    "predict": ("study.findings.predict", "the batch crossover predicted from a run's gradients"),
    "probe": (
        "study.findings.vr_probe",
        "how much MARS's approximate correction inflates the gradient",
    ),
    "family": ("study.findings.family", "one Holm correction over every test the study reports"),
    "correction": (
        "study.findings.correction",
        "the correction on AdamW's configuration, taken apart",
    ),
    "summary": ("study.summary", "the study's results in one table and one figure"),
    "readmes": ("study.part_readme", "render each published part's README.md"),
    "speed": ("study.findings.proxy_speed", "how fast the proxy models train on this machine"),
    "factorial": ("study.findings.factorial", "MARS-AdamW's loss taken apart, factor by factor"),
    "gains": ("study.findings.gains", "the LayerNorm gains along runs, from their checkpoints"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items())
    return (
        "usage: python -m study --out DIR --optimizers ... (the flag command: --help)\n"
        "       python -m study <subcommand> [args ...]\n\nsubcommands:\n" + rows + "\n"
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("help", "-h", "--help"):
        if argv[1:2] and argv[1] in SUBCOMMANDS:  # `help NAME`: that subcommand's own --help
            return main([argv[1], "--help"])
        print(usage(), end="")
        if argv[:1] == ["--help"] or argv[:1] == ["-h"]:
            print("\nthe flag command's options: python -m study --out DIR --help")
        return 0
    name, rest = argv[0], argv[1:]
    if name.startswith("-"):  # the flag command, as it always was
        from study import cli

        return cli.main(argv)
    if name not in SUBCOMMANDS:
        print(f"python -m study: unknown subcommand {name!r}; valid: {', '.join(SUBCOMMANDS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    module = SUBCOMMANDS[name][0]
    if module == "study.parts":
        from study import parts

        return parts.main(argv)
    return importlib.import_module(module).main(rest) or 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
