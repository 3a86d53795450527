"""A study run from its definition (study/definition.py, study/studies/<study>.yaml):

    python -m study run <study> [--part P ...] [--jobs 2] [--threads 1] [--device D]
                                [--runs DIR] [--allow-dirty] [--report-only] [--dry-run]
                                [--set KEY=VALUE ...]
    python -m study publish <study> [--part P ...] [--runs DIR]
    python -m study compare <study>

``run`` restores every part's committed ledger (results.csv, curves.csv.gz, started.txt from its
published folder) into its run tree where the tree lacks them, so a fresh clone continues from
the ledgers (study/ledger.py); then runs each part (the parts named, in the definition's order;
none named: its ``order``) as its Plan (study/definition.py ``plan_of``, run by study/cli.py)
and publishes it. ``--report-only`` rewrites the reports of the parts that have run (none named:
every part, each once), publishing nothing; ``publish`` does that, then copies each part's files into its published folder.
After each part, the definition's own ``tables`` are rewritten from the published files (the
crossover's: study/findings/crossover_report.py). ``compare`` writes the definition's comparisons from
the published files. Paths are read from
the checkout's root (the definitions name them from there), whatever the working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from study import cli, compare
from study import definition as defs
from study.definition import Definition, DefinitionError, Part
from study.findings import factorial

log = logging.getLogger("study")
ROOT = Path(__file__).resolve().parent.parent
RESTORED = ("results.csv", "curves.csv.gz", "started.txt")  # what a continuing study reads
PUBLISHED = ("results.csv", "curves.csv.gz", "report.md", "factorial.md", "curves.png",
             "study.png", "started.txt")  # fmt: skip
COMMANDS = ("run", "publish", "compare")
DEVICES = ("auto", "cpu", "cuda", "mps")  # runtime.distributed.pick_device's


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line of ``run``, ``publish`` and ``compare``; a bad value: argparse's line."""
    ap = argparse.ArgumentParser(prog="python -m study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("command", choices=COMMANDS)
    ap.add_argument("study", help="a study of study/studies/ (referee, crossover) or a .yaml")
    ap.add_argument("--part", nargs="+", default=[], metavar="P", help="these parts alone")
    ap.add_argument("--jobs", type=int, default=cli.DEFAULTS["jobs"], help="runs at a time")
    ap.add_argument("--threads", type=int, default=cli.DEFAULTS["threads"],
                    help="CPU threads per run")  # fmt: skip
    ap.add_argument("--device", default=None, help="train.py's device (cuda: --jobs share it)")
    ap.add_argument("--runs", type=Path, default=None, metavar="DIR",
                    help="the folder of the run trees (default runs/: runs/X becomes DIR/X)")  # fmt: skip
    ap.add_argument("--allow-dirty", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="reports only, nothing published")
    ap.add_argument("--dry-run", action="store_true", help="print each part's first commands")
    ap.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="train.py overrides after each part's own: how its runs are computed "
        "(e.g. micro_batch_size=2048 on a GPU), not a value the study compares",
    )
    args = ap.parse_args(argv)
    args.argv = list(argv)  # the command again, for a stop's last line
    for name, value in (("--jobs", args.jobs), ("--threads", args.threads)):
        if value < 1:
            ap.error(f"{name} {value}: at least 1")
    if args.command == "compare" and args.part:
        ap.error("compare takes no --part: it compares the parts its definition names")
    for item in args.overrides:
        key, eq, _ = item.partition("=")
        if not (eq and key.strip()):
            ap.error(f"--set {item!r}: write KEY=VALUE (a train.py override, e.g. "
                     "micro_batch_size=2048)")  # fmt: skip
    if args.runs is not None and args.runs.exists() and not args.runs.is_dir():
        ap.error(f"--runs {args.runs}: a file, not a folder (give the folder that holds the run "
                 "trees, e.g. another machine's runs/)")  # fmt: skip
    if args.device is not None and args.device not in DEVICES:
        ap.error(f"--device {args.device}: one of {', '.join(DEVICES)} (train.py's device)")
    return args


def copy_files(src: Path, dst: Path, names: tuple[str, ...], *, overwrite: bool) -> list[str]:
    """Copy the files ``names`` of ``src`` that exist into ``dst``; the names copied."""
    done = []
    for name in names:
        if (src / name).is_file() and (overwrite or not (dst / name).exists()):
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / name, dst / name)
            done.append(name)
    return done


def restore(definition: Definition, *, dry_run: bool = False) -> None:
    """Every part's published ledger into its run tree, never over a file there (the script's
    rule: a part reads the run trees of the parts it starts from, so all are restored). A dry
    run copies nothing: each part reads its published ledger where it is (study.ledger's
    ``SOURCES``)."""
    from study import ledger

    for part in definition.parts.values():
        if dry_run:
            if not (part.runs / ledger.RESULTS).is_file():
                ledger.SOURCES[part.runs.resolve()] = part.results.resolve()
            continue
        for name in (ledger.RESULTS, ledger.CURVES):  # an edit since it was published: refused
            if (part.results / name).is_file() and not (part.runs / name).exists():
                ledger.check_checksum(part.results / name)
        copied = copy_files(part.results, part.runs, RESTORED, overwrite=False)
        if copied:
            log.info("restored %s of %s into %s", ", ".join(copied), part.name, part.runs)


