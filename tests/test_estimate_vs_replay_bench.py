"""benchmarks/estimate_vs_replay.py: one tiny case runs end to end (zerofit's estimate, and the
run replayed on fake tensors through transformers / peft / torch.optim and the caching
allocator) and gives a row in the sweep's format; the sweep's setups are all replayable.

Run: .venv/bin/python -m pytest tests/test_estimate_vs_replay_bench.py -q"""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark
from memory_shapes import TINY_REPLAY_LLAMA

from zerofit.memory.allocation_trace import replay_support
from zerofit.models.builtin import BUILTIN_CONFIGS
from zerofit.models.resolve import resolve_model, spec_from_config

# fake-tensor recordings of whole runs: run_suite.py runs them beside the launches
pytestmark = pytest.mark.replay

BENCH = load_benchmark("estimate_vs_replay")

TINY_CONFIG = TINY_REPLAY_LLAMA
ROW_KEYS = {
    "model",
    "case",
    "setup",
    "fields",
    "estimate_gib",
    "estimate_phase",
    "estimate_bytes",
    "estimate_reserved_bytes",
    "seconds",
    "replay_allocated_bytes",
    "replay_reserved_bytes",
    "replay_allocated_gib",
    "replay_reserved_gib",
    "allocated_error_pct",
    "reserved_error_pct",
    "flagged",
}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The replay records into an empty cache (cache.py reads XDG_CACHE_HOME)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def test_a_tiny_lora_case_gives_a_row():
    """The tiny Llama's LoRA case under the HF Trainer is replayed and compared: the row has
    every field, its errors are the estimate against the replay's peaks, and the console line
    and the JSON carry it."""
    model = spec_from_config(TINY_CONFIG, "tiny-llama")
    sweep_case = BENCH.case("lora hf", BENCH.LORA, BENCH.HF, dict(micro_batch=2, seq_len=256))
    row = BENCH.run_case(model, "tiny-llama", sweep_case)
    assert set(row) == ROW_KEYS
    assert row["setup"] == (
        "lora r16 all-linear d0.05 hf autocast adamw_torch_fused no-ckpt 2x256 sdpa"
    )
    expected = 100 * (row["estimate_bytes"] / row["replay_allocated_bytes"] - 1)
    assert row["allocated_error_pct"] == pytest.approx(expected, abs=0.01)
    reserved = 100 * (row["estimate_reserved_bytes"] / row["replay_reserved_bytes"] - 1)
    assert row["reserved_error_pct"] == pytest.approx(reserved, abs=0.01)
    assert row["flagged"] == (abs(row["allocated_error_pct"]) > BENCH.FLAG_PERCENT)
    # the H100's cuBLAS workspaces alone are 32 MiB on each of two handles (forward, backward)
    assert row["replay_allocated_bytes"] > 2 * 2**25
    line = BENCH.format_row(row)
    assert line.split()[:2] == (["!", "tiny-llama"] if row["flagged"] else ["tiny-llama", "lora"])
    assert f"{row['allocated_error_pct']:+.2f}%" in line
    assert json.loads(json.dumps(BENCH.sorted_rows([row]))) == [row]


def test_every_sweep_setup_is_replayable():
    """No setup of the sweep is one the replay refuses (padded rows, QLoRA, DeepSpeed), so a
    skipped row can only mean a model the replay cannot run."""
    model = resolve_model("qwen2.5-0.5b")
    cases = BENCH.sweep_cases() + BENCH.eager_cases()
    assert len({sweep_case.name for sweep_case in cases}) == len(cases)
    for sweep_case in cases:
        assert replay_support(model, BENCH.base_setup(**sweep_case.fields)) is None
    assert set(BENCH.QUICK_MODELS) <= set(BUILTIN_CONFIGS)


def test_an_moe_lora_with_dropout_is_skipped_for_peft_s_refusal():
    """peft refuses dropout on an MoE's fused experts (all-linear reaches them), so such a
    row names that refusal rather than a vague failure; without dropout nothing is named."""
    model = resolve_model("qwen3-30b-a3b")
    with_dropout = BENCH.base_setup(**BENCH.LORA, **BENCH.HF)
    assert "lora_dropout" in BENCH.unrecorded_reason(model, with_dropout)
    no_dropout = BENCH.base_setup(**{**BENCH.LORA, "lora_dropout": 0.0}, **BENCH.HF)
    assert BENCH.unrecorded_reason(model, no_dropout) == (
        "the replay could not record this model's run"
    )
