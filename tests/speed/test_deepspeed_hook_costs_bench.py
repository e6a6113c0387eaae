"""benchmarks/deepspeed_hook_costs.py's smallest run: real DeepSpeed engines (one gloo rank, CPU)
at ZeRO-0 and ZeRO-3 on tiny Linear stacks. ZeRO-3 hooks every module
(runtime/zero/parameter_offload.py ``DeepSpeedZeRoOffload._register_deepspeed_module``), so at
the same trainable tensors three times the modules cost more, and its fitted per-module cost is
positive; ZeRO-0 has no such hooks and runs each shape faster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, find_free_port

pytestmark = pytest.mark.exclusive  # compares wall times of engines


def run_hook_costs(*arguments: str, timeout: float) -> str:
    """benchmarks/deepspeed_hook_costs.py's stdout (one gloo rank on a free local port)."""
    env = dict(os.environ, MASTER_PORT=str(find_free_port()), MASTER_ADDR="127.0.0.1")
    script = REPO / "benchmarks" / "deepspeed_hook_costs.py"
    done = subprocess.run(
        [sys.executable, str(script), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_zero3_host_cost_grows_with_modules_at_the_same_tensors():
    stdout = run_hook_costs("--quick", "--repeats", "5", timeout=120)
    results = json.loads(stdout.strip().splitlines()[-1])
    plain, zero3 = results["0"], results["3"]
    few, many = zero3["rows"][0], zero3["rows"][1]
    assert few[0] == many[0] and many[1] >= 3 * few[1]  # same tensors, 3x the modules
    assert many[2] > few[2]
    assert zero3["per_module_s"] > 0
    for plain_row, zero3_row in zip(plain["rows"], zero3["rows"], strict=True):
        assert zero3_row[2] > plain_row[2]


def test_calibration_loop_times_each_phase_and_zero1_steps_only_at_the_boundary():
    """``--calibration-loop`` on CPU: the calibration runs' loop (their DeepSpeed JSON, a client
    AdamW) on a tiny Qwen2, phase by phase. Under accumulation DeepSpeed's ``engine.step`` does
    nothing before the boundary micro step (runtime/engine.py ``step``:
    ``is_gradient_accumulation_boundary``), the structure step_time.py's ZeRO-1 hooks follow."""
    stdout = run_hook_costs("--calibration-loop", "--repeats", "2", timeout=180)
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert [row["case"]["stage"] for row in results] == [None, 1, 3]
    for row in results:
        for phase in ("forward", "backward", "step"):
            assert row[phase] >= row[f"{phase}_host"] >= 0
    accumulated = results[1]
    assert accumulated["case"]["grad_accum"] == 4
    assert accumulated["step_first"] < accumulated["step_boundary"]


def test_zero3_one_gpu_dry_run_times_both_stages_and_annotate_adds_predictions(tmp_path):
    """``--zero3-one-gpu --dry-run``: the one-GPU ZeRO-2 / ZeRO-3 loop (Qwen's DeepSpeed JSON,
    accumulation, reentrant checkpointing) on a tiny Qwen2 on CPU, one JSON line per case;
    ``--annotate`` then adds zerofit's prediction and, for ZeRO-3, the per-module-pass costs
    the measurement implies beside the model's constant."""
    out = tmp_path / "zero3.jsonl"
    run_hook_costs("--zero3-one-gpu", "--dry-run", "--out", str(out), timeout=280)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(row["stage"], row["seq_len"]) for row in rows] == [(2, 16), (2, 32), (3, 16), (3, 32)]
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["step_s"][0] >= row["host_s"][0] > 0
    run_hook_costs("--annotate", str(out), timeout=120)
    annotated = [json.loads(line) for line in out.read_text().splitlines()]
    from zerofit.speed.step_time import STAGE3_FETCH_S_PER_MODULE

    for row in annotated:
        assert row["est_step_s"] > 0 and "err_step_s_pct" in row
        if row["stage"] == 3:
            assert row["model_s_per_module_pass"] == STAGE3_FETCH_S_PER_MODULE
            assert "gap_s_per_module_pass" in row and "fit_s_per_module_pass" in row
