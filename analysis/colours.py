"""One colour per optimizer in every figure of the project: the study's figures name optimizers
by their registered names (``mars-adamw``), the report's by display labels (``MARS-approx``);
both read their colours here, so an optimizer never changes colour between figures."""

from __future__ import annotations

from collections.abc import Sequence

COLOURS = {
    "adamw": "tab:blue", "muon": "tab:orange", "moonlight": "tab:purple",
    "mars-adamw": "tab:red", "mars-m": "tab:green", "mars-adamw:gamma=0": "tab:pink",
    "normuon": "tab:olive", "soap": "tab:cyan", "mars-soap": "tab:brown",
    "ademamix": "tab:gray", "mars-ademamix": "gold", "adamw-schedulefree": "navy",
}  # fmt: skip
# The report's display labels (report/: the papers' names for the runs it reads).
LABELS = {
    "AdamW": "adamw", "Muon": "muon", "Moonlight": "moonlight", "MARS-approx": "mars-adamw",
    "MARS-M": "mars-m",
}  # fmt: skip
LABEL_COLOURS = {"MARS-exact": "tab:brown", "MARS-M (γ=0.01)": "tab:olive",
                 "MARS-M-exact": "tab:cyan"}  # fmt: skip
SPARE = ("teal", "black", "darkkhaki", "slateblue", "sienna", "lightgreen")


def colour_of(name: str, others: Sequence[str] = ()) -> str:
    """The fixed colour of an optimizer (registered name or display label); a name without one
    takes a spare, in the sorted order of ``others`` (the labels that share the spares)."""
    if name in COLOURS:
        return COLOURS[name]
    if name in LABELS:
        return COLOURS[LABELS[name]]
    if name in LABEL_COLOURS:
        return LABEL_COLOURS[name]
    spare = sorted(o for o in others if o not in COLOURS and o not in LABELS
                   and o not in LABEL_COLOURS)  # fmt: skip
    return SPARE[spare.index(name) % len(SPARE)] if name in spare else "black"


def fixed(name: str) -> bool:
    """Whether ``name`` has a colour of its own (not a spare)."""
    return name in COLOURS or name in LABELS or name in LABEL_COLOURS
