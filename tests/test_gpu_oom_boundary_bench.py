"""benchmarks/gpu_oom_boundary.py waits for a lent GPU: these tests keep it ready. The grid must be
held out from the calibration points and runnable on an 80 GB H100, each capped run must sit on
the side of zerofit's verdict it claims, the summary must count what the runs say, and one run
must really train with the installed DeepSpeed and transformers (on CPU, without a cap)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from conftest import calibration_points, find_free_port, load_benchmark
from memory_shapes import TINY_DECODER

from zerofit.hardware import lookup
from zerofit.memory import overheads as oh
from zerofit.memory.optimizers import HF_TRAINER_DEFAULT_OPTIM

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3


BENCH = load_benchmark("gpu_oom_boundary")


def _calibration_keys() -> set[tuple]:
    points = calibration_points()
    return {(p["shape"], p["stage"], p["offload"], p["seq"], p["mbs"], p["gc"]) for p in points}


def test_the_grid_is_held_out_from_the_calibration_points():
    calibrated = _calibration_keys()
    assert calibrated  # the comparison below means nothing against an empty file
    for config in BENCH.GRID:
        key = (config.shape, config.stage, config.offload, config.seq, config.mbs, config.gc)
        assert key not in calibrated, config.name
    assert {c.shape for c in BENCH.GRID} - {key[0] for key in calibrated}  # new shapes too


def test_the_grid_covers_peaks_stages_offload_and_both_clients():
    phases = {BENCH.estimate_config(config).phase for config in BENCH.GRID}
    assert {"forward", "step"} <= phases
    assert {c.offload for c in BENCH.GRID} == {"none", "cpu"}
    assert {c.stage for c in BENCH.GRID} == {0, 1, 2, 3}
    assert {c.client for c in BENCH.GRID} == {"deepspeed", "trainer"}
    # the Trainer runs are estimated as the Trainer runs them: its default optimizer, bf16 weights
    trainer = next(c for c in BENCH.GRID if c.client == "trainer")
    assert BENCH.estimate_config(trainer).optimizer == HF_TRAINER_DEFAULT_OPTIM


def test_capped_runs_sit_on_the_side_of_the_verdict_they_test_and_fit_an_h100():
    h100 = lookup("H100-SXM").memory_gib * GIB
    for config in BENCH.GRID:
        estimate = BENCH.estimate_config(config)
        need = BENCH.allocator_need_bytes(estimate)
        runs = {run["kind"]: run for run in BENCH.planned_runs(config, gap=0.03)}
        assert runs["uncapped"]["cap_bytes"] is None
        assert runs["fits"]["cap_bytes"] > need > estimate.peak_bytes > runs["oom"]["cap_bytes"]
        # every run, capped or not, leaves the device its CUDA context: none is an OOM by design
        assert need * 1.03 + oh.CUDA_CONTEXT_BYTES < h100, config.name


def test_judge_and_summary_count_what_the_runs_report():
    runs = BENCH.planned_runs(BENCH.GRID[0], gap=0.03)
    predicted = runs[0]["predicted_peak_gib"]
    results = [
        {"outcome": "ran", "peak_alloc_gib": predicted / 1.01},  # zerofit 1 % over
        {"outcome": "ran"},  # the capped run zerofit said fits: right
        {"outcome": "ran"},  # the capped run zerofit said cannot fit ran after all: wrong
    ]
    lines = [BENCH.judge(run, result) for run, result in zip(runs, results, strict=True)]
    assert lines[0]["peak_error"] == pytest.approx(0.01, abs=1e-4)
    assert lines[1]["verdict_right"] and not lines[2]["verdict_right"]
    extra = BENCH.judge(runs[2], {"outcome": "oom", "phase": "forward"})
    timed_out = BENCH.judge(runs[1], {"outcome": "timeout"})
    summary = BENCH.summarize(lines + [extra, timed_out])
    assert summary["points"] == 1 and summary["most_under"] == pytest.approx(0.01, abs=1e-4)
    assert summary["fits"] == {"right": 1, "judged": 1}  # the timeout is not judged
    assert summary["oom"] == {"right": 1, "judged": 2}
    assert len(summary["not_judged"]) == 1 and summary["not_judged"][0].endswith("fits: timeout")
    text = BENCH.render_summary(summary)
    assert "ran 1/1" in text and "OOM 1/2" in text and "max |error| 1.0%" in text
    assert "not judged: " in text


def test_configs_outside_the_grid_are_refused_with_the_range(capsys):
    with pytest.raises(SystemExit) as exit_info:
        BENCH.main(["--dry-run", "--configs", "99"])
    assert exit_info.value.code == 2
    assert f"from 0 to {len(BENCH.GRID) - 1}" in capsys.readouterr().err


@pytest.mark.distributed
@pytest.mark.parametrize("client,stage,offload", [("deepspeed", 3, "cpu"), ("trainer", 0, "none")])
def test_one_run_trains_with_the_installed_libraries_on_cpu(client, stage, offload):
    """The child process of a run, on CPU: ZeRO-3 with the optimizer offloaded (DeepSpeed's
    cpu_adam, warmed by tests/warm_ops.py) on the calibration JSON, and the transformers Trainer
    with its defaults; gradient checkpointing in both."""
    config = {"shape": "qwen2.5-0.5b", "stage": stage, "offload": offload, "seq": 32, "mbs": 2}
    run = {
        "kind": "uncapped",
        "cap_bytes": None,
        "config": {**config, "gc": True, "client": client},
        "device": "cpu",
        "model": {"model_type": "qwen2", **TINY_DECODER},
    }
    env = dict(
        os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", MASTER_PORT=str(find_free_port())
    )
    result = BENCH.launch_run(run, timeout_s=240, env=env)
    assert result["outcome"] == "ran", result.get("log")
    assert len(result["step_s"]) == BENCH.STEPS and math.isfinite(result["loss"])
