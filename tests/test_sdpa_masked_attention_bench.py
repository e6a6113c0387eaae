"""benchmarks/sdpa_masked_attention.py: its FLOP count is speed/flops.py's, its mask is what
transformers hands SDPA on a right-padded batch, and its sweep runs end to end on the CPU.

Run: .venv/bin/python -m pytest tests/test_sdpa_masked_attention_bench.py -q"""

from __future__ import annotations

import torch
from conftest import load_benchmark

from zerofit.models.resolve import resolve_model
from zerofit.speed.flops import forward_flops_per_sequence

BENCH = load_benchmark("sdpa_masked_attention")


def test_the_flops_are_the_speed_models():
    """One call's forward over the whole square and the causal half, for one sequence of every
    head of every layer, is what forward_flops_per_sequence counts as attention."""
    model = resolve_model("qwen2.5-0.5b")
    seq = 2048
    for causal in (False, True):
        per_layer = BENCH.attention_flops(1, model.num_heads, seq, model.head_dim, causal)
        terms = forward_flops_per_sequence(model, seq, None, None, causal)
        assert per_layer["forward"] * model.num_layers == terms["attention"]
        assert per_layer["backward"] == 2 * per_layer["forward"]


def test_the_mask_is_causal_with_right_padding():
    mask = BENCH.padded_causal_mask(2, 20, "cpu")
    assert mask.shape == (2, 1, 20, 20) and mask.dtype == torch.bool
    assert mask[0, 0, 5, :6].all() and not mask[0, 0, 5, 6:].any()
    assert not mask[0, 0, 19, 18:].any()  # the last tenth of the keys is padding
    assert mask[:, :, :, 0].all()  # no query row is empty


def test_the_sweep_runs_on_the_cpu():
    row = BENCH.measure("cpu", seq=64, head_dim=16, heads=2, tokens=128, repeats=1)
    assert row["batch"] == 2 and set(row["variants"]) == set(BENCH.VARIANTS)
    assert all(variant["total_s"] > 0 for variant in row["variants"].values())
    assert row["masked_over_flash"]["total"] > 0
    assert row["dispatched"]["masked"] in ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
    assert "| 16 | 64 | 2 |" in BENCH.render_table([row])