def ran(part: Part) -> bool:
    """Whether the part has anything to report: a ledger or run directories in its tree."""
    return (part.runs / "results.csv").is_file() or (part.runs / "runs").is_dir()


def run_part(part: Part, definition: Definition, options: dict, main_only: bool) -> int:
    """One part: its Plan (study/definition.py ``plan_of``) run by study.cli (a factorial's
    also writes its factorial.md); ``options``: the Plan's run fields, the ``overrides`` of
    ``--set``, and ``again`` (the command that continues it)."""
    fields = {k: v for k, v in options.items() if k != "again"}
    source = None  # a factorial's: the run-tree ledger of the part it takes apart
    if part.kind == "factorial":
        source = definition.parts[part.values["from"]].runs / "results.csv"
    try:
        cells = factorial.fields(source) if source else None
        plan = defs.plan_of(part, definition.parts, fields, main_only=main_only, cells=cells)
    except ValueError as exc:
        raise SystemExit(f"study: {exc}") from None
    argv = said = cli.command_line(plan, shown=set(part.values))
    if source:  # said as its own command: its cells come from the ledger
        said = ["--from", str(source), "--out", argv[1], *cli.run_flags(plan)]
    log.info("study %s, part %s: python -m %s %s", definition.name, part.name,
             "study.findings.factorial" if part.kind == "factorial" else "study", " ".join(said))  # fmt: skip
    try:
        code = cli.run(plan, argv)
        return factorial.finish(plan, code) if source else code
    except SystemExit as exc:  # a stop (Ctrl-C, SIGTERM): name this command, which continues
        if str(exc.code).startswith("study: run "):  # a failed run (study.scheduler.RunFailed)
            raise SystemExit(f"study: part {part.name}: {str(exc.code)[7:]}") from None
        head, sep, _ = str(exc.code).partition("; the same command continues: ")
        if not (sep and head.startswith("study: stopped")):
            raise
        raise SystemExit(
            f"{head} (part {part.name}); the same command continues: "
            f"{options.get('again', 'python -m study run ' + definition.name)}"
        ) from None


def publish(part: Part) -> None:
    """The part's files (PUBLISHED) from its run tree into its published folder, with their
    checksums (``checksums.sha256``: every reader checks the ledger against it)."""
    from study import ledger

    copied = copy_files(part.runs, part.results, PUBLISHED, overwrite=True)
    ledger.write_checksums(part.results)
    log.info("published %s of %s into %s", ", ".join(copied) or "nothing", part.name, part.results)


def run(definition: Definition, args: argparse.Namespace) -> int:
    """``run`` and ``publish``: restore, then each part in turn; stop at the first that fails."""
    report_only = args.report_only or args.command == "publish"
    # the Plan's run fields (a report: none but report_only, as the flags' --report-only)
    options: dict = {"report_only": report_only}
    if not report_only:
        options |= {"jobs": args.jobs, "threads": args.threads, "device": args.device,
                    "dry_run": args.dry_run, "allow_dirty": args.allow_dirty}  # fmt: skip
    options |= {"overrides": args.overrides,
                "again": shlex.join(["python", "-m", "study", *args.argv])}  # fmt: skip
    check_parts(definition, args)  # every part's overrides, before anything runs or is copied
    restore(definition, dry_run=args.dry_run)
    # a report or publish without --part: every part once, whole (the order's staging is for runs)
    wanted = args.part or (list(definition.parts) if report_only else [])
    for name, main_only in defs.ordered(definition, wanted):
        part = definition.parts[name]
        if report_only and not ran(part):
            log.info("part %s has not run (no ledger or runs in %s): nothing to report",
                     name, part.runs)  # fmt: skip
            continue
        rc = run_part(part, definition, options, main_only)
        if rc:
            return rc
        if args.command == "publish" or not (args.report_only or args.dry_run):
            publish(part)
        if not args.dry_run:
            write_tables(definition)
    return 0


def check_parts(definition: Definition, args: argparse.Namespace) -> None:
    """Every part that this command runs, its overrides and the command line's (``--set``,
    ``--device``) checked as train.py checks its own (study.runner's ``check_overrides``) before
    any part runs: one line naming the part, not a part that fails after the others ran.
    Each part checks its runs' whole commands again when it starts (study.cli's ``preflight``)."""
    from study.runner import check_overrides

    if args.report_only or args.command != "run":
        return
    device = [f"device={args.device}"] if args.device else []
    done: set[tuple[str, ...]] = set()
    for name, _ in defs.ordered(definition, args.part):
        part = definition.parts[name]
        models = part.values.get("models") or ["proxy-100k"]
        overrides = (
            "experiment=study",
            f"model={models[0]}",
            *device,
            *map(str, part.values.get("overrides") or []),
            *args.overrides,
        )
        if overrides in done:
            continue
        done.add(overrides)
        try:
            check_overrides(list(overrides), dry_run=args.dry_run)
        except ValueError as exc:
            raise SystemExit(f"study: part {name}: {exc}; nothing was run (fix --set, --device "
                             "or the part's overrides)") from None  # fmt: skip


