"""Planner decisions on a few scenarios, overrides, batch arithmetic, suggestions when nothing fits.

Run: .venv/bin/python -m pytest tests/planning/test_plan.py -q   (~2 s)
"""
from __future__ import annotations

import pytest

from memory_shapes import LLAMA31_70B, QWEN25_05B, QWEN25_72B, QWEN25_7B
from zerofit.planning.answers import Answers
from zerofit.errors import ZerofitError
from zerofit.planning.plan import plan


def test_small_model_one_h100_picks_low_stage_without_offload():
    p = plan(Answers(gpu="H100-SXM", seq_len=2048), model=QWEN25_05B)
    assert p.fits and p.stage <= 2
    assert (p.offload_optimizer, p.offload_param, p.gradient_checkpointing) == ("none", "none", False)
    assert p.peak_gib + 0.5 <= 79.6 * 0.9
    reasons = {d.field: d.reason for d in p.decisions}
    assert "GiB" in reasons["stage"] and reasons["precision"].startswith("bf16")
    # global batch not given: ~256k tokens at seq 2048 -> 128 sequences, said so
    assert p.global_batch == 128 and "not given" in reasons["global_batch"]


def test_70b_on_8_a100_needs_stage3():
    p = plan(Answers(gpu="A100-80GB", gpus_per_node=8, seq_len=2048, global_batch=64), model=LLAMA31_70B)
    assert p.fits and p.stage == 3
    # model states alone: 16 B x 70.6B / 8 = 131 GiB > 71 GiB, so the optimizer goes to CPU
    assert p.offload_optimizer == "cpu" and p.cpu_gib > 1000
    no_offload_s3 = [a for a in p.alternatives if a.stage == 3 and a.offload_optimizer == "none"]
    assert no_offload_s3 and not any(a.fits for a in no_offload_s3)


def test_72b_on_one_a10_does_not_fit_and_suggests():
    p = plan(Answers(gpu="A10", seq_len=2048), model=QWEN25_72B)
    assert not p.fits
    assert p.decisions[2].field == "fits" and "nothing fits" in p.decisions[2].reason
    text = " | ".join(p.suggestions)
    assert "nodes" in text and "CPU RAM" in text


def test_overrides_are_honoured():
    a = Answers(gpu="H100-SXM", gpus_per_node=8, stage=3, gradient_checkpointing=True, micro_batch=2,
                global_batch=64, offload_optimizer="none")
    p = plan(a, model=QWEN25_7B)
    assert (p.stage, p.gradient_checkpointing, p.micro_batch, p.offload_optimizer) == (3, True, 2, "none")
    assert p.grad_accum == 4 and all("set by you" in d.reason for d in p.decisions
                                     if d.field in ("stage", "gradient_checkpointing", "micro_batch"))
    # alternatives still list every stage x offload x checkpointing combination
    assert len({(x.stage, x.offload_optimizer, x.offload_param, x.gradient_checkpointing)
                for x in p.alternatives}) == 16


def test_offload_param_needs_stage3():
    with pytest.raises(ZerofitError):
        plan(Answers(stage=2, offload_param="cpu"), model=QWEN25_05B)


@pytest.mark.parametrize("world, global_batch", [(1, 7), (8, 64), (16, 48), (4, 4), (8, None)])
def test_batch_arithmetic_is_consistent(world, global_batch):
    p = plan(Answers(gpu="H100-SXM", gpus_per_node=world, global_batch=global_batch, seq_len=1024), model=QWEN25_7B)
    assert p.global_batch == p.micro_batch * p.grad_accum * p.world_size
    if global_batch:
        assert p.global_batch == global_batch


def test_global_batch_not_divisible_by_gpus_is_an_error():
    with pytest.raises(ZerofitError, match="global_batch"):
        plan(Answers(gpus_per_node=8, global_batch=12), model=QWEN25_05B)


def test_grpo_batch_counts_completions():
    p = plan(Answers(workload="grpo", gpus_per_node=2, seq_len=512, completion_len=256, num_generations=8),
             model=QWEN25_05B)
    assert p.global_batch % 8 == 0 and p.global_batch % 2 == 0
    assert p.global_batch == p.micro_batch * p.grad_accum * 2


def test_fp16_on_a_gpu_without_bf16():
    p = plan(Answers(gpu="V100-32GB", seq_len=1024), model=QWEN25_05B)
    assert p.precision == "fp16"


def test_more_memory_pressure_never_lowers_the_stage():
    stages = [plan(Answers(gpu="H100-SXM", gpus_per_node=8, seq_len=1024, global_batch=64), model=m).stage
              for m in (QWEN25_05B, QWEN25_7B, LLAMA31_70B)]
    assert stages == sorted(stages)


def test_grpo_group_of_one_is_refused():
    """A GRPO group of 1 has nothing to compare: advantages 0/NaN, so the plan is refused (13.8)."""
    from zerofit.planning.answers import validate_answers

    with pytest.raises(ZerofitError, match="num_generations"):
        validate_answers(Answers(workload="grpo", num_generations=1))
