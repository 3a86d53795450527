"""A study defined as data (study/studies/<study>.yaml): its parts, what each runs, which part
starts from which, and where each part's files go. ``python -m study run <study>`` runs it
(study/parts.py); this module reads a definition and turns each part into the Plan it runs
(``plan_of``; study/plan.py), which the flag command (``python -m study --out ...``, a
one-part definition) builds the same way.

A definition file:

    study: referee                 # the name: results/<study>/<part>/ holds each part's files
    defaults: {...}                # values every part takes unless it sets its own
    parts:
      NAME: {...}                  # in the order they are listed (see PART_KEYS)
    order: [NAME, ...]             # what `run` runs without --part (default: every part);
                                   # an entry {part: NAME, main_only: true} runs its main
                                   # budgets alone (no baseline budgets) at that point
    compare:                       # python -m study cells over the published parts
      NAME: [LABEL=PART[@MODEL:BUDGET], ...]
    tables: [NAME, ...]            # the study's own tables over its parts (TABLES), rewritten
                                   # after each part: crossover (study/findings/crossover_report.py),
                                   # correction (study/findings/correction.py), family (study/findings/family.py),
                                   # readmes (study/part_readme.py)

A part starts from another when its ``center_from`` (``PART@MODEL:BUDGET``: that part's published
ledger, results/<study>/<PART>/results.csv, at that cell; ``STUDY/PART@...`` another study's),
``merge`` or ``from`` (a factorial: the part's run-tree ledger) names it; it runs after it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from study.plan import OPTIMIZERS, Plan

STUDIES = Path(__file__).resolve().parent / "studies"  # the committed definitions
KINDS = ("study", "factorial")
# a definition names these; study/parts.py's TABLE_WRITERS writes each (tests keep the two equal)
TABLES = ("crossover", "correction", "family", "readmes")
# What a part may say: its own keys, then the Plan fields it sets (study/plan.py, the same
# names; ``center_from`` and ``merge`` name published ledgers, ``overrides`` is the Plan's
# ``extra``). A new part key: a Plan field and its name here.
OWN_KEYS = ("kind", "description", "runs", "results", "from")
PART_KEYS = (*OWN_KEYS, "optimizers", "untuned", "models", "budgets", "baseline_budgets",
             "select_seeds", "eval_seeds", "batch_tokens", "knobs", "centers", "center_from",
             "merge", "merge_only", "swap", "overrides")  # fmt: skip
PLAN_FIELDS = {f.name: f for f in dataclasses.fields(Plan) if f.init}
# Keys renamed so that each word has one meaning: the old spelling refused with the new one.
RENAMED_KEYS = {"reference_budgets": "baseline_budgets"}
# The keys that are lists, and what they hold: the Plan's list fields' items, and two of refs
_ITEMS = {"str": (str,), "float": (int, float), "int": (int,)}
LISTS = {key: _ITEMS[m[1]] for key in PART_KEYS if key in PLAN_FIELDS
         and (m := re.match(r"list\[(\w+)\]", str(PLAN_FIELDS[key].type))) and m[1] in _ITEMS}  # fmt: skip
LISTS |= {"merge": (str,), "overrides": (str,)}  # fmt: skip
EXAMPLES = {"budgets": "[0.25]", "baseline_budgets": "[2, 4]", "select_seeds": "[0, 6, 7]",
            "eval_seeds": "[1, 2, 3, 4, 5]", "models": "[proxy-100k]",
            "overrides": "[model.init_std=0.098]", "merge": "[ladder]"}  # fmt: skip
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_REF = re.compile(r"(?:(?P<study>[a-z0-9][a-z0-9_-]*)/)?(?P<part>[a-z0-9][a-z0-9_-]*)"
                  r"(?:@(?P<cell>[\w.-]+:[0-9.]+))?")  # fmt: skip


class DefinitionError(ValueError):
    """A definition that cannot run: one line naming the file, the problem and the fix."""


@dataclass(frozen=True)
class Ref:
    """``[STUDY/]PART[@MODEL:BUDGET]``: a part's published ledger, and a cell of it."""

    study: str
    part: str
    cell: str | None

    def ledger(self, parts: dict[str, Part]) -> Path:
        """Its published results.csv (a part of ``parts``' study: that part's ``results``)."""
        own = parts.get(self.part)
        if own is not None and own.study == self.study:
            return own.results / "results.csv"
        return Path("results") / self.study / self.part / "results.csv"


