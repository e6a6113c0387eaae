"""QLoRA's 4-bit base in the speed model (speed/quantization.py): the dequantizations it counts
are the ones bitsandbytes runs in a real peft QLoRA step (bitsandbytes 0.50.2's NF4 on the CPU,
counted by torch's profiler), and the term they give moves as the code path says.

Run: .venv/bin/python -m pytest tests/speed/test_quantization.py -q   (~30 s, the real steps)
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
from conftest import load_benchmark

from zerofit.hardware import lookup
from zerofit.memory.estimate import TrainSetup
from zerofit.memory.lora import count_trainable_params, quantized_elements
from zerofit.models.resolve import resolve_model, spec_from_config
from zerofit.speed.quantization import (
    DEQUANTIZE_HOST_S_PER_CALL,
    count_dequantizations,
    dequantize_bytes_per_element,
    estimate_qlora_base,
    exposed_qlora_host_seconds,
)
from zerofit.speed.step_time import estimate_step_time, gpu_profile

H100 = lookup("H100-SXM")
QWEN25_7B = resolve_model("qwen2.5-7b")
QLORA_7B = TrainSetup(
    stage=0,
    stack="hf",
    precision="bf16",
    weights_dtype="bf16",
    micro_batch=1,
    seq_len=2048,
    finetuning="qlora",
    lora_dropout=0.05,
)
# more rows than bitsandbytes' fused 4-bit kernel takes on CUDA, so that the CPU's default
# kernel (which always dequantizes) runs what a GPU runs
ROWS = 160


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """benchmarks/gpu_lora_memory.py's tiny random-init Qwen2 (2 layers), saved once."""
    pytest.importorskip("bitsandbytes")
    bench = load_benchmark("gpu_lora_memory")
    folder = tmp_path_factory.mktemp("qlora_count") / "model"
    bench.save_random_model(bench.TINY, folder)
    return folder, bench.TINY


def measured_dequantizations(folder, targets: str, checkpointing: bool) -> int:
    """``bitsandbytes::dequantize_4bit`` calls in one forward + backward of a peft QLoRA model
    loaded as users load it (transformers' BitsAndBytesConfig: NF4, double quantization, bf16
    compute) on the CPU, counted by torch's profiler (which sees the calls inside
    ``gemm_4bit``'s kernel too)."""
    import torch
    from conftest import load_nf4_model
    from peft import LoraConfig, get_peft_model

    base = load_nf4_model(folder, torch.bfloat16)
    modules = targets if targets == "all-linear" else targets.split(",")
    model = get_peft_model(base, LoraConfig(r=4, target_modules=modules, lora_dropout=0.05))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    ids = torch.randint(0, 1000, (1, ROWS))
    counts: collections.Counter = collections.Counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        model(input_ids=ids, labels=ids).loss.backward()
    for event in profile.events():
        counts[event.name] += 1
    return counts["bitsandbytes::dequantize_4bit"]


@pytest.mark.parametrize(
    "targets, checkpointing",
    [
        ("all-linear", False),
        ("all-linear", True),
        ("gate_proj,up_proj,down_proj", False),
        ("q_proj,v_proj", False),
    ],
)
def test_the_count_is_what_bitsandbytes_runs(tiny_model_dir, targets, checkpointing):
    """Every 4-bit forward dequantizes (past the fused kernel's rows), checkpointing's recompute
    once more, and ``MatMul4Bit.backward`` only where the layer's input requires grad: without
    checkpointing the first layer's q/k/v do not (all-linear: 14 + 11 for two layers), nor its
    whole attention and MLP inputs when only the MLP carries adapters (14 + 1 + 7)."""
    folder, shape = tiny_model_dir
    spec = spec_from_config({**shape, "model_type": "qwen2"}, "tiny")
    setup = TrainSetup(
        stage=0,
        stack="hf",
        precision="bf16",
        micro_batch=1,
        seq_len=ROWS,
        gradient_checkpointing=checkpointing,
        finetuning="qlora",
        lora_targets=targets,
        lora_rank=4,
        lora_dropout=0.05,
    )
    predicted = count_dequantizations(setup, spec, sequences=1).calls
    assert predicted == measured_dequantizations(folder, targets, checkpointing)
    if targets == "all-linear":
        assert predicted == (42 if checkpointing else 25)


def test_lora_and_full_fine_tunes_have_no_term():
    for finetuning in ("lora", "full"):
        setup = dataclasses.replace(QLORA_7B, finetuning=finetuning)
        step = estimate_step_time(
            setup, QWEN25_7B, H100, trainable_params=count_trainable_params(QWEN25_7B, setup)
        )
        assert step.dequantize_s is None and "dequantize_s" not in step.breakdown()
        assert count_dequantizations(setup, QWEN25_7B, 1).calls == 0


