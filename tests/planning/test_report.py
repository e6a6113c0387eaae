"""The estimate report: the fixed defaults ``zerofit estimate`` applies, its batch arithmetic,
and ``--json`` as the report's fields.

Run: .venv/bin/python -m pytest tests/planning/test_report.py -q   (~2 s)
"""

from __future__ import annotations

import dataclasses

import pytest

from zerofit.errors import ZerofitError
from zerofit.planning.answers import Answers
from zerofit.planning.options import TrainingOption
from zerofit.planning.plan import plan
from zerofit.planning.report import (
    ESTIMATE_SPEED_KEYS,
    EstimateReport,
    build_estimate_report,
    estimate_grad_accum,
    estimate_option,
)

# what `zerofit estimate --json` has printed since the stack-aware model; scripts read these
JSON_KEYS = [
    "model",
    "activations_traced",
    "activations_basis",
    "params",
    "gpu",
    "world_size",
    "stage",
    "offload_optimizer",
    "offload_param",
    "precision",
    "micro_batch",
    "grad_accum",
    "seq_len",
    "gradient_checkpointing",
    "workload",
    "padded",
    "padding_gib",
    "peak_gib",
    "fits",
    "budget_gib",
    "peak_phase",
    "breakdown",
    "cpu_gib",
    "cuda_context_gib",
    "stack",
    "optimizer",
    "loss_path",
    "weights_dtype",
    "autocast",
    "outside_peak_gib",
    "safety_margin_gib",
    "gpu_need_gib",
    "spare_gib",
    "gpu_memory_gib",
    "fits_gpu",
    "host_ram_gib",
    "host_ram_source",
    "fits_host",
    "pin_memory",
    "cpu_gib_unpinned",
    "allocator_replay",
    "from_files",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "time_breakdown",
    "run_time_h",
    "optimizer_steps",
    "interconnect",
    "intra_node_gbps",
    "inter_node_gbps",
]


def test_the_json_is_the_report_under_todays_keys():
    report = build_estimate_report(Answers(model="qwen2.5-0.5b", host_ram_gib=64.0))
    data = report.as_json()
    assert list(data) == JSON_KEYS
    # the report's own fields, then its SpeedReport's at the top level, in estimate's order
    names = [f.name for f in dataclasses.fields(EstimateReport)]
    assert names[-1] == "speed" and JSON_KEYS == names[:-1] + list(ESTIMATE_SPEED_KEYS)
    assert data["from_files"] == [] and isinstance(data["breakdown"], dict)
    assert data["spare_gib"] == pytest.approx(data["budget_gib"] - data["gpu_need_gib"], abs=0.01)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.fits = False  # type: ignore[misc]


def test_plan_and_estimate_report_one_configuration_at_the_same_speed():
    """One SpeedReport, built in one place: estimate given the plan's choices reports the plan's
    step time, run length and network, each command in its own key order."""
    answers = Answers(
        model="qwen2.5-0.5b", gpus_per_node=2, host_ram_gib=64.0, dataset_tokens=10_000_000
    )
    chosen = plan(answers)
    fixed = answers.replace(
        stage=chosen.stage,
        offload_optimizer=chosen.offload_optimizer,
        offload_param=chosen.offload_param,
        gradient_checkpointing=chosen.gradient_checkpointing,
        micro_batch=chosen.micro_batch,
        global_batch=chosen.global_batch,
    )
    report = build_estimate_report(fixed)
    assert report.speed == chosen.speed and chosen.speed.run_time_h is not None
    plan_json, estimate_json = chosen.as_json(), report.as_json()
    speed_keys = list(ESTIMATE_SPEED_KEYS)
    assert {key: plan_json[key] for key in speed_keys} == {
        key: estimate_json[key] for key in speed_keys
    }
    assert list(estimate_json)[-len(speed_keys) :] == speed_keys
    assert list(plan_json)[-5:-3] == ["optimizer_steps", "run_time_h"]


def test_unset_knobs_take_the_fixed_estimate_defaults():
    assert estimate_option(Answers()) == TrainingOption(2)
    # parameters on the CPU: ZeRO-3, and DeepSpeed moves the optimizer with them
    assert estimate_option(Answers(offload_param="cpu")) == TrainingOption(3, "cpu", "cpu")
    assert estimate_option(Answers(stage=1, gradient_checkpointing=True)) == TrainingOption(
        1, gradient_checkpointing=True
    )
    with pytest.raises(ZerofitError, match="offload_param"):
        estimate_option(Answers(stage=2, offload_param="cpu"))
    with pytest.raises(ZerofitError, match="offload_optimizer"):
        estimate_option(Answers(stage=0, offload_optimizer="cpu"))


def test_accumulation_from_the_global_batch_or_the_files():
    eight = Answers(gpus_per_node=8, global_batch=64)
    assert estimate_grad_accum(eight, micro_batch=2, files={}) == 4
    with pytest.raises(ZerofitError, match="global_batch.*multiple of 16"):
        estimate_grad_accum(Answers(gpus_per_node=8, global_batch=24), micro_batch=2, files={})
    one = Answers()
    assert estimate_grad_accum(one, micro_batch=4, files={}) == 1
    assert estimate_grad_accum(one, micro_batch=4, files={"grad_accum": 8}) == 8
    assert estimate_grad_accum(one, micro_batch=4, files={"train_batch_size": 64}) == 16
    # the JSON's own gradient_accumulation_steps wins over its train batch size
    both = {"train_batch_size": 64, "grad_accum": 2}
    assert estimate_grad_accum(one, micro_batch=4, files=both) == 2


def test_the_files_settings_reach_the_estimate():
    """A reduce bucket and an accumulation from a user's DeepSpeed JSON reach the estimate (the
    ZeRO-3 backward holds the bucket in bf16); the report lists what came from files, buckets
    last."""
    answers = Answers(model="qwen2.5-0.5b", stage=3, micro_batch=4, host_ram_gib=64.0)
    files = {"buckets": {"reduce_bucket_size": 200_000_000}, "grad_accum": 8}
    from_json = build_estimate_report(answers, files)
    assert from_json.breakdown["comm_buckets"] == pytest.approx(2e8 * 2 / 2**30, abs=1e-3)
    assert from_json.grad_accum == 8
    assert from_json.from_files == ("grad_accum", "buckets")
    plain = build_estimate_report(answers)
    assert plain.breakdown.get("comm_buckets") != from_json.breakdown["comm_buckets"]


def test_zero_plus_in_a_users_json_reaches_the_estimate():
    """A DeepSpeed JSON that turns on hpZ, qwZ and qgZ (read by read_ds_config) is estimated as
    ZeRO++: on two nodes over a slow link its step is faster than plain ZeRO-3's."""
    from zerofit.memory.ds_config import read_ds_config

    zero = {
        "stage": 3,
        "zero_hpz_partition_size": 8,
        "zero_quantized_weights": True,
        "zero_quantized_gradients": True,
    }
    files = read_ds_config({"zero_optimization": zero}, hidden_size=3584)
    assert files["zero_plus"] == "hpz+qwz+qgz"
    answers = Answers(
        model="qwen2.5-7b", stage=3, gpus_per_node=8, num_nodes=2, inter_node_gbps=25.0
    )
    zero_plus = build_estimate_report(answers, files)
    plain = build_estimate_report(answers, {**files, "zero_plus": "none"})
    assert "zero_plus" in zero_plus.from_files
    assert zero_plus.speed.step_time_s < plain.speed.step_time_s
