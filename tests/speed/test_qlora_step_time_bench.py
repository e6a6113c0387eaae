"""benchmarks/qlora_step_time.py's CPU-runnable parts: the plan it prints, its shapes (zerofit's
catalog's), a QLoRA step through its own quantization on the CPU (transformers'
``replace_with_bnb_linear``, bitsandbytes' NF4, peft), its host-cost rows, and ``--annotate`` on
measured-looking rows, which adds zerofit's predictions and the QLoRA - LoRA comparison.

Run: .venv/bin/python -m pytest tests/speed/test_qlora_step_time_bench.py -q   (~20 s)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, load_benchmark

from zerofit.speed.quantization import DEQUANTIZE_HOST_S_PER_CALL

BENCH = load_benchmark("qlora_step_time")
SCRIPT = REPO / "benchmarks" / "qlora_step_time.py"
H100_NAME = "NVIDIA H100 80GB HBM3"


def test_the_dry_run_prints_the_plan_without_a_gpu():
    """Five dequantize shapes, one host row, and LoRA / QLoRA x checkpointing x two lengths per
    shape: two shapes, or the 1.5B alone under ``--quick``."""
    for flags, shapes in (([], 2), (["--quick"], 1)):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--dry-run", *flags],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        kinds = [row["kind"] for row in rows]
        assert kinds.count("dequantize") == 5 and kinds.count("host") == 1
        steps = [row for row in rows if row["kind"] == "step"]
        assert len(steps) == 8 * shapes
        assert {row["seq"] for row in steps} == {512, 2048}
        assert {row["finetuning"] for row in steps} == {"lora", "qlora"}


def test_a_qlora_step_runs_on_the_cpu_through_the_scripts_quantization():
    """The tiny shape quantized as transformers' loader does: every decoder linear layer a
    ``Linear4bit`` (the LM head, tied to the embedding, stays 16-bit), peft's 4-bit LoRA layers
    on them, and a checkpointed step of the autocast stack runs."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    model = BENCH.build_model(BENCH.SHAPES["tiny"], "qlora", "cpu")
    modules = model.named_modules()
    four_bit = [name for name, module in modules if isinstance(module, bnb.nn.Linear4bit)]
    assert len(four_bit) == 7 * BENCH.SHAPES["tiny"]["num_hidden_layers"]
    assert not isinstance(model.lm_head, bnb.nn.Linear4bit)
    model = BENCH.add_adapters(model, "qlora")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    case = next(
        case
        for case in BENCH.step_cases(["tiny"], tiny=True)
        if case["finetuning"] == "qlora" and case["checkpointing"]
    )
    row = BENCH.time_steps(model, case, BENCH.SHAPES["tiny"], "cpu")
    assert row["seconds_per_step"] > 0 and row["trainable_params"] > 0


def test_the_host_rows_time_the_4_bit_path_against_a_16_bit_linear():
    """On the CPU the default kernel dequantizes at any size; the 4-bit forward + backward takes
    more host time than the 16-bit one, and the row says how much per dequantization."""
    pytest.importorskip("bitsandbytes")
    args = BENCH.parse_args(["--device", "cpu", "--tiny"])
    (host,) = [row for row in BENCH.plan(args) if row["kind"] == "host"]
    row = BENCH.measure_host(dict(host, calls=5), "cpu")
    assert row["host_s_step_4bit"] > row["host_s_step_16bit"] > 0
    assert row["host_s_per_dequantize"] == pytest.approx(
        (row["host_s_step_4bit"] - row["host_s_step_16bit"]) / 2
    )


def measured_rows() -> list[dict]:
    """Rows shaped as an H100 run writes them (made-up timings)."""
    common = {"device": "cuda", "gpu": H100_NAME, "tiny": False}
    step = {"kind": "step", "shape": "qwen2.5-1.5b", "stack": "autocast", "stage": 0}
    step.update(checkpointing=False, seq=2048, micro=2, rank=16, dropout=0.05)
    return [
        {"kind": "dequantize", "weight": "qwen2.5-7b.up_proj", "in_features": 3584}
        | {"out_features": 18944, "gpu_s_dequantize": 7e-5, **common},
        {"kind": "host", "rows": 2048, "width": 256, "calls": 200}
        | {"host_s_per_dequantize": 1e-4, **common},
        {**step, "finetuning": "lora", "seconds_per_step": 0.30, **common},
        {**step, "finetuning": "qlora", "seconds_per_step": 0.33, **common},
        {**step, "finetuning": "qlora", "seq": 512, "error": "OutOfMemoryError", **common},
    ]


def test_annotate_adds_zerofits_predictions_and_the_comparison(tmp_path, capsys):
    results = tmp_path / "qlora.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in measured_rows()))
    BENCH.annotate(results)
    printed = capsys.readouterr().out
    dequantize, host, lora, qlora, failed = [
        json.loads(line) for line in results.read_text().splitlines()
    ]
    # 3584 x 18944 elements at 2.77 bytes each
    assert dequantize["est_bytes"] == pytest.approx(3584 * 18944 * 2.766, rel=1e-3)
    assert dequantize["achieved_gbps"] == pytest.approx(dequantize["est_bytes"] / 7e-5 / 1e9, 0.01)
    assert host["est_host_s_per_dequantize"] == DEQUANTIZE_HOST_S_PER_CALL
    assert lora["est_dequantize_s"] == 0 and qlora["est_dequantize_s"] > 0
    assert qlora["est_step_s"] > lora["est_step_s"]
    assert qlora["err_step"] == pytest.approx(qlora["est_step_s"] / 0.33 - 1, abs=1e-3)
    assert "error" in failed and "est_step_s" not in failed
    assert "qwen2.5-1.5b no-ckpt 2048" in printed and "+0.0300 measured" in printed
    assert "host per dequantization: 100.0 us measured" in printed
    assert "dequantize qwen2.5-7b.up_proj: 70.0 us measured" in printed
    # annotating again gives the same file
    before = results.read_text()
    BENCH.annotate(results)
    assert results.read_text() == before