def test_qlora_adds_its_term_to_the_step():
    """The same step as LoRA, plus ``dequantize_s``: the breakdown still adds up."""
    trainable = count_trainable_params(QWEN25_7B, QLORA_7B)
    qlora = estimate_step_time(QLORA_7B, QWEN25_7B, H100, trainable_params=trainable)
    lora = estimate_step_time(
        dataclasses.replace(QLORA_7B, finetuning="lora"),
        QWEN25_7B,
        H100,
        trainable_params=trainable,
    )
    assert qlora.dequantize_s > 0
    assert qlora.total_s == pytest.approx(lora.total_s + qlora.dequantize_s)
    assert sum(qlora.breakdown().values()) == pytest.approx(qlora.total_s, abs=1e-3)


def test_every_weight_is_dequantized_per_use_at_its_bytes():
    """Qwen2.5-7B, one 2048-token micro step without checkpointing: every 4-bit weight in the
    forward, all but the first layer's q/k/v in the backward; 2.77 bytes per element (half a
    byte read, two written, the double-quantized absmax chain); on an H100 that and peft's
    clones are the GPU seconds."""
    elements, tensors = quantized_elements(QWEN25_7B)
    counted = count_dequantizations(QLORA_7B, QWEN25_7B, 1)
    first_qkv = 3584 * (3584 + 512 + 512)
    assert counted.calls == 2 * tensors - 3
    assert counted.elements == 2 * elements - first_qkv
    assert dequantize_bytes_per_element(2) == pytest.approx(2.766, abs=1e-3)
    base = estimate_qlora_base(QLORA_7B, QWEN25_7B, gpu_profile(H100), 1, 2)
    dequantize_s = counted.elements * dequantize_bytes_per_element(2) / (H100.hbm_gbps * 0.85e9)
    assert dequantize_s < base.gpu_s < 1.5 * dequantize_s
    assert base.host_s == pytest.approx(counted.calls * DEQUANTIZE_HOST_S_PER_CALL)


def test_the_term_scales_with_layers_and_checkpointing():
    half = dataclasses.replace(QWEN25_7B, num_layers=QWEN25_7B.num_layers // 2)
    device = gpu_profile(H100)
    whole = estimate_qlora_base(QLORA_7B, QWEN25_7B, device, 1, 2)
    halved = estimate_qlora_base(QLORA_7B, half, device, 1, 2)
    assert halved.gpu_s == pytest.approx(whole.gpu_s / 2, rel=0.01)
    checkpointed = dataclasses.replace(QLORA_7B, gradient_checkpointing=True)
    # the recompute dequantizes every layer once more, and the first layer's q/k/v now too
    calls = count_dequantizations(checkpointed, QWEN25_7B, 1).calls
    assert calls == count_dequantizations(QLORA_7B, QWEN25_7B, 1).calls + 7 * 28 + 3


def test_a_short_forward_takes_the_fused_kernel_and_dpo_dequantizes_its_reference():
    short = dataclasses.replace(QLORA_7B, seq_len=64)
    _, tensors = quantized_elements(QWEN25_7B)
    assert count_dequantizations(short, QWEN25_7B, 1).calls == tensors - 3  # backward only
    dpo = dataclasses.replace(QLORA_7B, workload="dpo")
    # chosen and rejected through the trained forward and the adapter-disabled reference
    assert count_dequantizations(dpo, QWEN25_7B, 2).calls == 3 * tensors - 3


def test_host_calls_show_only_beyond_what_the_gpu_hides():
    """A host-bound micro step (its other host work above its GPU work) pays every call; a long
    GPU micro step hides them."""
    assert exposed_qlora_host_seconds(0.02, other_host_s=0.08, gpu_s=0.04) == 0.02
    assert exposed_qlora_host_seconds(0.02, other_host_s=0.08, gpu_s=0.09) == pytest.approx(0.01)
    assert exposed_qlora_host_seconds(0.02, other_host_s=0.08, gpu_s=0.5) == 0.0
    small = resolve_model("qwen2.5-0.5b")
    setup = dataclasses.replace(QLORA_7B, micro_batch=2)
    step = estimate_step_time(
        setup, small, H100, trainable_params=count_trainable_params(small, setup)
    )
    base = estimate_qlora_base(setup, small, gpu_profile(H100), 2, 2)
    assert step.dequantize_s == pytest.approx(base.gpu_s + base.host_s)
