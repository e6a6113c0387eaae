"""recipes/sft.py under real `accelerate launch`, 2 CPU processes, configs from `zerofit config`.

- ZeRO-2: chat-template (`messages`) rows with packing; checkpoints rotate (--save-total-limit).
- ZeRO-3: prompt/completion rows; the DeepSpeed JSON's micro batch wins over the flag, said once.
- DDP: SIGKILL after a checkpoint, `--resume-from latest`, every step logged once, lost steps
  replayed identically.
Each run's final model loads with from_pretrained in a separate process and differs from the start.

Run: .venv/bin/python -m pytest tests/recipes/test_sft_run.py -q   (serial; 4 launches)
"""

from __future__ import annotations

import json
import math

import pytest
from recipe_runs import (
    failure_text,
    kill_after_checkpoint,
    launch,
    read_metrics,
    reload_in_new_process,
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
    assert reload_in_new_process(out / "final", tiny["model"]) > 1e-3  # trained weights
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
