"""recipes/grpo.py under real `accelerate launch` with 2 CPU processes and configs written by
`zerofit config`.

- ZeRO-2: a local model directory + local JSONL data, KL to a reference, rollout reused twice;
  the final HF-format model loads with `from_pretrained` in a separate process and differs from
  the initial weights.
- DDP: the toy task with the embedded tiny model and format reward only; final model reloads.
- ZeRO-3: a run SIGKILLed after a checkpoint resumes with `--resume-from latest`, ends at the
  same step with every step logged once, and replays the lost steps identically (same data
  order and RNG).

Run: .venv/bin/python -m pytest tests/recipes/test_grpo_run.py -q   (serial; ~60-90 s warm)
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from recipe_runs import load_recipe, reload_final_model, save_tiny_model

from zerofit.cli.main import main as zerofit_main

pytestmark = pytest.mark.distributed
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "grpo.py"
BIN = Path(sys.executable).parent
RUN_LIMIT = 300  # s: generous bound for a ~20 s warm run on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A saved tiny model dir, the toy task as JSONL, and DDP/ZeRO-2/ZeRO-3 configs from
    `zerofit config`."""
    root = tmp_path_factory.mktemp("grpo")
    save_tiny_model(root / "model")
    rows = load_recipe("grpo").toy_rows()
    (root / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for stage in (0, 2, 3):  # stage 0: plain DDP (accelerate MULTI_GPU config, gloo on CPU)
        argv = [
            "config",
            "--model",
            str(root / "model"),
            "--gpu",
            "L4",
            "--gpus-per-node",
            "2",
            "--workload",
            "grpo",
            "--stage",
            str(stage),
            "--global-batch",
            "32",
            "--num-generations",
            "8",
            "--seq-len",
            "16",
            "--completion-len",
            "8",
            "--precision",
            "bf16",
            "--flavour",
            "explicit",
            "--out",
            str(root / f"zero{stage}"),
        ]
        assert zerofit_main(argv) == 0
    return {"root": root, "model": root / "model", "data": root / "toy.jsonl"}


def launch(config: Path, out: Path, *flags: str, popen: bool = False):
    cmd = [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(free_port()),
        str(RECIPE),
        "--output-dir",
        str(out),
        *flags,
    ]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if popen:  # output to a file: an unread pipe fills up (tqdm) and blocks the run
        log = open(out.parent / "killed-run.log", "w")
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )  # own process group: SIGKILL reaches every rank
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_LIMIT, env=env)


def test_zero2_local_model_and_data_saves_loadable_model(tiny, tmp_path):
    out = tmp_path / "run"
    res = launch(
        tiny["root"] / "zero2" / "accelerate.yaml",
        out,
        "--model",
        str(tiny["model"]),
        "--dataset",
        str(tiny["data"]),
        "--max-steps",
        "4",
        "--save-every",
        "2",
        "--beta",
        "0.04",
        "--num-iterations",
        "2",
        "--loss-type",
        "dapo",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (
        "2 process(es), ZeRO stage 2, 4 prompts x 8 generations per step" in res.stdout + res.stderr
    )
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert math.isfinite(r["loss"]) and 0.0 <= r["reward"] <= 2.0 and r["tokens"] > 0
        assert set(r) >= {"reward/accuracy", "reward/format", "kl", "clip_frac", "tok_s"}
    assert rows[-1]["kl"] > 0  # the policy moved away from the frozen reference
    assert (out / "latest").read_text().strip() == "checkpoint-4"
    assert (
        json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["prompts_seen"] == 8
    )
    assert not list(out.glob(".tmp-*"))
    # reload in a separate process (reloading on rank 0 inside the run hangs the other rank)
    assert reload_final_model(out / "final", tiny["model"]) > 1e-3  # trained weights
    assert json.loads((out / "final" / "config.json").read_text())["num_hidden_layers"] == 2


def test_ddp_embedded_task_saves_loadable_model(tiny, tmp_path):
    out = tmp_path / "run"
    res = launch(
        tiny["root"] / "zero0" / "accelerate.yaml",
        out,
        "--max-steps",
        "3",
        "--save-every",
        "0",
        "--rewards",
        "format",
        "--reward-weights",
        "1",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (
        "grpo: 2 process(es), ZeRO stage off, 4 prompts x 8 generations per step"
        in res.stdout + res.stderr
    )
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and set(r) >= {"reward/format", "tok_s"} for r in rows)
    assert "reward/accuracy" not in rows[0]
    check = (
        f"from transformers import AutoModelForCausalLM as M\n"
        f"m = M.from_pretrained({str(out / 'final')!r})\n"
        "assert all(p.isfinite().all() for p in m.parameters()); print('OK')"
    )
    shown = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0 and "OK" in shown.stdout, shown.stderr[-2000:]


def test_zero3_sigkill_then_resume_latest(tiny, tmp_path):
    out = tmp_path / "run"
    config = tiny["root"] / "zero3" / "accelerate.yaml"
    flags = ("--max-steps", "14", "--save-every", "3", "--beta", "0.04")
    proc = launch(config, out, *flags, popen=True)
    deadline = time.time() + RUN_LIMIT
    try:  # kill once a checkpoint exists and at least one later step has been logged
        while time.time() < deadline and proc.poll() is None:
            latest = out / "latest"
            if latest.exists() and read_metrics(out):
                done = int(latest.read_text().strip().split("-")[1])
                if read_metrics(out)[-1]["step"] > done:
                    break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "final").exists()
    before = {r["step"]: r for r in read_metrics(out)}
    resumed_from = int((out / "latest").read_text().strip().split("-")[1])
    assert resumed_from >= 3 and max(before) > resumed_from

    res = launch(config, out, *flags, "--resume-from", "latest")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 15))  # every step once: none lost or doubled
    assert all(math.isfinite(r["loss"]) and "reward/format" in r for r in rows)
    assert all((out / f"checkpoint-{s}" / "trainer_state.json").exists() for s in (3, 6, 9, 12, 14))
    assert (out / "latest").read_text().strip() == "checkpoint-14"
    assert (out / "final" / "config.json").exists()
    replayed = [s for s in before if s > resumed_from]
    for r in rows:  # steps lost in the crash replay identically: same prompts, samples, weights
        if r["step"] in replayed:
            old = before[r["step"]]
            assert (r["reward"], r["tokens"]) == (old["reward"], old["tokens"]), r["step"]
            assert r["loss"] == pytest.approx(old["loss"], abs=1e-6)
            assert r["kl"] == pytest.approx(old["kl"], abs=1e-6)
