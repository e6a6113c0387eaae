"""The device profiles the speed model reads: a catalog GPU's reproduces the GPU model exactly, a
measured CPU's carries each measurement into the terms it sets.

Run: .venv/bin/python -m pytest tests/speed/test_device.py -q   (~4 s)
"""

from __future__ import annotations

import dataclasses

import pytest

from zerofit.hardware import lookup
from zerofit.memory.estimate import TrainSetup
from zerofit.models.resolve import resolve_model
from zerofit.speed.device import (
    CpuMeasurements,
    cpu_profile,
    measure_matmul_tflops,
    measure_memory_gbps,
    measure_torch_adam_params_per_s,
    measure_training_tflops,
)
from zerofit.speed.step_time import (
    CPU_ADAM_BYTES_PER_PARAM,
    estimate_step_time,
    gpu_optimizer_seconds,
    gpu_profile,
    ring_seconds,
)

MODEL = resolve_model("qwen2.5-0.5b")
SETUPS = [
    TrainSetup(stage=2, world_size=8, gpus_per_node=8, micro_batch=2, seq_len=2048),
    TrainSetup(stage=3, world_size=16, gpus_per_node=8, grad_accum=4, gradient_checkpointing=True),
    TrainSetup(stage=1, world_size=2, offload_optimizer="cpu", precision="fp32"),
    TrainSetup(stage=3, world_size=4, offload_optimizer="cpu", offload_param="cpu"),
]
MEASURED = CpuMeasurements(
    matmul_tflops=0.1,
    memory_gbps=20.0,
    cpu_adam_params_per_s=1e9,
    link_gbits=0.1,
    reduce_scatter_cost=2.0,
    all_gather_cost=1.5,
)


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-80GB", "L40S", "T4"])
def test_a_catalog_gpu_and_its_profile_give_the_same_step(gpu: str) -> None:
    spec = lookup(gpu)
    for setup in SETUPS:
        by_spec = estimate_step_time(setup, MODEL, spec, inter_node_gbps=25)
        by_profile = estimate_step_time(setup, MODEL, gpu_profile(spec), inter_node_gbps=25)
        assert by_profile == by_spec


def test_the_cpu_profile_carries_each_measurement() -> None:
    device = cpu_profile(MEASURED)
    assert device.peak_tflops == 0.1 and device.efficiency.at(1) == 1.0
    assert device.memory_gbps == 20.0 and device.offload_gbps == 20.0
    assert device.cpu_adam_host_gbps == pytest.approx(1e9 * CPU_ADAM_BYTES_PER_PARAM / 1e9)
    assert device.link_efficiency == 1.0
    assert not device.overlaps_comm and device.wire_bytes_follow_precision
    assert (device.reduce_scatter_cost, device.all_gather_cost) == (2.0, 1.5)
    # no fitted fixed costs: what Python costs on the CPU shows up as error
    assert device.micro_step_overhead_s == device.optimizer_step_overhead_s == 0.0
    assert device.grad_hook_s_per_tensor == device.stage3_fetch_s_per_module == 0.0


def test_an_fp32_zero1_step_on_the_cpu_profile_by_hand() -> None:
    """Two nodes of one rank, fp32: the gradients' all-reduce and the parameters' all-gather
    after the step, each waited for (gloo does not overlap), at 4 bytes per element."""
    setup = TrainSetup(stage=1, world_size=2, gpus_per_node=1, precision="fp32", seq_len=128)
    step = estimate_step_time(setup, MODEL, cpu_profile(MEASURED), inter_node_gbps=0.1)
    link_gbps = 0.1 / 8
    all_reduce = 2 * ring_seconds(MODEL.params * 4, 2, link_gbps)
    all_gather = 1.5 * ring_seconds(MODEL.params * 4, 2, link_gbps)
    assert step.exposed_comm_s == pytest.approx(all_reduce + all_gather)
    assert step.gpu_optimizer_s == pytest.approx(MODEL.params / 2 * 30 / 20e9)
    assert step.overhead_s == 0.0
    offloaded = estimate_step_time(
        dataclasses.replace(setup, offload_optimizer="cpu"),
        MODEL,
        cpu_profile(MEASURED),
        inter_node_gbps=0.1,
    )
    assert offloaded.cpu_optimizer_s == pytest.approx(MODEL.params / 2 / 1e9)
    # gradients to the "host" and the updated partition back, 4 bytes each, at memory speed
    assert offloaded.offload_transfer_s == pytest.approx(2 * MODEL.params / 2 * 4 / 20e9)


