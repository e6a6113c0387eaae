"""Memory model: calibration points, the ZeRO paper's model-state table, properties, one
spelled-out case.

Run: .venv/bin/python -m pytest tests/memory/test_estimate.py -q -s
(-s prints the calibration error table)
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import calibration_points
from memory_shapes import LLAMA31_70B, QWEN25_05B, QWEN25_7B

from zerofit.memory import overheads as oh
from zerofit.memory.ds_defaults import DEEPSPEED_DEFAULT_BUCKETS
from zerofit.memory.estimate import (
    GIB,
    TrainSetup,
    estimate_memory,
    estimate_model_states,
)

P = QWEN25_05B.params  # 494,032,768


def _setup_for(point) -> TrainSetup:
    # the calibration runs left every bucket at DeepSpeed's default (5e8 elements), on an H100
    # (its cuBLAS workspaces are in the measured peak)
    return TrainSetup(
        stage=point["stage"],
        offload_optimizer=point["offload"],
        micro_batch=point["mbs"],
        seq_len=point["seq"],
        gradient_checkpointing=point["gc"],
        buckets=DEEPSPEED_DEFAULT_BUCKETS,
        gpu="H100-SXM",
    )


def test_calibration_points_within_0_3_percent():
    """Every calibration point within 0.3 % of its measured peak (the measured peaks are
    rounded to 0.001 GiB), the cuBLAS workspaces counted; without them each is 66 MiB under."""
    points = calibration_points()
    if not points:
        pytest.skip("calibration file not present")
    rows, worst, most_under = [], 0.0, 0.0
    for pt in points:
        est = estimate_memory(QWEN25_05B, _setup_for(pt))
        err = est.peak_gib / pt["peak_alloc_gib"] - 1
        worst, most_under = max(worst, abs(err)), min(most_under, err)
        rows.append(
            f"stage {pt['stage']} offload {pt['offload']:4} seq {pt['seq']:5} mbs {pt['mbs']} "
            f"gc {pt['gc']!s:5} measured {pt['peak_alloc_gib']:7.3f} "
            f"predicted {est.peak_gib:7.3f} GiB  {err:+6.1%}  ({est.phase})"
        )
    print("\n" + "\n".join(rows) + f"\nworst |error| {worst:.1%}")
    assert worst <= 0.003 and most_under >= -0.003


def test_allocator_term_stays_inside_the_measured_reserved_gap():
    """The fragmentation term counts only unusable space inside live segments, so the allocated
    peak plus it must not exceed max_memory_reserved (which also holds wholly free segments that
    the allocator releases before an OOM); and it is never zero."""
    points = calibration_points()
    if not points:
        pytest.skip("calibration file not present")
    for pt in points:
        est = estimate_memory(QWEN25_05B, _setup_for(pt))
        reserved = pt["peak_reserved_gib"] * GIB
        assert 0 < est.allocator_bytes and est.peak_bytes + est.allocator_bytes <= reserved
        # the whole GPU-side total stays below what the device really had in use at the end
        assert est.gpu_need_bytes(79.6) <= pt["device_used_end_gib"] * GIB


def test_cuda_context_in_training_is_the_smallest_measured_gap_of_its_stage():
    """What a DeepSpeed process holds beyond everything the allocator reserved, after its steps
    (device_used_end - peak_reserved), is the context term of that stage: the smallest gap
    measured, so it never exceeds what any calibration point really held."""
    points = calibration_points()
    if not points:
        pytest.skip("calibration file not present")
    gaps: dict[str, list[float]] = {}
    for pt in points:
        key = "zero3" if pt["stage"] == 3 else "zero0-2"
        gaps.setdefault(key, []).append(pt["device_used_end_gib"] - pt["peak_reserved_gib"])
    assert set(gaps) == set(oh.CUDA_CONTEXT_IN_DEEPSPEED_TRAINING_GIB)
    for key, values in gaps.items():
        assert oh.CUDA_CONTEXT_IN_DEEPSPEED_TRAINING_GIB[key] == pytest.approx(
            min(values), abs=5e-4
        )
    for pt in points:
        est = estimate_memory(QWEN25_05B, _setup_for(pt))
        gap = (pt["device_used_end_gib"] - pt["peak_reserved_gib"]) * GIB
        assert oh.CUDA_CONTEXT_BYTES < est.context_bytes <= gap + 0.001 * GIB


# ZeRO paper, Fig. 1: Psi = 7.5B, N = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.88 GB (GB = 1e9)
@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_model_states(stage, expected_gb):
    got = estimate_model_states(7_500_000_000, stage, 64, k=12) / 1e9
    assert got == pytest.approx(expected_gb, abs=0.05)


def test_zero_paper_shape_in_full_estimate():
    # the full model keeps the paper's 2Psi + 12Psi/N + ... structure: stage 3 states shrink 64x
    s1 = estimate_memory(
        QWEN25_7B, TrainSetup(stage=3, world_size=1, buckets={"reduce_bucket_size": 0})
    )
    s64 = estimate_memory(
        QWEN25_7B, TrainSetup(stage=3, world_size=64, buckets={"reduce_bucket_size": 0})
    )
    states = ("params", "master_fp32", "optimizer_states", "gradients")
    assert sum(s1.breakdown.get(k, 0) for k in states) == pytest.approx(
        16 * QWEN25_7B.params, rel=1e-6
    )
    assert sum(s64.breakdown.get(k, 0) for k in states) == pytest.approx(
        16 * QWEN25_7B.params / 64, rel=1e-3
    )


@pytest.mark.parametrize("model", [QWEN25_05B, QWEN25_7B, LLAMA31_70B], ids=lambda m: m.name)
def test_more_gpus_never_increase_stage3_peak(model):
    peaks = [
        estimate_memory(
            model, TrainSetup(stage=3, world_size=n, micro_batch=1, seq_len=2048)
        ).peak_bytes
        for n in (1, 2, 4, 8, 16, 64, 256)
    ]
    assert peaks == sorted(peaks, reverse=True)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("seq, micro", [(512, 1), (2048, 4), (8192, 2)])
def test_checkpointing_never_increases_peak(stage, seq, micro):
    base = TrainSetup(stage=stage, world_size=8, micro_batch=micro, seq_len=seq)
    off = estimate_memory(QWEN25_7B, base).peak_bytes
    on = estimate_memory(
        QWEN25_7B, dataclasses.replace(base, gradient_checkpointing=True)
    ).peak_bytes
    assert on <= off


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_offload_moves_memory_to_cpu(stage):
    base = TrainSetup(stage=stage, world_size=8, gpus_per_node=8, micro_batch=1, seq_len=1024)
    gpu_only = estimate_memory(QWEN25_7B, base)
    off = estimate_memory(QWEN25_7B, dataclasses.replace(base, offload_optimizer="cpu"))
    assert off.peak_bytes < gpu_only.peak_bytes
    assert gpu_only.cpu_bytes == 0 and off.cpu_bytes > 0
    if stage == 3:
        both = estimate_memory(
            QWEN25_7B, dataclasses.replace(base, offload_optimizer="cpu", offload_param="cpu")
        )
        assert both.peak_bytes <= off.peak_bytes and both.cpu_bytes > off.cpu_bytes


def test_longer_sequences_and_bigger_micro_batches_cost_more():
    peaks = [
        estimate_memory(QWEN25_05B, TrainSetup(seq_len=s)).peak_bytes
        for s in (512, 1024, 2048, 4096)
    ]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    eager = estimate_memory(QWEN25_05B, TrainSetup(seq_len=4096, attention="eager")).peak_bytes
    assert eager > peaks[-1]  # s*s score/prob tensors per head and layer


def test_rl_workloads_add_their_extras():
    sft = estimate_memory(QWEN25_05B, TrainSetup(micro_batch=2, seq_len=1024))
    dpo = estimate_memory(QWEN25_05B, TrainSetup(micro_batch=2, seq_len=1024, workload="dpo"))
    assert (
        dpo.peak_bytes > sft.peak_bytes
        and "reference" in dpo.phases
        and dpo.breakdown["reference_model"] == 2 * P
    )
    grpo = estimate_memory(
        QWEN25_05B,
        TrainSetup(micro_batch=16, grad_accum=4, seq_len=320, workload="grpo", completion_len=256),
    )
    # KV cache of 64 completions x 320 tokens x 24 layers x (k, v) x 2 heads x 64 dims x 2 bytes
    assert grpo.phases["rollout"] >= 64 * 320 * 24 * 2 * 2 * 64 * 2
    assert "reference" not in grpo.phases  # grpo defaults to beta = 0, no reference model


def test_fits_and_gib_views():
    est = estimate_memory(QWEN25_05B, TrainSetup(micro_batch=2, seq_len=1024))
    assert est.fits(79.6, 0.9) and not est.fits(8.0, 0.9)
    assert est.peak_gib == pytest.approx(est.peak_bytes / GIB)
    in_peak = [v for k, v in est.breakdown_gib().items() if "not in peak" not in k]
    assert sum(in_peak) == pytest.approx(est.peak_gib, abs=0.01)


def test_known_breakdown_qwen05b_stage2_seq1024_mbs2():
    """One case spelled out. Qwen2.5-0.5B, ZeRO-2, 1 H100, bf16, seq 1024 x 2, no checkpointing
    (the first calibration point: 12.650 GiB measured)."""
    est = estimate_memory(
        QWEN25_05B,
        TrainSetup(
            stage=2, micro_batch=2, seq_len=1024, buckets=DEEPSPEED_DEFAULT_BUCKETS, gpu="H100-SXM"
        ),
    )
    assert est.phase == "forward"  # the loss path at the start of backward sets the peak
    b = est.breakdown
    assert b["params"] == 2 * P  # bf16 flat params: 988,065,536
    assert b["master_fp32"] == 4 * P  # fp32 partition: 1,976,131,072
    assert b["optimizer_states"] == 8 * P  # AdamW exp_avg + exp_avg_sq: 3,952,262,144
    # per token per layer: 2 RMSNorms (4h fp32 + 2h bf16 + 2h out) = 2*(3584+1792)+2*1792 = 14336
    # attention: q 2*896 + k,v 2*2*128 + out 2*896 + lse 4*14 = 1792+512+1792+56 = 4152
    # MLP: 4 tensors of 4864 x 2 bytes = 38912  -> 57400 per layer; final norm 4h + 2*2h = 7168
    tokens = 2 * 1024
    assert b["activations"] == tokens * (24 * 57_400 + 7_168)  # 2,836,004,864
    # loss path at the start of backward: fp32 log_softmax, its grad and the grad it makes:
    # 3 x 4 x V
    assert b["logits"] == tokens * 3 * 4 * 151_936  # 3,733,979,136
    # torch's cuBLAS workspaces, from the caching allocator: on Hopper 32 MiB (cuBLAS) + 1 MiB
    # (cuBLASLt) for each of the two threads that multiply, the forward's and autograd's
    assert b["cublas_workspace"] == 2 * (32 + 1) * 1024**2  # 69,206,016
    # 13,555,648,768 B = 12.625 GiB (12.650 measured)
    assert est.peak_bytes == 14 * P + 2_836_004_864 + 3_733_979_136 + 69_206_016


# (hidden, intermediate, vocab, micro batch, seq len): a loss-bound shape (forward peak), an
# activation-bound one (backward peak) and a short-sequence one (optimizer-step peak)
PLAIN_SHAPES = {
    "forward": (256, 704, 8000, 2, 512),
    "backward": (256, 1408, 500, 4, 512),
    "step": (512, 1408, 1000, 1, 16),
}


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("weights", ["bf16", "fp32"])
@pytest.mark.parametrize("peak", sorted(PLAIN_SHAPES))
def test_a_whole_step_without_deepspeed_matches_torch(peak, weights, checkpointing):
    """Stage 0 without DeepSpeed, the whole step of a real transformers Qwen2 on CPU (MemTracker):
    forward + loss under autocast when the weights are fp32, backward, foreach AdamW step (its
    second step, when the states exist). The estimator's peak matches within 3 %, whichever phase
    sets it: weights, grads and Adam states in the load dtype, autocast's casts, fp32 residual."""
    measured, spec, setup = _whole_step(peak, weights, checkpointing, padded=False)
    assert estimate_memory(spec, setup).peak_bytes == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("weights", ["bf16", "fp32"])
