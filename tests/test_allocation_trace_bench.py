"""benchmarks/allocation_trace.py: the allocation events of a LoRA training run, recorded on fake
tensors through the real transformers / peft / torch.optim code (tiny shape), are a consistent
trace: every free and resize names a live storage, the load holds the model's parameters, and
the release leaves only cuBLAS's workspaces.

Run: .venv/bin/python -m pytest tests/test_allocation_trace_bench.py -q"""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark

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


def test_the_recorder_sees_fake_storages_born_and_freed():
    """Known allocations on fake tensors: a bf16 tensor is one alloc of its bytes, a view none,
    an expression's temporaries are allocated and freed, and deleting the tensor frees it (the
    weak reference on a fake storage fires)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    recorder = BENCH.AllocationRecorder(workspaces=False)
    with FakeTensorMode(), recorder.recording():
        tensor = torch.empty(1000, dtype=torch.bfloat16)
        view = tensor[:10]
        assert recorder.events == [("alloc", 0, 2000)]
        total = (tensor.float() * 2).sum()
        del view, tensor, total
    kinds = [kind for kind, _key, _nbytes in recorder.events]
    assert kinds.count("alloc") == kinds.count("free") == 4
    assert BENCH.check_events(recorder.events) == []
    assert recorder.live_keys() == []


def test_a_tiny_case_is_a_consistent_trace(tiny_run):
    """Every free and resize of the tiny case's trace names a live key, and after the release
    only cuBLAS's workspaces are alive: the forward's handle's cuBLAS and cuBLASLt ones (its
    first matmul is a biased q_proj), the backward's cuBLAS one (no biased addmm runs there
    without checkpointing)."""
    events = tiny_run["events"]
    assert BENCH.check_events(events) == []
    live: dict[int, int] = {}
    for kind, key, nbytes in events:
        if kind == "alloc":
            live[key] = nbytes
        elif kind == "free":
            del live[key]
    workspaces = tiny_run["workspace_keys"]
    assert sorted(live) == sorted(workspaces)
    assert list(workspaces.values()) == ["forward/cublas", "forward/cublaslt", "backward/cublas"]
    cublas, cublaslt = BENCH.CUBLAS_WORKSPACE_BYTES, BENCH.CUBLASLT_WORKSPACE_BYTES
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
    peak = BENCH.live_bytes_peak(events, steps[1], tiny_run["teardown_start"])
    assert peak > parameter_bytes + 2 * BENCH.CUBLAS_WORKSPACE_BYTES


def test_check_events_names_a_broken_trace():
    """The checker the tests rely on reports a free of a dead key and a resize of an unknown
    one."""
    broken = [("alloc", 0, 512), ("free", 0, 0), ("free", 0, 0), ("resize", 7, 10)]
    assert BENCH.check_events(broken) == [
        "event 2: free of key 0, not live",
        "event 3: resize of key 7, never allocated",
    ]


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
    assert BENCH.check_events([tuple(event) for event in line["events"]]) == []
    assert line["allocated_peak"] > 2 * BENCH.CUBLAS_WORKSPACE_BYTES
    assert "plain" in capsys.readouterr().out


def test_the_cli_refuses_a_case_out_of_range(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        BENCH.main(["--tiny", "--cases", "9", "--out", str(tmp_path / "x.jsonl")])
    assert exit_info.value.code != 0
    assert "--cases: [9] (fix: positions from 0 to 7)" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
