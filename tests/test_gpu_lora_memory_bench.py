"""benchmarks/gpu_lora_memory.py and its GPU results (tests/data/gpu_lora_memory_h200.jsonl, the
plain stack; tests/data/gpu_lora_memory_h100_stacks.jsonl, autocast and DeepSpeed): the stored
estimates are what zerofit predicts today, and the script's cases run end to end on the CPU
through the real peft / bitsandbytes / transformers / DeepSpeed code (tiny shape).

Run: .venv/bin/python -m pytest tests/test_gpu_lora_memory_bench.py -q"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import find_free_port, load_benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "data" / "gpu_lora_memory_h200.jsonl"
STACK_RESULTS = ROOT / "tests" / "data" / "gpu_lora_memory_h100_stacks.jsonl"

BENCH = load_benchmark("gpu_lora_memory")


def stored_and_annotated_again(results, tmp_path) -> tuple[list[dict], list[dict]]:
    """The rows of a measured results file as stored, and as ``--annotate`` writes them today
    (on a copy)."""
    copy = tmp_path / results.name
    shutil.copy(results, copy)
    BENCH.annotate(copy)
    stored = [json.loads(line) for line in results.read_text().splitlines()]
    return stored, [json.loads(line) for line in copy.read_text().splitlines()]


def test_the_stored_estimates_are_todays(tmp_path, capsys):
    """Re-annotating the measured file gives the estimates it stores: a change to the LoRA model
    shows up here, and the file and docs/accuracy.md must then be re-annotated together."""
    stored, fresh = stored_and_annotated_again(RESULTS, tmp_path)
    assert len(stored) == len(BENCH.build_cases(tiny=False)) == 10
    for old, new in zip(stored, fresh, strict=True):
        assert old["gpu"] == "NVIDIA H200" and old["max_allocated"] > 0
        assert (new["est_allocated"], new["est_reserved"]) == (
            old["est_allocated"],
            old["est_reserved"],
        )
        # the estimate's own cuBLAS term for a Hopper GPU, inside est_allocated
        assert new["est_cublas"] == old["est_cublas"] == 69_206_016
    capsys.readouterr()


def test_the_stored_stack_estimates_are_todays(tmp_path, capsys):
    """The autocast and DeepSpeed rows measured on an H100 (docs/accuracy.md's second LoRA GPU
    table) carry the estimates zerofit gives today for their TrainSetup; ZeRO-3's last three
    QLoRA cases ran in a later call, one process each."""
    stored, fresh = stored_and_annotated_again(STACK_RESULTS, tmp_path)
    stacks = [(row["stack"], row["stage"]) for row in stored]
    assert (stacks.count(("deepspeed", 2)), stacks.count(("deepspeed", 3))) == (8, 8)
    assert stacks.count(("autocast", 0)) == 8
    for old, new in zip(stored, fresh, strict=True):
        assert old["gpu"] == "NVIDIA H100 80GB HBM3" and old["max_allocated"] > 0
        assert (new["est_allocated"], new["est_reserved"]) == (
            old["est_allocated"],
            old["est_reserved"],
        )
        assert new["est_cublas"] == old["est_cublas"] == 69_206_016
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


def test_the_deepspeed_buckets_are_zerofits():
    """The script writes its DeepSpeed JSON without zerofit (a bare GPU machine); its buckets
    must be the ones zerofit writes, which its estimate counts."""
    from zerofit.memory.ds_defaults import ds_bucket_sizes

    hidden = BENCH.QWEN25_05B["hidden_size"]
    for stage in (2, 3):
        assert BENCH.bucket_sizes(hidden, stage) == ds_bucket_sizes(hidden, stage)


def test_the_autocast_stack_runs_on_the_cpu(tmp_path):
    """QLoRA under bf16 autocast with TRL's cast of the adapters to bf16, checkpointed."""
    folder = tmp_path / "model"
    BENCH.save_random_model(BENCH.TINY, folder)
    case = next(
        case
        for case in BENCH.build_cases(tiny=True, stack="autocast")
        if case["finetuning"] == "qlora" and case["checkpointing"]
    )
    row = BENCH.measure_case(folder, case, BENCH.TINY, "cpu")
    row = BENCH.with_estimate(row, BENCH.TINY, bf16=False)
    assert row["trainable_params"] > 0 and row["est_allocated"] > 0, row


def test_a_deepspeed_zero3_case_runs_on_the_cpu(tmp_path):
    """A real DeepSpeed engine (ZeRO-3, gloo, one process) trains the adapters of the tiny
    shape, and the row carries the buckets it ran and zerofit's stage-3 estimate."""
    out = tmp_path / "ds.jsonl"
    script = ROOT / "benchmarks" / "gpu_lora_memory.py"
    env = dict(os.environ, MASTER_PORT=str(find_free_port()), PYTHONPATH=str(ROOT / "src"))
    command = [sys.executable, str(script), "--device", "cpu", "--tiny", "--stack", "deepspeed"]
    command += ["--stages", "3", "--first", "1", "--out", str(out)]
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=300)
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["stack"] == "deepspeed" and row["stage"] == 3 and "error" not in row, row
    assert row["buckets"] == BENCH.bucket_sizes(BENCH.TINY["hidden_size"], 3)
    assert row["trainable_params"] > 0 and row["est_allocated"] > 0, row


def test_cases_picks_positions_and_refuses_a_bad_list(tmp_path):
    """``--cases`` keeps only the listed positions of each stack's cases (what a device call runs
    one process per case with); a list that is not numbers is refused in one line."""
    script = ROOT / "benchmarks" / "gpu_lora_memory.py"
    bad = subprocess.run(
        [sys.executable, str(script), "--cases", "five"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--cases: 'five' is not a comma list" in bad.stderr
    assert "Traceback" not in bad.stderr
    args = type("Args", (), {"stacks": ["deepspeed"], "tiny": True, "stage_list": (3,)})()
    args.first, args.cases = None, {5, 6, 7}
    picked = BENCH.all_cases(args, BENCH.TINY)
    assert [(c["finetuning"], c["checkpointing"], c["seq"]) for c in picked] == [
        ("qlora", True, 128),
        ("qlora", False, 64),
        ("qlora", False, 128),
    ]
