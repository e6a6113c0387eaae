"""What the GPU holds outside max_memory_allocated: NCCL buffers by world size and node count, the
allocator term, vLLM's share, and how `fits` adds them up; and the cuBLAS workspaces it holds
inside it.

Run: .venv/bin/python -m pytest tests/memory/test_overheads.py -q   (~1 s)
"""

from __future__ import annotations

import dataclasses

import pytest
from memory_shapes import QWEN25_05B, QWEN25_7B

from zerofit.memory import overheads as oh
from zerofit.memory.estimate import GIB, TrainSetup, estimate_memory

MIB = 1024**2


def test_nccl_buffers_grow_with_nodes_not_with_gpus_in_a_ring():
    assert oh.nccl_buffer_bytes(1, 1) == 0  # one GPU: no communicator traffic
    one_node = oh.nccl_buffer_bytes(8, 8, "nvlink")
    assert one_node == oh.nccl_buffer_bytes(4, 4, "nvlink")  # a ring receives from one peer
    # 16 channels x 1 peer x (4 MiB simple + 0.5 MiB LL + 4.69 MiB LL128)
    assert one_node == 16 * (4 * MIB + 512 * 1024 + 120 * 640 * 8 * 8)
    assert oh.nccl_buffer_bytes(16, 8, "nvlink") > one_node  # network ring + tree peers
    assert oh.nccl_buffer_bytes(8, 8, "pcie") < one_node  # fewer channels over PCIe


def test_allocator_term_counts_rounding_and_one_freed_block():
    no_gc = oh.allocator_fragmentation_bytes(QWEN25_05B, False, 0)
    gc = oh.allocator_fragmentation_bytes(QWEN25_05B, True, 0)
    assert no_gc == (24 * 15 + 20) * 2 * MIB and gc == (24 + 20) * 2 * MIB
    assert oh.allocator_fragmentation_bytes(QWEN25_05B, True, 5 * GIB) == gc + 5 * GIB


def test_fits_adds_every_outside_term_and_the_margin():
    est = estimate_memory(
        QWEN25_7B,
        TrainSetup(
            stage=3,
            world_size=16,
            gpus_per_node=8,
            micro_batch=1,
            seq_len=2048,
            gradient_checkpointing=True,
        ),
    )
    outside = est.outside_bytes(79.6)
    assert outside["nccl_buffers"] > 0 and outside["allocator_fragmentation"] > 0
    need = est.gpu_need_bytes(79.6)
    assert need == est.peak_bytes + sum(outside.values())
    exact = need / GIB + 1.0  # + the default 1 GiB margin
    assert est.fits(exact + 0.01) and not est.fits(exact - 0.01)
    assert est.fits(exact - 0.5, safety_margin_gib=0.0)


def test_cublas_workspaces_follow_the_gpus_architecture_and_need_cuda():
    """torch's default workspace per cuBLAS handle and stream (CublasHandlePool.cpp
    ``parseChosenWorkspaceSize``): 32 MiB on Hopper and Blackwell, 8.125 MiB on older GPUs, each
    with a 1 MiB cuBLASLt one, for the two threads a step multiplies on. A step that runs on no
    CUDA GPU has none: a CPU rank, or an AMD GPU under ROCm."""
    hopper = 2 * (32 * MIB + MIB)
    assert hopper == 69_206_016  # what every H100 process of the LoRA benchmark kept allocated
    for gpu in ("H100-SXM", "H100", "H200", "H800", "H20", "B200"):
        assert oh.cublas_workspace_bytes(gpu) == hopper, gpu
    older = 2 * (8 * MIB + 128 * 1024 + MIB)  # ":4096:2:16:8" = 8.125 MiB
    for gpu in ("A100-80GB", "A10", "L4", "RTX4090", "T4", "V100"):
        assert oh.cublas_workspace_bytes(gpu) == older, gpu
    assert oh.cublas_workspace_bytes(None) == 0
    assert oh.cublas_workspace_bytes("MI300X") == oh.cublas_workspace_bytes("MI250X") == 0


def test_the_estimate_holds_the_cublas_workspaces_in_every_phase_on_a_cuda_gpu():
    """The workspaces are allocated at each thread's first matmul and kept, so every phase holds
    them: the peak's phase and the allocator term stay what they are without them. The CPU
    probes' setups name no GPU, and their estimate has no such term (there is no cuBLAS on a
    CPU)."""
    base = TrainSetup(workload="dpo", micro_batch=2, seq_len=512)
    on_cpu = estimate_memory(QWEN25_05B, base)
    on_h100 = estimate_memory(QWEN25_05B, dataclasses.replace(base, gpu="H100-SXM"))
    assert "cublas_workspace" not in on_cpu.breakdown
    assert on_h100.breakdown["cublas_workspace"] == oh.cublas_workspace_bytes("H100-SXM")
    assert set(on_cpu.phases) == {"forward", "backward", "step", "reference"}
    for phase, total in on_cpu.phases.items():
        assert on_h100.phases[phase] == total + oh.cublas_workspace_bytes("H100-SXM"), phase
    assert (on_h100.phase, on_h100.allocator_bytes) == (on_cpu.phase, on_cpu.allocator_bytes)


