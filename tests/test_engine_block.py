"""The engine's block size (optim/engine/launch.py): an option, checked; its warps; and the
default kept at 2 CTAs per SM or more on sm_90 for MARS-AdamW's update (bench/occupancy.py:
compiled for sm_90 on this CPU where Triton can, else read from the committed record)."""

import json
from pathlib import Path

import pytest

from bench import occupancy
from optim.engine import launch, loader

RECORD = Path(__file__).resolve().parent.parent / "bench" / "records" / "occupancy-sm90.json"


@pytest.mark.parametrize(("registers", "warps", "ctas"), [
    (156, 8, 1),  # 156 x 32 = 4,992 -> 5,120 a warp; 65,536 / 5,120 = 12 warps: one CTA of 8
    (80, 8, 3),  # 2,560 a warp: 25 warps, 3 CTAs of 8
    (72, 4, 7),  # 2,304: 28 warps, 7 CTAs of 4
    (128, 4, 4),  # 4,096: 16 warps
    (32, 4, 16),  # 1,024: 64 warps, the SM's most (16 CTAs of 4)
    (16, 1, 32),  # the most CTAs an SM holds
])  # fmt: skip
def test_ctas_per_sm_from_registers(registers, warps, ctas):
    assert occupancy.ctas_per_sm(registers, warps) == ctas


def test_shared_memory_limits_ctas():
    assert occupancy.ctas_per_sm(32, 4, shared=100 * 1024) == 2  # 228 KiB / 100 KiB


def test_block_option_is_checked_and_set(monkeypatch):
    monkeypatch.setitem(launch.BLOCKS, "cuda", launch.BLOCKS["cuda"])
    launch.set_block(1024)
    assert launch.BLOCKS["cuda"] == 1024
    launch.set_block("4096")
    assert launch.BLOCKS["cuda"] == 4096
    for bad in (3000, "big", 0):
        with pytest.raises(ValueError, match="one of 256, 512"):
            launch.set_block(bad)
    assert [loader.warps(b) for b in (1024, 2048, 4096)] == [4, 8, 8]


def test_the_default_block_keeps_two_ctas_per_sm():
    block, warps = launch.DEFAULT_BLOCK, loader.warps(launch.DEFAULT_BLOCK)
    rec = json.loads(RECORD.read_text())
    rows = {(c["variant"], c["block"], c["warps"]): c for c in rec["candidates"]}
    assert rows[("mars-adamw", block, warps)]["ctas_per_sm"] >= 2
    assert {(b, w) for _, b, w in rows} >= {(4096, 8), (2048, 8), (1024, 4)}
    assert all(c["ctas_per_sm"] == occupancy.ctas_per_sm(c["registers"], c["warps"],
                                                         c["shared_bytes"])
               for c in rec["candidates"])  # fmt: skip


def test_the_default_block_compiled_for_sm90_here_keeps_two_ctas_per_sm():
    pytest.importorskip("triton")
    block, warps = launch.DEFAULT_BLOCK, loader.warps(launch.DEFAULT_BLOCK)
    try:
        got = occupancy.compile_sm90(occupancy.variants()["mars-adamw"], block, warps)
    except Exception as e:  # noqa: BLE001 (no ptxas/cuobjdump or another Triton: the record's)
        pytest.skip(f"no sm_90 compile here ({type(e).__name__}: {str(e)[:80]})")
    assert got["ctas_per_sm"] >= 2, got
