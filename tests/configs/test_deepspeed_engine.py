"""Real DeepSpeed engines on CPU: `accelerate launch` with 2 processes (gloo) on generated configs.

    .venv/bin/python tests/warm_ops.py   # once: builds the shm comm + cpu_adam ops
    .venv/bin/python -m pytest tests/configs/test_deepspeed_engine.py -q

Each run trains a tiny random Qwen2 for 3 optimizer steps (tests/scripts/tiny_train.py) and
reports what the engine really used; ~15 s per run warm. Runs are serial (2 cores).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, build_plan

from zerofit.configs.outputs import render_files
from zerofit.files import write_files

pytestmark = pytest.mark.distributed
SCRIPT = REPO / "tests" / "scripts" / "tiny_train.py"


def _launch(config: Path, port: int, cwd: Path, extra: list[str] = ()) -> dict:
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [
        str(accelerate),
        "launch",
        "--num_processes",
        "2",
        "--main_process_port",
        str(port),
        "--config_file",
        str(config),
        *extra,
        str(SCRIPT),
    ]
    env = dict(
        os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"
    )
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    marker = "ZEROFIT_TINY_TRAIN"
    line = next((text for text in proc.stdout.splitlines() if text.startswith(marker)), None)
    assert line, out[-4000:]
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _generated(tmp_path: Path, **answers) -> Path:
    plan = build_plan(hidden_size=64, gpus_per_node=2, micro_batch=2, grad_accum=2, **answers)
    files = render_files(plan, ds_config_file=str(tmp_path / "ds_config.json"))
    write_files(tmp_path, files, force=False)
    return tmp_path / "accelerate.yaml"


@pytest.mark.parametrize("stage,precision", [(1, "bf16"), (2, "fp32"), (3, "bf16")])
def test_generated_explicit_config_trains(tmp_path, free_port, stage, precision):
    config = _generated(tmp_path, stage=stage, precision=precision)
    # launched from another directory than the files': the YAML names its JSON absolutely
    got = _launch(config, free_port, REPO)
    assert got["world"] == "2" and got["stage"] == str(stage) and got["steps"] == "3"
    # explicit batch arithmetic reached the engine unchanged: 2 micro x 2 accum x 2 processes
    assert (got["train_batch_size"], got["micro"], got["accum"]) == ("8", "2", "2")
    assert got["dtype"] == ("torch.bfloat16" if precision == "bf16" else "torch.float32")


def test_cpu_optimizer_offload_uses_deepspeed_cpu_adam(tmp_path, free_port):
    config = _generated(tmp_path, stage=2, precision="bf16", offload_optimizer="cpu")
    got = _launch(config, free_port, tmp_path)
    assert got["stage"] == "2" and got["world"] == "2"
    # accelerate swapped the script's torch AdamW for DeepSpeedCPUAdam (its
    # zero_force_ds_cpu_optimizer default)
    assert got["optimizer"] == "DeepSpeedCPUAdam"


def test_shipped_auto_preset_trains_under_accelerate(free_port):
    # deepspeed_config_file in the preset is relative to the repository root: launch from there.
    got = _launch(REPO / "deepspeed_configs" / "accelerate" / "zero2.yaml", free_port, REPO)
    # "auto" filled by accelerate from the DataLoader (batch 2), accumulation 1, world 2
    assert (got["stage"], got["train_batch_size"], got["micro"], got["accum"]) == (
        "2",
        "4",
        "2",
        "1",
    )
