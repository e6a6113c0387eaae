"""benchmarks/other_estimators.py asks DeepSpeed's and accelerate's own estimators what they would
tell a user about a public report: these tests check it hands them the right inputs and reads
the right number back, on reports from the data files, against the libraries' own functions
called with inputs worked out by hand here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_benchmark

from zerofit.models.resolve import resolve_model

ROOT = Path(__file__).resolve().parents[1]
DATA_FILES = sorted((ROOT / "tests" / "data").glob("public_reports*.jsonl"))
GIB = 1024**3


BENCH = load_benchmark("other_estimators")
REPORTS = {r["id"]: r for path in DATA_FILES for r in BENCH.public_reports.load_reports(path)}
KNOWN = BENCH.public_reports.answer_fields()


def answers(report_id: str) -> dict:
    return BENCH.public_reports.answers_dict(REPORTS[report_id], KNOWN)[0]


def test_zero2_gets_the_models_params_and_the_world_size():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    # LLaMA-7B on 8 V100 32GB, ZeRO-2, no offload: a real OOM
    got = BENCH.estimate_deepspeed(answers("lf1221-v100x8-llama7b-z2"))
    assert got["function"] == "estimate_zero2_model_states_mem_needs"
    assert got["inputs"]["total_params"] == 6_738_415_616  # LLaMA-7B's published count
    cpu, gpu = estimate_zero2_model_states_mem_needs(
        6_738_415_616, num_gpus_per_node=8, num_nodes=1, cpu_offload=False
    )
    assert (got["cpu_bytes"], got["gpu_bytes"]) == (cpu, gpu)
    verdict = BENCH.judge(got, 31.75)
    assert verdict["gpu_gib"] == pytest.approx(gpu / GIB, abs=1e-3) and verdict["fits"] is True


def test_zero1_uses_the_zero2_estimator():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    report = answers("i-dsz-4090x2-deepseek-math-7b-z1-512")
    assert report["stage"] == 1
    got = BENCH.estimate_deepspeed(report)
    params = resolve_model(report["model"]).params
    assert got["function"] == "estimate_zero2_model_states_mem_needs"
    assert (got["cpu_bytes"], got["gpu_bytes"]) == estimate_zero2_model_states_mem_needs(
        params, num_gpus_per_node=2, num_nodes=1, cpu_offload=False
    )


def test_zero3_gets_the_largest_layer_offload_and_zero_init():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    # Llama-3.1-8B: 128256 x 4096 embedding, the largest single module
    got = BENCH.estimate_deepspeed(answers("lf5977-3090x8-llama3-8b-z3-offload"))
    assert got["inputs"]["total_params"] == 8_030_261_248
    assert got["inputs"]["largest_layer_params"] == 128_256 * 4096
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        8_030_261_248,
        128_256 * 4096,
        num_gpus_per_node=8,
        num_nodes=1,
        cpu_offload=True,
        cpu_offload_params=True,
        zero_init=True,
    )
    assert (got["cpu_bytes"], got["gpu_bytes"]) == (cpu, gpu)
    assert gpu == 4 * 128_256 * 4096  # everything offloaded: only the largest layer on the GPU
    # 4 nodes x 8 A800, optimizer offloaded, parameters on the GPU
    got = BENCH.estimate_deepspeed(answers("openrlhf776-a800x32-llama3.1-70b-grpo-z3"))
    spec = resolve_model("llama-3.1-70b")
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        spec.params,
        128_256 * 8192,
        num_gpus_per_node=8,
        num_nodes=4,
        cpu_offload=True,
        cpu_offload_params=False,
        zero_init=True,
    )
    assert (got["cpu_bytes"], got["gpu_bytes"]) == (cpu, gpu)


def test_stage_0_is_not_applicable_for_deepspeed_only():
    report = REPORTS["lf3696-a800x1-llama3-8b-pt"]
    assert report["answers"]["stage"] == 0
    verdicts = BENCH.estimate_other_tools(report, KNOWN)
    assert verdicts["deepspeed"]["status"] == "not_applicable"
    assert "stage 0" in verdicts["deepspeed"]["reason"]
    assert verdicts["accelerate"]["status"] == "ok"


def test_host_ram_is_judged_only_where_the_report_states_it():
    # Qwen2.5-32B, everything offloaded, one H100 NVL on a node of 744 GiB: the host ran out
    report = REPORTS["k-lf6755-h100nvl-qwen25-32b-z3off-hostoom"]
    verdict = BENCH.estimate_other_tools(report, KNOWN)["deepspeed"]
    assert verdict["gpu_gib"] < 93.6 and verdict["cpu_gib"] > 744
    assert verdict["fits"] is False
    unstated = {**report, "answers": {**report["answers"], "host_ram_gib": None}}
    assert BENCH.estimate_other_tools(unstated, KNOWN)["deepspeed"]["fits"] is True


def _meta_model(name: str, auto_class: str):
    """The model built as accelerate's create_empty_model builds it (fp32, empty weights)."""
    import torch
    import transformers
    from accelerate import init_empty_weights

    config = json.loads(resolve_model(name).config_json)
    cfg = transformers.AutoConfig.for_model(
        config["model_type"], **{k: v for k, v in config.items() if k != "model_type"}
    )
    with init_empty_weights():
        return getattr(transformers, auto_class).from_config(cfg, torch_dtype=torch.float32)


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-7b"])  # tied, untied lm_head
def test_accelerate_number_is_what_the_command_prints(name):
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes, convert_bytes

    model = _meta_model(name, "AutoModel")  # no auto_map: create_empty_model's constructor
    total_size, _ = calculate_maximum_sizes(model)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    ours = BENCH.accelerate_model_bytes(resolve_model(name))
    assert ours == total_size - buffers and 0 < buffers < 1024  # rotary inv_freq only
    report = {"model": name, "precision": "bf16"}
    got = BENCH.estimate_accelerate(report)
    command_peak = max(estimate_training_usage(total_size, "float16").values())
    assert got["dtype"] == "float16" and got["gpu_bytes"] == 2 * ours  # Adam's two fp32 moments
    assert convert_bytes(got["gpu_bytes"]) == convert_bytes(command_peak)