@dataclass
class Part:
    """One part of a study: its values (PART_KEYS) and where its files go."""

    study: str
    name: str
    values: dict[str, Any]
    runs: Path  # its run tree (ignored by git)
    results: Path  # its published folder (committed)

    @property
    def kind(self) -> str:
        """``study`` (python -m study) or ``factorial`` (python -m study factorial)."""
        return self.values.get("kind", "study")

    def starts_from(self) -> list[str]:
        """The parts of its own study it reads (it runs after them)."""
        refs = [r for r in self.refs() if r.study == self.study]
        return [r.part for r in refs] + ([self.values["from"]] if "from" in self.values else [])

    def refs(self) -> list[Ref]:
        """The published ledgers it reads: its ``center_from``, then its ``merge``."""
        given = [self.values["center_from"]] if "center_from" in self.values else []
        return [parse_ref(r, self.study) for r in given + list(self.values.get("merge", []))]


@dataclass
class Definition:
    """A study: its parts in order, what `run` runs by default, its comparisons."""

    name: str
    parts: dict[str, Part]
    order: list[tuple[str, bool]] = field(default_factory=list)  # (part, main budgets only)
    compare: dict[str, list[str]] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)  # TABLES, written after each part


def parse_ref(text: object, study: str) -> Ref:
    """``[STUDY/]PART[@MODEL:BUDGET]`` (``study``: the study it is written in) as a Ref."""
    m = _REF.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise DefinitionError(f"{text!r}: write PART, PART@MODEL:BUDGET or STUDY/PART@MODEL:BUDGET, "
                              "e.g. ladder@proxy-100k:0.25")  # fmt: skip
    return Ref(m["study"] or study, m["part"], m["cell"])


