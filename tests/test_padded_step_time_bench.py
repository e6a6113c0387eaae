"""benchmarks/padded_step_time.py: its padded batch is what a padding collator gives, its step
runs end to end on the CPU through transformers' SDPA path, and ``--annotate`` puts zerofit's
ratio beside a measured row.

Run: .venv/bin/python -m pytest tests/test_padded_step_time_bench.py -q"""

from __future__ import annotations

import argparse
import json

from conftest import load_benchmark

BENCH = load_benchmark("padded_step_time")


def test_padded_rows_end_in_masked_padding():
    batch = BENCH.build_batch(vocab=100, seq=40, padded=True, device="cpu")
    mask = batch["attention_mask"]
    assert mask.shape == (BENCH.MICRO_BATCH, 40)
    assert mask[0].tolist() == [1] * 36 + [0] * 4  # 10 % padding at the row's end
    assert 0 < (mask[1] == 0).sum() < 4
    assert (batch["labels"][mask == 0] == -100).all()
    assert "attention_mask" not in BENCH.build_batch(100, 40, padded=False, device="cpu")


def test_the_step_runs_on_the_cpu():
    args = argparse.Namespace(device="cpu", tiny=True, seq=[32], warmup=1, steps=1)
    (row,) = BENCH.measure(args)
    assert row["unpadded_s"] > 0 and row["padded_s"] > 0 and row["shape"] == "tiny"


def test_annotate_adds_zerofits_ratio(tmp_path):
    """A padded SDPA step costs more than an unpadded one in zerofit's model on an H200."""
    path = tmp_path / "rows.jsonl"
    row = {"device": "NVIDIA H200", "micro_batch": 2, "seq": 4096, "measured_ratio": 1.25}
    path.write_text(json.dumps(row) + "\n")
    BENCH.annotate(path)
    (annotated,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert annotated["predicted_padded_s"] > annotated["predicted_unpadded_s"]
    assert annotated["predicted_ratio"] > 1
