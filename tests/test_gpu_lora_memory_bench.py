"""benchmarks/gpu_lora_memory.py and its H200 results (tests/data/gpu_lora_memory_h200.jsonl):
the stored estimates are what zerofit predicts today, and the script's cases run end to end on
the CPU through the real peft / bitsandbytes / transformers code (tiny shape, fp32).

Run: .venv/bin/python -m pytest tests/test_gpu_lora_memory_bench.py -q"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "data" / "gpu_lora_memory_h200.jsonl"

BENCH = load_benchmark("gpu_lora_memory")


def test_the_stored_estimates_are_todays(tmp_path, capsys):
    """Re-annotating the measured file gives the estimates it stores: a change to the LoRA model
    shows up here, and the file and docs/accuracy.md must then be re-annotated together."""
    copy = tmp_path / "results.jsonl"
    shutil.copy(RESULTS, copy)
    BENCH.annotate(copy)
    stored = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    fresh = [json.loads(line) for line in copy.read_text().splitlines()]
    assert len(stored) == len(BENCH.build_cases(tiny=False)) == 10
    for old, new in zip(stored, fresh, strict=True):
        assert old["gpu"] == "NVIDIA H200" and old["max_allocated"] > 0
        assert (new["est_allocated"], new["est_reserved"]) == (
            old["est_allocated"],
            old["est_reserved"],
        )
    capsys.readouterr()


def test_the_cases_run_on_the_cpu(tmp_path):
    """The case that touches the most code (QLoRA through bitsandbytes' CPU 4-bit path,
    prepare_model_for_kbit_training, checkpointing) on the tiny shape: the model loads, adapters
    train, and zerofit's estimate lands beside the row."""
    folder = tmp_path / "model"
    BENCH.save_random_model(BENCH.TINY, folder)
    case = BENCH.build_cases(tiny=True)[-1]
    assert case["finetuning"] == "qlora" and case["prepare_kbit"] and case["checkpointing"]
    row = BENCH.measure_case(folder, case, BENCH.TINY, "cpu")
    row = BENCH.with_estimate(row, BENCH.TINY, bf16=False)
    assert row["trainable_params"] > 0 and row["est_allocated"] > 0, row