def find(name: str) -> Path:
    """A study's definition file: ``referee`` -> study/studies/referee.yaml, or a path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    if _NAME.fullmatch(name) and (STUDIES / f"{name}.yaml").is_file():
        return STUDIES / f"{name}.yaml"
    known = ", ".join(sorted(p.stem for p in STUDIES.glob("*.yaml")))
    raise DefinitionError(f"no study {name!r}: name one of study/studies/ ({known}) or give a "
                          "definition file (.yaml)")  # fmt: skip


def load(name: str, runs_root: Path | None = None) -> Definition:
    """Read and check a definition; ``runs_root`` moves every run tree ``runs/X`` to
    ``runs_root/X`` (another machine's tree). Raises DefinitionError (one line)."""
    path = find(name)
    try:
        data = yaml.safe_load(path.read_text())
        return _build(data, runs_root)
    except DefinitionError as exc:
        raise DefinitionError(f"{path.name}: {exc}") from None
    except yaml.YAMLError as exc:
        raise DefinitionError(f"{path.name}: not YAML ({str(exc).splitlines()[0]})") from None


def _build(data: object, runs_root: Path | None) -> Definition:
    """The Definition of a file's parsed YAML, checked."""
    if not isinstance(data, dict) or not isinstance(data.get("parts"), dict) or not data["parts"]:
        raise DefinitionError("a definition is a mapping with study: NAME and parts: {NAME: ...}")
    unknown = set(data) - {"study", "defaults", "parts", "order", "compare", "tables"}
    if unknown:
        raise DefinitionError(f"unknown key {sorted(unknown)[0]!r}: a definition has study, "
                              "defaults, parts, order, compare, tables")  # fmt: skip
    tables = data.get("tables") or []
    if not isinstance(tables, list) or any(t not in TABLES for t in tables):
        raise DefinitionError(f"tables: {tables!r}: a list of {', '.join(TABLES)}")
    study = data.get("study")
    if not isinstance(study, str) or not _NAME.fullmatch(study):
        raise DefinitionError(f"study: {study!r}: a lower-case name, e.g. study: referee")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise DefinitionError("defaults: a mapping of a part's keys, e.g. defaults: {models: [m]}")
    parts = {}
    for name, values in data["parts"].items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise DefinitionError(f"part {name!r}: a lower-case name, e.g. ladder-up")
        if not isinstance(values or {}, dict):
            raise DefinitionError(
                f"part {name}: a mapping of its keys, e.g. {name}: {{budgets: [1]}}"
            )
        parts[name] = _part(study, name, {**defaults, **(values or {})}, runs_root)
    definition = Definition(study, parts, compare=data.get("compare") or {}, tables=tables)
    definition.order = _order(data.get("order"), parts)
    check(definition)
    return definition


def _part(study: str, name: str, values: dict, runs_root: Path | None) -> Part:
    """One part's values (the defaults under its own), checked, with its two folders."""
    unknown = sorted(set(values) - set(PART_KEYS))
    for key in unknown:
        if key in RENAMED_KEYS:
            raise DefinitionError(
                f"part {name}: {key} is now {RENAMED_KEYS[key]} (the same values)"
            )
    if unknown:
        raise DefinitionError(f"part {name}: unknown key {unknown[0]!r}; a part has "
                              f"{', '.join(PART_KEYS)}")  # fmt: skip
    _check_types(name, values)
    if values.get("kind", "study") not in KINDS:
        raise DefinitionError(f"part {name}: kind {values['kind']!r}: one of {', '.join(KINDS)}")
    if values.get("kind") == "factorial" and "from" not in values:
        raise DefinitionError(
            f"part {name}: a factorial says from: PART (the study it takes apart)"
        )
    runs = Path(values.get("runs", f"runs/{study}/{name}"))
    results = Path(values.get("results", f"results/{study}/{name}"))
    for key, path in (("runs", runs), ("results", results)):
        if path.is_absolute() or ".." in path.parts:
            raise DefinitionError(f"part {name}: {key}: {path}: a path inside the checkout, "
                                  f"e.g. {key}/{study}/{name}")  # fmt: skip
    if runs_root is not None and runs.parts[0] == "runs":
        runs = runs_root.joinpath(*runs.parts[1:])
    return Part(study, name, values, runs, results)


def _check_types(name: str, values: dict) -> None:
    """A value of the wrong shape, refused here in one line rather than by argparse later."""
    for key, value in values.items():
        if key in LISTS and not (isinstance(value, list) and all(
                isinstance(v, LISTS[key]) and not isinstance(v, bool) for v in value)):  # fmt: skip
            kind = "numbers" if LISTS[key] == (int, float) else "names"
            raise DefinitionError(f"part {name}: {key}: {value!r}: a list of {kind}, e.g. "
                                  f"{key}: {EXAMPLES.get(key, '[adamw, mars-adamw]')}")  # fmt: skip
    if "batch_tokens" in values and not (
        isinstance(values["batch_tokens"], int) and values["batch_tokens"] > 0
    ):
        raise DefinitionError(f"part {name}: batch_tokens: {values['batch_tokens']!r}: a "
                              "positive whole number, e.g. batch_tokens: 8192")  # fmt: skip
    centers = values.get("centers", {})
    if not isinstance(centers, dict) or not all(isinstance(c, dict) for c in centers.values()):
        raise DefinitionError(f"part {name}: centers: a mapping OPT: {{KNOB: VALUE}}, e.g. "
                              "centers: {adamw: {lr: 0.008}}")  # fmt: skip
    if not isinstance(values.get("swap", True), bool):
        raise DefinitionError(f"part {name}: swap: {values['swap']!r}: true or false")


def _order(items: object, parts: dict[str, Part]) -> list[tuple[str, bool]]:
    """``order``'s (part, main budgets only) pairs; every part after the parts it starts from."""
    if items is None:
        return [(name, False) for name in parts]
    items = items if isinstance(items, list) else [items]
    listed = {str(_entry(item)[0]) for item in items}
    out: list[tuple[str, bool]] = []
    for item in items:
        name, main_only = _entry(item)
        if not isinstance(name, str) or name not in parts:
            raise DefinitionError(f"order: {item!r}: not a part ({', '.join(parts)})")
        early = [d for d in parts[name].starts_from() if d in listed - {n for n, _ in out}]
        if early:
            raise DefinitionError(f"order: {name} starts from {early[0]}: put {early[0]} first")
        out.append((name, main_only))
    return out


def _entry(item: object) -> tuple[object, bool]:
    """An ``order`` entry: ``NAME`` or ``{part: NAME, main_only: true}``."""
    if isinstance(item, dict):
        return item.get("part"), bool(item.get("main_only"))
    return item, False


def check(definition: Definition) -> None:
    """Every part a part starts from exists and runs before it, in the order and in the file."""
    parts = definition.parts
    names = list(parts)
    for part in parts.values():
        for dep in part.starts_from():
            if dep not in parts:
                raise DefinitionError(f"part {part.name} starts from {dep!r}: no such part "
                                      f"({', '.join(names)})")  # fmt: skip
            if names.index(dep) >= names.index(part.name):
                raise DefinitionError(f"part {part.name} starts from {dep}: list {dep} first")
    for name, entries in definition.compare.items():
        if not isinstance(entries, list) or not entries:
            raise DefinitionError(f"compare: {name}: a list of LABEL=PART[@MODEL:BUDGET]")
        for entry in entries:
            label, eq, ref = str(entry).partition("=")
            if not (label and eq) or parse_ref(ref, definition.name).part not in parts:
                raise DefinitionError(f"compare: {name}: {entry!r}: write LABEL=PART[@MODEL:BUDGET] "
                                      f"with a part of this study ({', '.join(names)})")  # fmt: skip


def ordered(definition: Definition, wanted: list[str]) -> list[tuple[str, bool]]:
    """The parts to run: ``wanted`` (each whole) in the file's order, so a part runs after the
    parts it starts from; none named: the definition's ``order``."""
    if not wanted:
        return list(definition.order)
    bad = [w for w in wanted if w not in definition.parts]
    if bad:
        raise DefinitionError(f"--part {bad[0]}: no such part of {definition.name} "
                              f"({', '.join(definition.parts)})")  # fmt: skip
    return [(name, False) for name in definition.parts if name in wanted]


def plan_of(part: Part, parts: dict[str, Part], options: dict | None = None, *,
            main_only: bool = False, cells: dict | None = None) -> Plan:  # fmt: skip
    """The Plan the part runs: its values as the Plan's fields (``center_from`` and ``merge``
    read as the published ledgers they name in ``parts``), its run tree as ``out``, ``options``
    (Plan fields: how it runs, e.g. ``jobs``; ``overrides``: train.py overrides after the part's
    own, how a run is computed, never a value the study compares) over them; ``main_only``: its
    main budgets alone; ``cells``: Plan fields in place of the part's own (a factorial's, from
    the ledger of the part it starts from: study/findings/factorial.py ``fields``). Raises ValueError (one
    line) for a value the study cannot run with."""
    v, options = part.values, dict(options or {})
    if cells is not None:
        fields = dict(cells)
    elif part.kind == "factorial":
        raise ValueError(
            f"part {part.name}: a factorial's cells come from study/findings/factorial.py"
        )
    else:
        fields = {k: v[k] for k in PART_KEYS if k in v and k in PLAN_FIELDS}
    if "center_from" in v:
        ref = parse_ref(v["center_from"], part.study)
        fields.update(center_from=ref.ledger(parts), center_cell=ref.cell)
    if "merge" in v:
        fields["merge"] = [parse_ref(m, part.study).ledger(parts) for m in v["merge"]]
    if main_only:
        fields["baseline_budgets"] = []
    extra = [*map(str, v.get("overrides") or []), *map(str, options.pop("overrides", []))]
    out = part.runs if part.runs.is_absolute() else Path.cwd() / part.runs
    fields = {**fields, **options, "out": out, "extra": extra}
    if fields.get("center_from") is not None:
        fields["carried"] = centers_from(fields["center_from"], fields.get("center_cell"),
                                         fields.get("optimizers", OPTIMIZERS))  # fmt: skip
    plan = Plan(**fields)
    plan.check_files()
    return plan


def centers_from(path: Path, cell: str | None, optimizers: list[str]) -> dict:
    """``{optimizer: {knob: value}}`` of the chosen evaluation runs in another study's
    results.csv (one cell: ``cell`` as MODEL:BUDGET, or the file's only one). A variant
    (``mars-adamw:gamma=0``) takes its base optimizer's values when the file lacks it."""
    from study.knobs import KNOBS
    from study.ledger import read_csv
    from study.variant import Variant

    if not path.is_file():
        raise ValueError(f"--center-from {path}: no such file (a study's results.csv)")
    rows = [r for r in read_csv(path) if r["role"] == "eval" and r.get("chosen") == 1.0]
    cells = sorted({(r["model"], r["budget"]) for r in rows})
    if cell is not None:
        model, _, budget = cell.partition(":")
        cells = [c for c in cells if c == (model, float(budget.rstrip("x") or "nan"))]
    if len(cells) != 1:
        raise ValueError(f"--center-from {path}: say which cell with --center-cell MODEL:BUDGET "
                         f"(it has {', '.join(f'{m}:{b:g}' for m, b in cells) or 'none'})")  # fmt: skip
    out = {}
    for opt in optimizers:
        for name in (opt, Variant.parse(opt).base):
            hit = [
                r for r in rows if (r["model"], r["budget"]) == cells[0] and r["optimizer"] == name
            ]
            if hit:
                out[opt] = {k: hit[0][k] for k in KNOBS if isinstance(hit[0].get(k), float)}
                break
    return out


def compare_args(definition: Definition, name: str) -> list[str]:
    """``python -m study cells`` arguments of one comparison, into results/<study>/compare/."""
    sources = []
    for entry in definition.compare[name]:
        label, _, text = str(entry).partition("=")
        ref = parse_ref(text, definition.name)
        sources.append(
            f"{label}={ref.ledger(definition.parts)}" + (f"@{ref.cell}" if ref.cell else "")
        )
    dst = Path("results") / definition.name / "compare"
    return [*sources, "--out", str(dst / f"{name}.md"), "--figure", str(dst / f"{name}.png")]
