"""Model-state terms that are not DeepSpeed's: what DDP adds without DeepSpeed (stage 0).

Run: .venv/bin/python -m pytest tests/memory/test_states.py -q   (~5 s)
"""

from __future__ import annotations

import pytest
from memory_probe import tracked_peak
from memory_shapes import QWEN25_7B

from zerofit.memory import states as st
from zerofit.memory.estimate import TrainSetup


def test_ddp_keeps_a_bucket_copy_of_every_gradient(monkeypatch, free_port):
    """torch's DDP (gradient_as_bucket_view=False, accelerate's default) allocates its buckets
    when it wraps the model: one more copy of every gradient (states.ddp_bucket_bytes), measured
    with MemTracker on a one-process gloo group."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(1000, 2000), torch.nn.Linear(2000, 1000))
        weights = sum(p.nbytes for p in model.parameters())
        wrapped = {}

        def wrap():
            wrapped["ddp"] = torch.nn.parallel.DistributedDataParallel(model)

        _, after, _ = tracked_peak(wrap, model)
    finally:
        dist.destroy_process_group()
    assert after - weights == weights  # the buckets: the grads' size, in the weights' dtype
    two_ranks = TrainSetup(stage=0, world_size=2)
    assert st.ddp_bucket_bytes(QWEN25_7B, two_ranks, 4) == QWEN25_7B.params * 4
    assert st.ddp_bucket_bytes(QWEN25_7B, TrainSetup(stage=0, world_size=1), 4) == 0


def test_offloaded_zero2_takes_each_grad_slice_norm_in_fp64_on_the_gpu():
    """ZeRO-1/2 with the optimizer on the CPU takes each param's grad-slice norm after casting it
    to ``get_norm_dtype()`` (fp64 where the device has it) on the GPU, then casts it to fp32 for
    the host copy: one slice at a time, 8 bytes per element. The untied LM head's comes first,
    while every activation is saved, with the head's own grad; a layer's weights come later."""
    offload = TrainSetup(stage=2, world_size=8, offload_optimizer="cpu")
    moments = st.backward_moments(QWEN25_7B, offload, 2)
    head = QWEN25_7B.vocab_size * QWEN25_7B.hidden_size
    assert moments["head"] == {"lm_head_grad": head * 2, "offload_grad_temps": head * 8}
    layer = QWEN25_7B.hidden_size * QWEN25_7B.intermediate_size
    assert moments["layers"] == {"offload_grad_temps": layer * 8}
    on_gpu = st.backward_moments(QWEN25_7B, TrainSetup(stage=2, world_size=8), 2)
    assert on_gpu == {"head": {"lm_head_grad": head * 2}, "layers": {}}


def test_offloaded_zero3_moves_each_grad_through_gpu_temporaries():
    """ZeRO-3 with the optimizer on the CPU copies this rank's slice of each grad back to the
    GPU, takes its norm in fp64 chunks of 250M elements, then casts it to fp32 for the host: on
    one GPU, the whole LM head's slice."""
    head = QWEN25_7B.vocab_size * QWEN25_7B.hidden_size  # 545M elements
    one_gpu = TrainSetup(stage=3, world_size=1, offload_optimizer="cpu")
    moments = st.backward_moments(QWEN25_7B, one_gpu, 2)
    assert moments["head"]["offload_grad_temps"] == head * 2 + head * 4  # fp32 > 250M x fp64
    eight = TrainSetup(stage=3, world_size=8, offload_optimizer="cpu")
    piece = -(-head // 8)  # 68M elements: under one chunk, so the fp64 copy is the larger
    assert st.backward_moments(QWEN25_7B, eight, 2)["head"]["offload_grad_temps"] == piece * 10


def test_deepspeed_still_takes_offloaded_grad_norms_in_fp64():
    """The term above reads DeepSpeed's code: the installed version must still cast the slice to
    ``get_norm_dtype()`` before the norm, and that dtype must be fp64 on a device with fp64."""
    pytest.importorskip("deepspeed")
    import inspect

    import torch
    from deepspeed.runtime.zero import stage3, stage_1_and_2, utils

    source = inspect.getsource(stage_1_and_2.DeepSpeedZeroOptimizer.set_norm_for_param_grad_in_gpu)
    assert ".to(get_norm_dtype()).norm(2)" in source
    chunked = inspect.getsource(stage3.DeepSpeedZeroOptimizer_Stage3._constant_buffered_norm2)
    assert "buffer_size=250000000" in chunked and "to(get_norm_dtype())" in chunked
    norm_dtype = inspect.getsource(utils.get_norm_dtype)
    assert "is_fp64_supported()" in norm_dtype and "return torch.double" in norm_dtype
    assert torch.double.itemsize == st.FP64 and st.NORM_CHUNK == 250_000_000


def test_hpz_keeps_a_16bit_secondary_shard_of_the_node_and_qwz_qgz_their_buffers():
    """ZeRO++ (states.zero_plus_resident, qwz_gather_buffer_bytes, qgz_buffer_bytes): hpZ adds
    params x 2 / GPUs per node on each rank for the whole step (the secondary partition of
    partition_parameters.py ``Init._partition_param_sec``), nothing with parameters offloaded;
    qwZ an int8 prefetch bucket beside the gathered weights; qgZ its int4 temporaries in
    backward. Plain ZeRO-3 is unchanged."""
    plain = TrainSetup(stage=3, world_size=16, gpus_per_node=8)
    hpz = TrainSetup(stage=3, world_size=16, gpus_per_node=8, zero_plus="hpz")
    quantized = TrainSetup(stage=3, world_size=16, gpus_per_node=8, zero_plus="hpz+qwz+qgz")
    buckets = hpz.bucket_sizes(QWEN25_7B.hidden_size)
    resident = st.resident_states(QWEN25_7B, hpz, 2, buckets)
    assert resident["hpz_secondary_params"] == -(-QWEN25_7B.params // 8) * 2
    assert "hpz_secondary_params" not in st.resident_states(QWEN25_7B, plain, 2, buckets)
    # DPO's reference model runs under the same ZeRO-3 config (TRL prepare_deepspeed)
    dpo = TrainSetup(stage=3, world_size=16, gpus_per_node=8, zero_plus="hpz", workload="dpo")
    with_reference = st.resident_states(QWEN25_7B, dpo, 2, buckets)
    assert with_reference["hpz_secondary_reference"] == resident["hpz_secondary_params"]
    offloaded = TrainSetup(
        stage=3,
        world_size=16,
        gpus_per_node=8,
        zero_plus="hpz",
        offload_optimizer="cpu",
        offload_param="cpu",
    )
    assert "hpz_secondary_params" not in st.resident_states(QWEN25_7B, offloaded, 2, buckets)
    live_plain = st.stage3_live_params(QWEN25_7B, hpz, 2, buckets)
    live_quantized = st.stage3_live_params(QWEN25_7B, quantized, 2, buckets)
    assert live_quantized - live_plain == buckets["stage3_prefetch_bucket_size"]
    backward = st.backward_buffers(QWEN25_7B, quantized, 2, buckets)
    head = QWEN25_7B.vocab_size * QWEN25_7B.hidden_size
    assert backward["qgz_buffers"] == head + -(-3 * head // 8)
    assert "qgz_buffers" not in st.backward_buffers(QWEN25_7B, hpz, 2, buckets)
