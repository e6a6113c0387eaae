"""recipes/dpo.py under real `accelerate launch`, 2 CPU processes, configs from `zerofit config`.

- ZeRO-3: the frozen reference sharded through its own DeepSpeed engine; local pairs file.
- ZeRO-2 with --precompute-ref: SIGKILL after a checkpoint, `--resume-from latest` reuses the
  stored reference log-probs, every step logged once, lost steps replayed identically.
- DDP: a replicated reference.
Each run's final model loads with from_pretrained in a separate process and differs from the start.

Run: .venv/bin/python -m pytest tests/recipes/test_dpo_run.py -q   (serial; 4 launches)
"""

from __future__ import annotations

import json
import math

import pytest
from recipe_runs import (
    failure_text,
    kill_after_checkpoint,
    launch,
    load_recipe,
    read_metrics,
    reload_final_model,
    save_tiny_model,
    write_configs,
)

pytestmark = pytest.mark.distributed
METRICS = {"loss", "reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy", "tok_s"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A saved tiny model, the toy pairs as JSONL, and ZeRO-2/ZeRO-3/DDP configs
    (global batch 8 pairs, micro-batch 2: accumulation 2 on 2 processes)."""
    root = tmp_path_factory.mktemp("dpo")
    model = save_tiny_model(root / "model")
    rows = load_recipe("dpo").toy_rows()
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "model": model, **write_configs(model, root, "dpo", 8, 2)}


def check_finished_run(out, steps: int, tiny) -> list[dict]:
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
        assert set(r) >= METRICS and math.isfinite(r["loss"]) and 0 <= r["reward_accuracy"] <= 1
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)  # policy == reference at first
    assert rows[-1]["reward_margin"] > 0  # the policy moved towards the chosen answers
    assert reload_final_model(out / "final", tiny["model"]) > 1e-4
    return rows


def test_zero3_sharded_reference(tiny, tmp_path):
    out = tmp_path / "run"
    res = launch(
        tiny["zero3"],
        "dpo",
        out,
        "--model",
        str(tiny["model"]),
        "--dataset",
        str(tiny["root"] / "pairs.jsonl"),
        "--max-steps",
        "4",
        "--save-every",
        "0",
    )
    assert res.returncode == 0, failure_text(res)
    assert (
        "dpo: 2 process(es), ZeRO stage 3, 100 pairs, 8 per step, reference a frozen model"
        in res.stdout + res.stderr
    )
    check_finished_run(out, 4, tiny)


def test_ddp_replicated_reference(tiny, tmp_path):
    out = tmp_path / "run"
    res = launch(tiny["ddp"], "dpo", out, "--max-steps", "4", "--save-every", "0")
    assert res.returncode == 0, failure_text(res)
    assert "ZeRO stage off" in res.stdout + res.stderr
    check_finished_run(out, 4, tiny)


def test_zero2_precomputed_reference_sigkill_then_resume(tiny, tmp_path):
    out = tmp_path / "run"
    flags = ("--max-steps", "40", "--save-every", "5", "--precompute-ref", "true")
    proc = launch(tiny["zero2"], "dpo", out, *flags, popen=True)
    resumed_from = kill_after_checkpoint(proc, out)
    assert (out / "ref_logps.pt").exists()
    before = {r["step"]: r for r in read_metrics(out)}
    assert resumed_from >= 5 and max(before) > resumed_from

    res = launch(tiny["zero2"], "dpo", out, *flags, "--resume-from", "latest")
    assert res.returncode == 0, failure_text(res)
    assert "reference precomputed" in res.stdout + res.stderr
    rows = check_finished_run(out, 40, tiny)
    for r in rows:  # lost steps replayed identically: same pairs, same weights, same reference
        if r["step"] in before and r["step"] > resumed_from:
            assert r["loss"] == pytest.approx(before[r["step"]]["loss"], abs=1e-6), r["step"]
            assert r["reward_margin"] == pytest.approx(before[r["step"]]["reward_margin"], abs=1e-6)
