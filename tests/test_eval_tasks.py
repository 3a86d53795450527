"""Downstream tasks: lm-eval's prompts, the HellaSwag clean-up, and acc / acc_norm on a model
whose log-likelihoods are known (every token equally likely)."""

import json
import math
from pathlib import Path

import pytest
import torch

from data.tokenizer import EOT, encode
from evals import tasks as T
from evals.scoring import encode_pair, evaluate_examples, loglikelihoods, score_examples
from model import GPT, GPTConfig

FIXTURE = Path(__file__).parent / "fixtures" / "hellaswag_sample.jsonl"


def fixture_rows():
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


class Uniform(torch.nn.Module):
    """Equal logits everywhere: log p(token) = -log(50257) over GPT-2's real vocabulary."""

    def forward(self, idx):
        return torch.zeros(*idx.shape, 50304), None


LOG_V = math.log(50257)


def test_hellaswag_preprocess_and_query():
    assert T.hellaswag_preprocess(" Do it [title] Then [step] go  now. ") == "Do it. Then go now."
    rows = fixture_rows()
    a, b, c = (T.hellaswag(r) for r in rows)
    assert a.contexts[0] == "Washing dishes: A woman stands at the sink. She"  # ctx_b capitalised
    assert a.continuations[1] == " rinses the plate and puts it on the rack."
    # " [title]" -> ". ", tags removed, double spaces collapsed; strip() runs first, as in lm-eval
    assert b.contexts[0] == "Home and Garden: How to water a plant. Fill a watering can."
    assert b.choices == (
        " Pour the water slowly.",
        "Sing loudly.",
        "Dance.",
        "Water the plant and the garden and the lawn.",
    )
    assert c.contexts[0] == "Playing fetch: A dog runs across a field. The dog"
    assert (a.gold, b.gold, c.gold) == (1, 3, 3)  # int labels and the olmo copy's string labels


def test_hellaswag_fixture_scores_by_hand():
    """Uniform model: a choice's log-likelihood is -n_tokens * log(V), so acc takes the choice
    with the fewest tokens (the first on ties) and acc_norm the fewest tokens per character."""
    examples = T.build_examples(T.TASKS["hellaswag"], fixture_rows())
    tokens = [
        [len(encode_pair(x, y)[1]) for x, y in zip(e.contexts, e.continuations)] for e in examples
    ]
    assert tokens == [[2, 12, 2, 3], [6, 3, 2, 10], [3, 11, 11, 2]]
    assert [[len(c) for c in e.choices] for e in examples] == [
        [6, 41, 6, 10],
        [23, 12, 6, 44],
        [6, 47, 46, 6],
    ]
    # acc picks 0 (tie 0/2), 2, 3; acc_norm picks 1 (12/41), 3 (10/44), 1 (11/47); gold 1, 3, 3
    result = evaluate_examples(Uniform(), examples, block_size=128, batch_size=5)
    assert result["n"] == 3
    assert result["acc"] == pytest.approx(1 / 3)
    assert result["acc_norm"] == pytest.approx(2 / 3)
    assert result["acc_stderr"] == pytest.approx(math.sqrt((1 / 3) * (2 / 3) / 2))
    lls = loglikelihoods(Uniform(), [encode_pair("Answer:", " no")], block_size=128)
    assert lls == [pytest.approx(-LOG_V)]  # softmax over the 50257 real tokens, not 50304


def test_score_examples_uses_characters_without_the_space():
    ex = T.multiple_choice("Q:", ["dog", "cats and dogs"], 0)
    counts = score_examples([[-1.0, -3.0]], [ex])  # norms: -1/3 and -3/13
    assert counts == {"n": 1.0, "acc": 1.0, "acc_norm": 0.0}


def test_encode_pair_follows_lm_eval():
    ctx, cont = encode_pair("Question: Is it?\nAnswer: ", "yes")  # trailing space moves over
    assert ctx == encode("Question: Is it?\nAnswer:") and cont == encode(" yes")
    assert encode_pair("", " hello") == ([EOT], encode(" hello"))
    # the continuation is the joint encoding past the context's token count, as in lm-eval
    ctx, cont = encode_pair("foo", "bar")
    assert ctx == encode("foo") and cont == encode("foobar")[len(ctx) :]


