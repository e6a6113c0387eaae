"""`zerofit estimate` / `zerofit plan` through zerofit.cli.main: JSON keys and types, clean errors.

Run: .venv/bin/python -m pytest tests/cli/test_cli_estimate.py -q   (~3 s)
"""
from __future__ import annotations

import json

import pytest

from zerofit.cli.main import main

FULL = ["estimate", "--model", "qwen2.5-0.5b", "--gpu", "H100-SXM", "--gpus-per-node", "1", "--nodes", "1", "--stage", "2",
        "--offload-optimizer", "none", "--offload-param", "none", "--seq-len", "1024", "--micro-batch", "2",
        "--no-gradient-checkpointing", "--precision", "bf16", "--workload", "sft", "--json"]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_json_keys_and_types(capsys):
    out = _json(capsys, FULL)
    assert isinstance(out["peak_gib"], float) and isinstance(out["fits"], bool) and isinstance(out["cpu_gib"], float)
    assert out["fits"] is True and out["cpu_gib"] == 0.0
    assert {"params", "master_fp32", "optimizer_states", "activations", "logits"} <= set(out["breakdown"])
    assert all(isinstance(v, float) for v in out["breakdown"].values())
    # same case as the spelled-out breakdown in test_memory (built-in shape of Qwen2.5-0.5B)
    assert out["peak_gib"] == pytest.approx(12.56, abs=0.02)


def test_estimate_offload_raises_cpu_and_lowers_gpu(capsys):
    base = _json(capsys, FULL)
    argv = [a if a != "none" else "cpu" for a in FULL]
    argv[argv.index("--stage") + 1] = "3"
    off = _json(capsys, argv)
    assert off["peak_gib"] < base["peak_gib"] and off["cpu_gib"] > 0


def test_estimate_defaults_and_human_output(capsys):
    out = _json(capsys, ["estimate", "--model", "qwen2.5-0.5b", "--json"])
    assert (out["stage"], out["micro_batch"], out["gradient_checkpointing"]) == (2, 1, False)
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A10"]) == 0
    assert "peak" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["estimate", "--stage", "5"], ["estimate", "--offload-optimizer", "disk"], ["estimate", "--seq-len", "abc"],
    ["estimate", "--micro-batch", "0"], ["estimate", "--gpu", "TPUv9"], ["estimate", "--stage", "2", "--offload-param", "cpu"],
    ["estimate", "--stage", "0", "--offload-optimizer", "cpu"], ["plan", "--gpus-per-node", "8", "--global-batch", "12"],
    ["estimate", "--bogus"],
])
def test_bad_input_exits_2_without_traceback(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


def test_plan_json_and_table(capsys):
    out = _json(capsys, ["plan", "--model", "qwen2.5-0.5b", "--seq-len", "1024", "--global-batch", "16", "--json"])
    assert out["global_batch"] == out["micro_batch"] * out["grad_accum"] * out["world_size"] == 16
    assert out["fits"] is True and out["decisions"] and len(out["alternatives"]) == 16
    assert main(["plan", "--model", "qwen2.5-0.5b", "--gpu", "A10"]) == 0
    assert "alternatives" in capsys.readouterr().out