def test_accelerate_reads_the_float32_row_for_an_fp32_run():
    from accelerate.commands.estimate import estimate_training_usage

    report = answers("b-trl3168-a100x1-qwen2.5-0.5b-dpo-quickstart")
    assert report["precision"] == "fp32"
    got = BENCH.estimate_accelerate(report)
    model_bytes = 4 * 494_032_768  # Qwen2.5-0.5B, tied embeddings: no separate lm_head
    assert got["model_bytes"] == model_bytes
    assert got["gpu_bytes"] == max(estimate_training_usage(model_bytes, "float32").values())
    assert got["gpu_bytes"] == 4 * model_bytes


def test_largest_layer_is_deepspeeds_on_built_models():
    from deepspeed.runtime.zero.stage3 import model_to_params

    for name in ("qwen2.5-0.5b", "mixtral-8x7b"):  # an embedding, a fused experts module
        _, largest = model_to_params(_meta_model(name, "AutoModelForCausalLM"))
        assert BENCH.largest_layer_params(resolve_model(name)) == largest
    # inside a decoder layer of Qwen2.5-0.5B: the MLP's 896 x 4864 projections, no bias
    layer = _meta_model("qwen2.5-0.5b", "AutoModel").layers[0]
    widest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in layer.modules())
    assert BENCH.widest_projection(resolve_model("qwen2.5-0.5b")) == widest == 896 * 4864


def test_largest_layer_bound_never_decides_on_the_reports():
    """On every report's model the embedding or the experts module is larger than any decoder
    layer projection, so the projections' left-out biases never change the number."""
    for ref in {answers(rid)["model"] for rid in REPORTS}:
        spec = resolve_model(ref)
        exact = max(
            spec.vocab_size * spec.hidden_size,
            spec.num_experts * 3 * spec.hidden_size * spec.moe_intermediate_size,
        )
        assert BENCH.largest_layer_params(spec) == exact, ref