def test_vllm_colocated_takes_its_share_and_replaces_the_rollout():
    base = TrainSetup(workload="grpo", micro_batch=8, grad_accum=4, seq_len=768, completion_len=512)
    hf_generate = estimate_memory(QWEN25_05B, base)
    vllm = estimate_memory(QWEN25_05B, dataclasses.replace(base, vllm_gpu_memory_utilization=0.3))
    assert "rollout" in hf_generate.phases and "rollout" not in vllm.phases
    assert vllm.outside_bytes(79.6)["vllm_reserved"] == int(0.3 * 79.6 * GIB)


def test_steps_per_generation_sizes_the_generation_batch():
    base = TrainSetup(workload="grpo", micro_batch=8, grad_accum=4, seq_len=768, completion_len=512)
    default = estimate_memory(QWEN25_05B, base).phases["rollout"]
    more = estimate_memory(QWEN25_05B, dataclasses.replace(base, steps_per_generation=8)).phases[
        "rollout"
    ]
    assert more > default  # TRL generates micro x steps_per_generation completions at once


def test_precomputed_reference_drops_the_reference_model():
    base = TrainSetup(workload="dpo", micro_batch=1, seq_len=1024, stage=2, world_size=8)
    ref = estimate_memory(QWEN25_7B, base)
    pre = estimate_memory(QWEN25_7B, dataclasses.replace(base, precompute_ref=True))
    assert (
        ref.breakdown["reference_model"] == 2 * QWEN25_7B.params
    )  # full bf16 replica below ZeRO-3
    assert "reference_model" not in pre.breakdown and "reference" not in pre.phases
    z3 = estimate_memory(QWEN25_7B, dataclasses.replace(base, stage=3))
    assert z3.breakdown.get("reference_model", 0) == pytest.approx(
        2 * QWEN25_7B.params / 8, rel=1e-6
    )


def test_deepspeed_runs_count_the_in_training_context_plain_runs_the_before_model_one():
    base = TrainSetup(stage=2, world_size=8, micro_batch=1, seq_len=1024)
    table = oh.CUDA_CONTEXT_IN_DEEPSPEED_TRAINING_GIB
    zero2 = estimate_memory(QWEN25_7B, base)
    zero3 = estimate_memory(QWEN25_7B, dataclasses.replace(base, stage=3))
    plain = estimate_memory(QWEN25_7B, dataclasses.replace(base, stage=0))
    deepspeed0 = estimate_memory(QWEN25_7B, dataclasses.replace(base, stage=0, stack="deepspeed"))
    assert zero2.context_bytes == int(table["zero0-2"] * GIB) == deepspeed0.context_bytes
    assert zero3.context_bytes == int(table["zero3"] * GIB)
    assert plain.context_bytes == oh.CUDA_CONTEXT_BYTES < zero2.context_bytes < zero3.context_bytes
    assert zero3.outside_bytes(79.6)["cuda_context"] == zero3.context_bytes


@pytest.mark.gpu
def test_a_plain_training_step_holds_no_more_outside_the_allocator_than_context_and_margin():
    """On a CUDA machine (``pytest -m gpu``): after a few AdamW steps of a small decoder without
    DeepSpeed, what the device has in use beyond everything the caching allocator ever reserved
    stays within the before-model context plus the safety margin, which is all zerofit counts
    for such a run. If this fails, plain runs need their own in-training measurement."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    transformers = pytest.importorskip("transformers")
    from memory_shapes import TINY_DECODER

    config = transformers.Qwen2Config(**{**TINY_DECODER, "hidden_size": 512, "head_dim": 128})
    model = transformers.AutoModelForCausalLM.from_config(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, config.vocab_size, (2, 512), device="cuda")
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    outside = (total - free) - torch.cuda.max_memory_reserved()
    assert outside <= oh.CUDA_CONTEXT_BYTES + oh.DEFAULT_SAFETY_MARGIN_GIB * GIB


def test_grads_still_held_at_the_step_peak_are_no_free_range():
    """ZeRO-2's grad partition is allocated in backward and freed only after the step's fp32 copy:
    at a step peak it is live, so the allocator term does not count it as a freed range."""
    setup = TrainSetup(
        stage=2, world_size=2, micro_batch=1, seq_len=512, gradient_checkpointing=True
    )
    est = estimate_memory(QWEN25_7B, setup)
    assert est.phase == "step" and "gradients" in est.breakdown
    rounding = oh.allocator_fragmentation_bytes(QWEN25_7B, True, 0)
    freed = est.allocator_bytes - rounding
    assert 0 < freed < est.breakdown["gradients"]


def test_tight_fit_threshold_is_the_median_fragmentation_of_public_oom_messages():
    """Each OOM message states the memory reserved but unallocated after the allocator released
    every free segment: the fragmentation when the run died. One value per run (two ranks of one
    run count once), training only; the threshold is their median."""
    import json
    import statistics
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "oom_messages_outside_allocator.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = {}
    for r in records:
        if r["during_training"]:
            runs.setdefault(min(r["id"], r["same_run"] or r["id"]), r["reserved_unallocated_gib"])
    assert len(runs) == 24
    median = statistics.median(runs.values())
    assert oh.FRAGMENTATION_AT_OOM_MEDIAN_GIB == pytest.approx(median, abs=0.005)
    assert oh.tight_fit_note(median + 0.01) is None
    note = oh.tight_fit_note(0.3)
    assert "0.3 GiB to spare" in note and "expandable_segments:True" in note