def _crossover_table(definition: Definition) -> None:
    """One part per batch, in one folder: the crossover's table (study/findings/crossover_report.py)."""
    from study.findings import crossover_report

    cells = []
    for name, p in definition.parts.items():  # b<B>, m<SIZE>-b<B>: a cell; else a check
        cell = crossover_report.Cell.of(name)
        if cell is None:
            continue
        if (cell.batch, [cell.model]) != (int(p.values["batch_tokens"]), p.values["models"]):
            raise SystemExit(f"study {definition.name}: part {name} runs "
                             f"{p.values['models']} at {p.values['batch_tokens']} bytes, "
                             f"not the cell its name says ({cell.model} at {cell.batch})")  # fmt: skip
        cells.append(cell)
    log.info("the crossover's table: %s", crossover_report.write(_folder(definition), cells))


def _correction_table(definition: Definition) -> None:
    """The correction's anatomy (study/findings/correction.py) and the README's sentences from it."""
    from study.findings import correction

    readme = ROOT / "README.md"
    has_block = (_the_repositorys(definition) and readme.is_file()
                 and correction.README_MARK.search(readme.read_text()))  # fmt: skip
    path = correction.write(_folder(definition), readme if has_block else None)
    log.info("the correction's anatomy: %s", path)


def _family_table(definition: Definition) -> None:
    """The study's one family (study/findings/family.py), and the docs' conclusions table from it."""
    from study.findings import family

    if not _the_repositorys(definition):
        log.info("the family's table: only for a study in %s", ROOT / "results")
        return
    docs = family.ROOT / "docs" / "study.md"
    argv = (
        ["--docs", str(docs)]
        if docs.is_file() and family.DOCS_MARK.search(docs.read_text())
        else []
    )
    family.main(argv)


def _part_readmes(definition: Definition) -> None:
    """Each published part's README (study/part_readme.py), every study's: a part's claims are
    the one family's, which every study's parts move."""
    from study import part_readme

    if not _the_repositorys(definition):
        log.info("the parts' READMEs: only for a study in %s", ROOT / "results")
        return
    part_readme.main([])


# A definition's ``tables`` (study/definition.py TABLES): each kind's writer, in the order named.
TABLE_WRITERS = {"crossover": _crossover_table, "correction": _correction_table,
                 "family": _family_table, "readmes": _part_readmes}  # fmt: skip


def _folder(definition: Definition) -> Path:
    folders = {p.results.parent for p in definition.parts.values()}
    if len(folders) != 1:
        raise SystemExit(f"study {definition.name}: its tables want every part's results in one "
                         "folder (results/<study>/<part>)")  # fmt: skip
    return folders.pop()


def _the_repositorys(definition: Definition) -> bool:
    """Whether the definition publishes into this repository's results/: only then do its
    tables rewrite the repository's own pages (README.md, docs/study.md, results/family.md and
    every part's README); a definition elsewhere (a copy, a test's) writes its own folder only."""
    return _folder(definition).resolve().is_relative_to((ROOT / "results").resolve())


def write_tables(definition: Definition) -> None:
    """The definition's own tables over its parts' published files (definition.TABLES)."""
    for name in definition.tables:
        TABLE_WRITERS[name](definition)


def compare_all(definition: Definition) -> int:
    """The definition's comparisons whose published files are all there."""
    for name in definition.compare:
        argv = defs.compare_args(definition, name)
        sources = [a.split("=", 1)[1].split("@")[0] for a in argv[: argv.index("--out")]]
        missing = [s for s in sources if not Path(s).is_file()]
        if missing:
            log.info("comparison %s waits for %s", name, ", ".join(missing))
            continue
        rc = compare.main(argv)
        if rc:
            return rc
    return 0


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Work from ``folder`` (the checkout's root), then go back: the definitions name their
    paths from there, and the comparisons print their sources as given."""
    before = Path.cwd()
    # '' on sys.path (python -c) is the folder it started in: keep it so, for the modules the
    # commands import later
    sys.path[:] = [p or str(before) for p in sys.path]
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def main(argv: list[str], root: Path = ROOT) -> int:
    """The ``run``, ``publish`` and ``compare`` commands (module docstring); ``root``: the
    checkout whose runs/ and results/ they read and write."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse(argv)
    study = args.study  # a definition file named from the caller's folder, before the cd
    if Path(study).suffix in (".yaml", ".yml"):
        study = str(Path(study).resolve())
    runs = args.runs.resolve() if args.runs is not None else None
    try:
        definition = defs.load(study, runs)
        defs.ordered(definition, args.part)  # an unknown --part: refused before anything runs
    except DefinitionError as exc:
        raise SystemExit(f"study: {exc}") from None
    with inside(root):
        return compare_all(definition) if args.command == "compare" else run(definition, args)
