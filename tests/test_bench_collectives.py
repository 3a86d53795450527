"""bench.collectives: GPT-2 small's Newton-Schulz collectives and FLOPs a step on 8 ranks, from
the assignment (issue 53: the count and bytes of collectives per step, recorded and asserted)."""

import json
import sys

from bench import collectives


def test_gpt2_small_on_8_ranks():
    f = collectives.figures(collectives.matrices("gpt2-small", False), 8, itemsize=2)
    assert f["ns_gflop_max"] <= 1.3 * f["ns_gflop_mean"]
    merged = f["ddp_merged"]  # (768, 2304) x12, (768, 768) x12, (768, 3072) x24: 2, 2, 3 slots
    assert merged["all_gathers"] == 3 and f["ddp_per_shape"]["all_gathers"] == 4
    slots = 2 * 768 * 2304 + 2 * 768 * 768 + 3 * 768 * 3072  # the fullest rank's (padded before)
    assert round(merged["sent_mb"] * 1e6) == slots * 2
    assert round(merged["padded_received_mb"] * 1e6) == 8 * slots * 2
    results = 12 * 768 * 2304 + 12 * 768 * 768 + 24 * 768 * 3072  # every result once
    assert round(merged["results_mb"] * 1e6) == results * 2
    # one a rank gathered of each batch, the 4 + 4 of attention's batches beyond broadcast
    assert merged["broadcasts"] == 8 and merged["received_mb"] < merged["results_mb"]
    fsdp = f["fsdp"]  # 4 shapes, there and back; each rank's row block (rows / 8) of each matrix
    assert fsdp["all_to_alls"] == 8
    blocks = 288 * 768 + 96 * 768 + 384 * 768 + 96 * 3072  # c_attn, attn c_proj, c_fc, mlp c_proj
    assert round(fsdp["there_mb"] * 1e6) == 12 * 2 * blocks


def test_the_record_keeps_every_world_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["collectives", "--world", "2", "8", "--out", str(tmp_path)])
    collectives.main()
    assert capsys.readouterr().out.startswith("device: cpu")
    rec = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert set(rec["per_world"]) == {"2", "8"} and rec["unit"] == "count" and rec["commit"]
