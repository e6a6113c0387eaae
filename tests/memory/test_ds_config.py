"""The user's DeepSpeed JSON / accelerate YAML as estimate inputs, read through DeepSpeed's classes.

.venv/bin/python -m pytest tests/memory/test_ds_config.py -q
"""

from __future__ import annotations

import pytest

from zerofit.cli.main import main
from zerofit.errors import ZerofitError
from zerofit.memory.ds_config import (
    load_accelerate_yaml,
    load_deepspeed_json,
    read_accelerate_config,
    read_ds_config,
)
from zerofit.memory.ds_defaults import deepspeed_default_buckets


def test_left_out_buckets_are_deepspeed_s_defaults_and_auto_is_hf_s():
    read = read_ds_config({"zero_optimization": {"stage": 2}}, 4096)
    assert read["buckets"] == deepspeed_default_buckets()
    assert read["overlap_comm"] is False and read["stage"] == 2
    auto = read_ds_config(
        {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}, "bf16": {"enabled": 1}},
        4096,
    )
    assert auto["buckets"]["reduce_bucket_size"] == 4096**2 and auto["overlap_comm"] is True


def test_memory_efficient_linear_is_deepspeeds_default_unless_turned_off():
    """zero.Init swaps F.linear for zero3_linear_wrap while DeepSpeedZeroConfig's
    memory_efficient_linear is on (its default); a JSON may turn it off."""
    assert read_ds_config({"zero_optimization": {"stage": 3}}, 1024)["memory_efficient_linear"]
    off = {"zero_optimization": {"stage": 3, "memory_efficient_linear": False}}
    assert read_ds_config(off, 1024)["memory_efficient_linear"] is False


def test_offload_optimizer_and_precision():
    read = read_ds_config(
        {
            "zero_optimization": {
                "stage": 2,
                "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "pin_memory": False},
                "offload_param": {"device": "cpu"},
            },
            "fp16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {}},
            "gradient_accumulation_steps": 4,
        },
        1024,
    )
    assert (read["offload_optimizer"], read["offload_param"]) == ("nvme", "none")  # stage < 3
    assert read["nvme_path"] == "/nvme" and read["pin_optimizer_offload"] is False
    assert (read["precision"], read["grad_accum"], read["optimizer"]) == ("fp16", 4, "ds_cpu_adam")


def test_deepspeed_s_refusal_is_one_error():
    with pytest.raises(ZerofitError) as raised:
        read_ds_config({"zero_optimization": {"stage": 2, "overlap_com": True}}, 1024)
    assert raised.value.field == "zero_optimization" and "DeepSpeed rejects it" in str(raised.value)


def test_fsdp_is_refused_not_estimated_as_zero():
    fsdp = {"distributed_type": "FSDP", "num_processes": 8, "fsdp_config": {}}
    with pytest.raises(ZerofitError) as raised:
        read_accelerate_config(fsdp)
    assert raised.value.field == "distributed_type" and "FSDP" in raised.value.problem


def test_estimate_of_an_fsdp_yaml_is_one_line(tmp_path, capsys):
    path = tmp_path / "fsdp.yaml"
    path.write_text(
        "distributed_type: FSDP\nnum_processes: 8\n"
        "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
    )
    code = main(["estimate", "--model", "qwen2.5-0.5b", "--accelerate-config", str(path)])
    captured = capsys.readouterr()
    assert code == 2 and "ZeRO" not in captured.out
    [line] = captured.err.strip().splitlines()
    assert "distributed_type: FSDP is not modelled" in line and "--stage 3" in line


def test_unreadable_texts_are_one_error():
    for load, text in (
        (load_deepspeed_json, "[" * 5000),
        (load_deepspeed_json, "{oops"),
        (load_accelerate_yaml, "a: " + "[" * 5000 + "]" * 5000),
        (load_accelerate_yaml, "a: [b"),
    ):
        with pytest.raises(ZerofitError) as raised:
            load(text, "--config", "c.txt")
        assert raised.value.field == "--config"
        assert raised.value.problem.startswith("c.txt is not valid ")
    assert load_accelerate_yaml("num_processes: 2", "--config", "a.yaml") == {"num_processes": 2}


def test_zero_plus_keys_become_the_setups_zero_plus_at_stage_3_only():
    """A user's ZeRO++ keys (DeepSpeedZeroConfig's ``zero_hpz_partition_size``,
    ``zero_quantized_weights``, ``zero_quantized_gradients``) reach TrainSetup.zero_plus; below
    stage 3 DeepSpeed ignores them, and a block without them says nothing."""
    zero_plus = {
        "zero_hpz_partition_size": 8,
        "zero_quantized_weights": True,
        "zero_quantized_gradients": True,
    }
    read = read_ds_config({"zero_optimization": {"stage": 3, **zero_plus}}, 4096)
    assert read["zero_plus"] == "hpz+qwz+qgz"
    hpz_only = {"stage": 3, "zero_hpz_partition_size": 8}
    assert read_ds_config({"zero_optimization": hpz_only}, 4096)["zero_plus"] == "hpz"
    weights_only = {"stage": 3, "zero_quantized_weights": True}
    assert read_ds_config({"zero_optimization": weights_only}, 4096)["zero_plus"] == "qwz"
    assert "zero_plus" not in read_ds_config({"zero_optimization": {"stage": 3}}, 4096)
    stage2 = read_ds_config({"zero_optimization": {"stage": 2, **zero_plus}}, 4096)
    assert "zero_plus" not in stage2