def test_prompt_formats_match_lm_eval():
    arc = T.arc(
        {"question": "Why?", "choices": {"text": ["a", "b"], "label": ["1", "2"]}, "answerKey": "2"}
    )
    assert arc.contexts[0] == "Question: Why?\nAnswer:" and arc.continuations == (" a", " b")
    assert arc.gold == 1
    piqa = T.piqa({"goal": "Open a jar", "sol1": "twist", "sol2": "hit", "label": 0})
    assert piqa.contexts[0] == "Question: Open a jar\nAnswer:" and piqa.choices == ("twist", "hit")
    obqa = T.openbookqa(
        {
            "question_stem": "Sun is",
            "choices": {"text": ["hot", "cold"], "label": ["A", "B"]},
            "answerKey": " A",
        }
    )
    assert obqa.contexts[0] == "Sun is" and obqa.gold == 0
    sciq = T.sciq(
        {
            "support": "  Water boils.",
            "question": "What boils?",
            "distractor1": "ice",
            "distractor2": "rock",
            "distractor3": "sand",
            "correct_answer": "water",
        }
    )
    assert sciq.contexts[0] == "Water boils.\nQuestion: What boils?\nAnswer:" and sciq.gold == 3
    boolq = T.boolq({"passage": "Sky is blue.", "question": "is the sky blue", "answer": True})
    assert boolq.contexts[0] == "Sky is blue.\nQuestion: is the sky blue?\nAnswer:"
    assert boolq.continuations == (" no", " yes") and boolq.gold == 1
    wg = T.winogrande(
        {
            "sentence": "Sarah beat Maria so _ won the prize.",
            "option1": "Sarah",
            "option2": "Maria",
            "answer": "1",
        }
    )
    assert wg.contexts == ("Sarah beat Maria so Sarah", "Sarah beat Maria so Maria")
    assert wg.continuations == (" won the prize.",) * 2 and wg.gold == 0
    mmlu = T.mmlu(
        {
            "question": " 2+2? ",
            "subject": "high_school_math",
            "choices": ["1", "2", "3", "4"],
            "answer": 3,
        }
    )
    assert mmlu.contexts[0] == (
        "The following are multiple choice questions (with answers) about high school math.\n\n"
        "2+2?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:"
    )
    assert mmlu.continuations == (" A", " B", " C", " D") and mmlu.gold == 3


def test_bad_rows_and_names():
    with pytest.raises(ValueError, match="row 0"):
        T.build_examples(T.TASKS["hellaswag"], [{"ctx": "x", "endings": ["a", "b"], "label": 0}])
    with pytest.raises(ValueError, match="valid tasks"):
        T.get_task("hellaswa")


def test_table_row_in_paper_format():
    results = {t: {t_.metric: 0.5} for t in T.TASKS for t_ in [T.TASKS[t]]}
    text = T.table(results, "mars")
    header, _, row = text.splitlines()
    assert header.startswith("| method | ARC-E | ARC-C | BoolQ | HellaSwag | OBQA | PIQA | WG |")
    assert row == "| mars | " + " | ".join(["50.00"] * 9) + " | 50.00 |"
    row = T.table({"hellaswag": {"acc": 0.2, "acc_norm": 0.3125}}, "x").splitlines()[2]
    assert row == "| x | – | – | – | 31.25 | – | – | – | – | – | – |"


def test_task_metadata_and_the_papers_average(monkeypatch):
    assert [T.TASKS[t].column for t in T.paper_average_tasks()] == [
        "ARC-E", "ARC-C", "BoolQ", "HellaSwag", "OBQA", "PIQA", "WG", "MMLU", "SciQ",
    ]  # fmt: skip
    assert {t for t, task in T.TASKS.items() if task.metric == "acc"} == {
        "boolq", "winogrande", "mmlu",
    }  # fmt: skip
    nine = {t: 0.5 for t in T.TASKS}
    assert T.paper_average(nine) == 0.5
    assert T.paper_average({**nine, "sciq": None}) is None
    # A tenth task outside the paper's average: a new column, the average of the nine stays.
    extra = T.Task("lambada", "LAMBADA", T.boolq, "acc", "test", "test", "x", False)
    monkeypatch.setitem(T.TASKS, "lambada", extra)
    assert T.paper_average(nine) == 0.5
    header, _, row = T.table({t: {"acc": 0.5, "acc_norm": 0.5} for t in nine}, "m").splitlines()
    assert header.endswith("| SciQ | LAMBADA | Avg |")
    assert row.endswith("| 50.00 | – | 50.00 |")


def _tiny_gpt(block_size=16):
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=block_size, n_layer=2, n_head=2, n_embd=16)).eval()


def test_batched_loglikelihood_equals_direct_computation():
    model = _tiny_gpt()
    reqs = [encode_pair("The cat sat on the", " mat"), encode_pair("Hi", " there friend")]
    reqs.append(encode_pair("A long context " * 6, " ends here."))  # truncated on the left
    batched = loglikelihoods(model, reqs, block_size=16, batch_size=3)
    single = loglikelihoods(model, reqs, block_size=16, batch_size=1)
    assert batched == pytest.approx(single, abs=1e-5)
    for (ctx, cont), got in zip(reqs, batched):
        seq = (ctx + cont)[-17:]
        logits = model(torch.tensor([seq[:-1]]))[0][0, :, :50257]
        logp = torch.log_softmax(logits, -1)
        want = sum(logp[len(seq) - 1 - len(cont) + i, t].item() for i, t in enumerate(cont))
        assert got == pytest.approx(want, abs=1e-5)


def test_examples_are_sharded_over_ranks():
    model = _tiny_gpt(block_size=128)
    examples = T.build_examples(T.TASKS["hellaswag"], fixture_rows())
    whole = evaluate_examples(model, examples, block_size=128)
    parts = [
        evaluate_examples(model, examples, block_size=128, rank=r, world_size=2) for r in (0, 1)
    ]
    assert [p["n"] for p in parts] == [2, 1]  # without a process group each rank sees its share
    for key in ("acc", "acc_norm"):
        assert sum(p[key] * p["n"] for p in parts) == pytest.approx(whole[key] * whole["n"])
