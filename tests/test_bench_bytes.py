"""bench.optim_fused's byte count: what the step moves as ``one_step`` runs it (issue 53)."""

from bench.optim_fused import passes


def test_bytes_count_the_clip_as_taken_and_exact_modes_reference_store():
    assert passes("mars-adamw", None) == 11  # norm pass (g, g_ref) + update (5 read, 4 written)
    assert passes("mars-adamw", "fold") == 12  # + the folded clip's norm pass: 48 bytes fp32
    assert passes("mars-adamw", "torch") == 14  # + clip_grad_norm_: read, read and write
    assert passes("adamw", "torch") == 10
    assert passes("mars-adamw-exact", "fold") == 10 + 2 + 1  # + the reference store
    assert passes("muon", "fold") is None  # Newton-Schulz: not a byte-bound step