def test_a_padded_whole_step_matches_torch(weights, checkpointing):
    """The activation-bound step with its last row padded, as a collator pads a shorter
    sequence: every layer's mask copy and repeated K/V (activations.padded_attention_bytes), and
    under checkpointing the boolean mask the recompute closures hold, within 3 % of what torch
    allocates; the unpadded estimate is short of it by more than that."""
    measured, spec, setup = _whole_step("backward", weights, checkpointing, padded=True)
    assert estimate_memory(spec, setup).peak_bytes == pytest.approx(measured, rel=0.03)
    if not checkpointing:
        unpadded = estimate_memory(spec, dataclasses.replace(setup, padded=False))
        assert unpadded.peak_bytes < measured * 0.97


def _whole_step(peak: str, weights: str, checkpointing: bool, padded: bool):
    """Bytes MemTracker measured at the peak of a second training step of a real transformers
    Qwen2 of the ``peak`` shape on CPU, with the model spec and setup that describe it."""
    torch = pytest.importorskip("torch")
    from memory_probe import make_optimizer_states, tracked_peak
    from transformers import AutoConfig, AutoModelForCausalLM

    from zerofit.models.resolve import spec_from_config

    hidden, inter, vocab, micro, seq = PLAIN_SHAPES[peak]
    shape = dict(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=8 if peak != "forward" else 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=vocab,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    model = AutoModelForCausalLM.from_config(cfg).train()
    if weights == "bf16":
        model = model.to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    inputs = {"input_ids": torch.randint(0, vocab, (micro, seq))}
    inputs["labels"] = inputs["input_ids"]
    if padded:
        mask = torch.ones((micro, seq), dtype=torch.long)
        mask[-1, seq // 2 :] = 0  # the last row is half padding
        inputs["attention_mask"] = mask

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=weights == "fp32"):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    make_optimizer_states(model, optimizer)
    measured, _, _ = tracked_peak(step, model, optimizer)
    spec = spec_from_config({**shape, "model_type": "qwen2"}, "probe")
    setup = TrainSetup(
        stage=0,
        stack="accelerate",
        weights_dtype=weights,
        micro_batch=micro,
        seq_len=seq,
        gradient_checkpointing=checkpointing,
        optimizer="adamw_torch",
        padded=padded,
    )
    est = estimate_memory(spec, setup)
    print(
        f"{peak:8} {weights} ckpt={checkpointing} padded={padded}: measured {measured:,} "
        f"predicted {est.peak_bytes:,} ({est.phase})"
    )
    return measured, spec, setup
