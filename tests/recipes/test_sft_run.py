"""recipes/sft.py under real `accelerate launch`, 2 CPU processes, configs from `zerofit config`.

- ZeRO-2: chat-template (`messages`) rows with packing; checkpoints rotate (--save-total-limit).
- ZeRO-3: prompt/completion rows; the DeepSpeed JSON's micro batch wins over the flag, said once.
- DDP: SIGKILL after a checkpoint, `--resume-from latest`, every step logged once, lost steps
  replayed identically; the ranks die with the launcher they outlived before.
- ZeRO-2, a non-empty --output-dir: refused with one line before any rank starts DeepSpeed.
Each run's final model loads with from_pretrained in a separate process and differs from the start.

Run: .venv/bin/python -m pytest tests/recipes/test_sft_run.py -q   (serial; 6 launches)
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

import pytest
from recipe_runs import (
    RUN_LIMIT,
    failure_text,
    kill_after_checkpoint,
    launch,
    processes_with,
    read_metrics,
    reload_final_model,
    save_tiny_model,
    write_configs,
)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A saved tiny model, toy rows in both SFT formats, and ZeRO-2/ZeRO-3/DDP configs
    (global batch 16, micro-batch 4: accumulation 2 on 2 processes)."""
    root = tmp_path_factory.mktemp("sft")
    model = save_tiny_model(root / "model")
    sums = [(a, b) for a in range(10) for b in range(10)]
    (root / "pc.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n" for a, b in sums
        )
    )
    (root / "chat.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"{a}+{b}="},
                        {"role": "assistant", "content": str(a + b)},
                    ]
                }
            )
            + "\n"
            for a, b in sums
        )
    )
    return {"root": root, "model": model, **write_configs(model, root, "sft", 16, 4)}


def check_finished_run(out, steps: int, tiny) -> list[dict]:
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(math.isfinite(r["loss"]) and r["completion_tokens"] > 0 for r in rows)
    assert not list(out.glob(".tmp-*"))
    assert reload_final_model(out / "final", tiny["model"]) > 1e-3  # trained weights
    return rows


def test_zero2_messages_packing_rotation(tiny, tmp_path):
    out = tmp_path / "run"
    res = launch(
        tiny["zero2"],
        "sft",
        out,
        "--model",
        str(tiny["model"]),
        "--dataset",
        str(tiny["root"] / "chat.jsonl"),
        "--packing",
        "true",
        "--max-seq-len",
        "16",
        "--max-steps",
        "4",
        "--save-every",
        "2",
        "--save-total-limit",
        "1",
    )
    assert res.returncode == 0, failure_text(res)
    assert "sft: 2 process(es), ZeRO stage 2" in res.stdout + res.stderr
    check_finished_run(out, 4, tiny)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]  # rotated
    assert (out / "latest").read_text() == "checkpoint-4"
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["rows_per_step"] == 16 and state["files"]  # the manifest of the save


def test_zero3_deepspeed_batch_wins_and_final_gathered(tiny, tmp_path):
    out = tmp_path / "run"
    res = launch(
        tiny["zero3"],
        "sft",
        out,
        "--model",
        str(tiny["model"]),
        "--dataset",
        str(tiny["root"] / "pc.jsonl"),
        "--per-device-batch-size",
        "16",
        "--max-steps",
        "3",
        "--save-every",
        "0",
    )
    assert res.returncode == 0, failure_text(res)
    output = res.stdout + res.stderr
    assert "sft: 2 process(es), ZeRO stage 3" in output
    assert (
        output.count(
            "note: per_device_batch_size 16 -> 4: the DeepSpeed config's "
            "`train_micro_batch_size_per_gpu` wins"
        )
        == 1
    )
    check_finished_run(out, 3, tiny)


def test_ddp_sigkill_then_resume_latest(tiny, tmp_path):
    out = tmp_path / "run"
    flags = ("--max-steps", "40", "--save-every", "5")
    proc = launch(tiny["ddp"], "sft", out, *flags, popen=True)
    resumed_from = kill_after_checkpoint(proc, out)
    before = {r["step"]: r for r in read_metrics(out)}
    assert resumed_from >= 5 and max(before) > resumed_from

    res = launch(tiny["ddp"], "sft", out, *flags, "--resume-from", "latest")
    assert res.returncode == 0, failure_text(res)
    assert "ZeRO stage off" in res.stdout + res.stderr
    rows = check_finished_run(out, 40, tiny)
    for r in rows:  # lost steps replayed identically: same rows, same weights, same RNG
        if r["step"] in before and r["step"] > resumed_from:
            assert r["loss"] == pytest.approx(before[r["step"]]["loss"], abs=1e-6), r["step"]


def test_ranks_exit_when_the_launcher_is_killed(tiny, tmp_path):
    """SIGKILL to `accelerate launch`'s process group: torch elastic starts each rank in a
    session of its own, so the ranks used to train on and write into the directory a resumed
    run would use. Now each rank dies with its launcher, and the directory is free again."""
    out = tmp_path / "run"
    marker = f"ZEROFIT_TEST_RANK_{os.getpid()}"
    flags = ("--max-steps", "2000", "--save-every", "0")
    proc = launch(tiny["ddp"], "sft", out, *flags, popen=True, env={marker: "1"})
    deadline = time.time() + RUN_LIMIT
    while time.time() < deadline and proc.poll() is None and not read_metrics(out):
        time.sleep(0.05)
    ranks = [pid for pid in processes_with(marker) if pid != proc.pid]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert read_metrics(out) and len(ranks) == 2, "the run did not start training"
    deadline = time.time() + 10
    while time.time() < deadline and set(ranks) & set(processes_with(marker)):
        time.sleep(0.05)
    left = set(ranks) & set(processes_with(marker))
    for pid in left:  # do not leave them running
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {sorted(left)} outlived their launcher"
    res = launch(tiny["ddp"], "sft", out, "--max-steps", "2", "--overwrite", "true")
    assert res.returncode == 0, failure_text(res)


def test_refused_directory_is_one_line_before_deepspeed_starts(tiny, tmp_path):
    """A non-empty --output-dir under a 2-process ZeRO-2 launch: each rank used to import
    torch, start DeepSpeed, print the error and its notes, and only then stop (124 s measured);
    now the input is checked first and the line is printed by local rank 0 only."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    started = time.monotonic()
    res = launch(tiny["zero2"], "sft", out)
    seconds = time.monotonic() - started
    output = res.stdout + res.stderr
    assert res.returncode != 0
    assert output.count(f"sft.py: output_dir: {out} is not empty") == 1, output[-3000:]
    assert "note:" not in output  # the DeepSpeed JSON was never read: no accelerator was built
    print(f"refused in {seconds:.1f} s")