def test_this_machine_measures_positive_rates() -> None:
    assert 0 < measure_matmul_tflops(64, 256, 512, tokens=64) < 100
    assert 0 < measure_memory_gbps(elements=2**20) < 10_000


def test_the_cpu_profile_carries_the_whole_step_measurements() -> None:
    """The model's own forward+backward rate replaces the matmul rate; torch AdamW's rate sets
    the on-device optimizer step; DeepSpeed's bucketed all-reduce sets the link's efficiency
    while the gathers and the reduce-scatter keep their measured seconds."""
    measured = dataclasses.replace(
        MEASURED, training_tflops=0.08, torch_adam_params_per_s=2e8, bucket_all_reduce_gbits=0.08
    )
    device = cpu_profile(measured)
    assert device.peak_tflops == 0.08
    # a composed rate above the matmuls' own is the noise of a difference: the matmuls bound it
    faster = cpu_profile(dataclasses.replace(measured, training_tflops=0.3))
    assert faster.peak_tflops == MEASURED.matmul_tflops
    assert device.optimizer_params_per_s == 2e8
    assert device.link_efficiency == pytest.approx(0.8)
    setup = TrainSetup(stage=1, world_size=2, gpus_per_node=1, precision="fp32", seq_len=128)
    step = estimate_step_time(setup, MODEL, device, inter_node_gbps=0.1)
    link_gbps = 0.1 / 8
    bucket_all_reduce = 2 * ring_seconds(MODEL.params * 4, 2, link_gbps * 0.8)
    all_gather = 1.5 * ring_seconds(MODEL.params * 4, 2, link_gbps)  # as measured, raw
    assert step.exposed_comm_s == pytest.approx(bucket_all_reduce + all_gather)
    assert step.gpu_optimizer_s == pytest.approx(MODEL.params / 2 / 2e8)
    zero3 = estimate_step_time(
        dataclasses.replace(setup, stage=3), MODEL, device, inter_node_gbps=0.1
    )
    unscaled = estimate_step_time(
        dataclasses.replace(setup, stage=3),
        MODEL,
        cpu_profile(dataclasses.replace(measured, bucket_all_reduce_gbits=0.0)),
        inter_node_gbps=0.1,
    )
    assert zero3.exposed_comm_s == pytest.approx(unscaled.exposed_comm_s)


def test_a_measured_optimizer_rate_sets_the_device_step_and_a_gpu_keeps_its_bandwidth() -> None:
    setup = TrainSetup(stage=2, world_size=4, gpus_per_node=4)
    h100 = gpu_profile(lookup("H100-SXM"))
    assert h100.optimizer_params_per_s is None
    partition = MODEL.params / 4
    assert gpu_optimizer_seconds(setup, h100, MODEL.params) == pytest.approx(
        partition * 30 / (h100.memory_gbps * 1e9)
    )
    measured = dataclasses.replace(h100, optimizer_params_per_s=1e8)
    assert gpu_optimizer_seconds(setup, measured, MODEL.params) == pytest.approx(partition / 1e8)


def test_this_machine_measures_a_whole_model_rate_and_torch_adam() -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 512,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }
    assert 0 < measure_training_tflops(config, micro_batch=2, seq_len=32) < 100
    assert 0 < measure_torch_adam_params_per_s(2**16) < 1e12
