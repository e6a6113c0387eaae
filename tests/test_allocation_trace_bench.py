"""benchmarks/allocation_trace.py: the allocation events of a LoRA training run, recorded on fake
tensors through the real transformers / peft / torch.optim code (tiny shape), are a consistent
trace: every free and resize names a live storage, the load holds the model's parameters, and
the release leaves only cuBLAS's workspaces.

Run: .venv/bin/python -m pytest tests/test_allocation_trace_bench.py -q"""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark

from zerofit.memory.allocation_trace import (
    CUBLAS_WORKSPACE_BYTES,
    CUBLASLT_WORKSPACE_BYTES,
    check_events,
    live_bytes_peak,
)

# fake-tensor recordings of whole runs: run_suite.py runs them beside the launches
pytestmark = pytest.mark.replay

BENCH = load_benchmark("allocation_trace")
SHAPES = load_benchmark("model_shapes")


def tiny_parameter_bytes() -> int:
    """Bytes of the tiny Qwen2's bf16 parameters (the tied embedding once), from transformers'
    own module built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", **SHAPES.TINY)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return sum(param.numel() * param.element_size() for param in model.parameters())


@pytest.fixture(scope="module")
def tiny_run() -> dict:
    """The first tiny case (plain stack, no checkpointing) recorded once for the tests here."""
    case = BENCH.traced_cases(tiny=True)[0]
    return BENCH.record_run(case, SHAPES.TINY)


def test_a_tiny_case_is_a_consistent_trace(tiny_run):
    """Every free and resize of the tiny case's trace names a live key, and after the release
    only cuBLAS's workspaces are alive: the forward's handle's cuBLAS and cuBLASLt ones (its
    first matmul is a biased q_proj), the backward's cuBLAS one (no biased addmm runs there
    without checkpointing)."""
    events = tiny_run["events"]
    assert check_events(events) == []
    live: dict[int, int] = {}
    for kind, key, nbytes in events:
        if kind == "alloc":
            live[key] = nbytes
        elif kind == "free":
            del live[key]
    workspaces = tiny_run["workspace_keys"]
    assert sorted(live) == sorted(workspaces)
    assert list(workspaces.values()) == ["forward/cublas", "forward/cublaslt", "backward/cublas"]
    cublas, cublaslt = CUBLAS_WORKSPACE_BYTES, CUBLASLT_WORKSPACE_BYTES
    assert list(live.values()) == [cublas, cublaslt, cublas]
    assert events[-1] == ("empty_cache", 0, 0)


def test_the_load_holds_the_parameters_in_checkpoint_order(tiny_run):
    """The warm-up takes the parameters' bytes, the load then allocates each parameter once,
    the embedding first (from_pretrained's sorted keys), and the steps' peak holds more than
    the parameters."""
    events = tiny_run["events"]
    parameter_bytes = tiny_parameter_bytes()
    warmup = events[0]
    assert warmup == ("alloc", tiny_run["warmup_key"], parameter_bytes)
    assert events[1] == ("free", tiny_run["warmup_key"], 0)
    embedding = SHAPES.TINY["vocab_size"] * SHAPES.TINY["hidden_size"] * 2
    assert events[2][2] == embedding
    steps = tiny_run["step_starts"]
    assert len(steps) == BENCH.STEPS and steps == sorted(steps)
    peak = live_bytes_peak(events, steps[1], tiny_run["teardown_start"])
    assert peak > parameter_bytes + 2 * CUBLAS_WORKSPACE_BYTES


def test_every_real_shape_case_has_its_measured_row():
    """The traced cases are the LoRA rows measured on GPUs: four of the plain stack (H200) and
    four of the autocast stack (H100)."""
    cases = BENCH.traced_cases(tiny=False)
    assert [case["stack"] for case in cases] == ["plain"] * 4 + ["autocast"] * 4
    rows = [BENCH.measured_row(case) for case in cases]
    assert all(row is not None and "max_reserved" in row for row in rows)


def test_the_cli_writes_one_line_per_case(tmp_path, capsys):
    """``--tiny --cases 0`` writes one JSON line with the events, step boundaries and peak."""
    out = tmp_path / "traces.jsonl"
    BENCH.main(["--tiny", "--cases", "0", "--out", str(out)])
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["case"]["stack"] == "plain" and line["case"]["seq"] == 64
    assert check_events([tuple(event) for event in line["events"]]) == []
    assert line["allocated_peak"] > 2 * CUBLAS_WORKSPACE_BYTES
    assert "plain" in capsys.readouterr().out


def test_the_cli_refuses_a_case_out_of_range(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        BENCH.main(["--tiny", "--cases", "9", "--out", str(tmp_path / "x.jsonl")])
    assert exit_info.value.code != 0
    assert "--cases: [9] (fix: positions from 0 to 7)" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
