"""Answers: the validated model, its bounds and one-line errors, the dict/YAML forms.

.venv/bin/python -m pytest tests/planning/test_answers.py -q   (~2 s)
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import yaml

from zerofit.errors import ZerofitError
from zerofit.planning.answers import (
    BOUND_REASONS,
    CHOICES,
    Answers,
    answers_from_dict,
    answers_to_dict,
    default_flavour,
    load_answers,
    render_answers,
)


def test_grpo_group_of_one_is_refused():
    """A GRPO group of 1 has nothing to compare: advantages 0/NaN, so the answers are refused."""
    with pytest.raises(ZerofitError, match="num_generations"):
        Answers(workload="grpo", num_generations=1)


@pytest.mark.parametrize(
    "field,value,limit",
    [
        ("gpus_per_node", 100_000_000, 64),
        ("num_nodes", 99999999999999999999, 4096),
        ("num_nodes", "99999999999999999999", 4096),  # as a flag gives it
        ("seq_len", 2_000_000, 1_048_576),
        ("global_batch", 10**9, 1_048_576),
        ("micro_batch", 10**6, 4096),
        ("num_generations", 5000, 1024),
        ("completion_len", 2_000_000, 1_048_576),
        ("steps_per_generation", 10**6, 4096),
        ("host_ram_gib", 191e6, 65536),
    ],
)
def test_every_count_and_size_has_an_upper_bound_named_in_the_error(field, value, limit):
    # 100000000 GPUs per node used to plan for 10 minutes and grow past 3.9 GB; the bound stops it
    # at construction, before the planner sees it
    start = time.perf_counter()
    with pytest.raises(ZerofitError) as err:
        Answers(**{field: value})
    assert time.perf_counter() - start < 1.0
    assert err.value.field == field
    assert f"is above the limit of {limit} " in str(err.value)
    assert f"use at most {limit}: {BOUND_REASONS[field]}" in err.value.fix
    assert getattr(Answers(**{field: limit}), field) == limit  # the bound itself is allowed


def test_bounds_leave_room_for_real_jobs():
    big = Answers(gpus_per_node=16, num_nodes=2048, seq_len=131072, global_batch=32768)
    assert big.world_size == 32768
    assert Answers(host_ram_gib=4096.0, micro_batch=256).micro_batch == 256


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"gpus_per_node": 0}, "gpus_per_node: 0 must be a positive integer"),
        ({"gpus_per_node": True}, "gpus_per_node: True is not a number"),
        ({"gpus_per_node": 2.5}, "gpus_per_node: 2.5 is not an integer"),
        ({"gpus_per_node": "eight"}, "gpus_per_node: 'eight' is not an integer"),
        ({"host_ram_gib": float("inf")}, "host_ram_gib: inf is not a finite number"),
        ({"host_ram_gib": "inf"}, "host_ram_gib: inf is not a finite number"),
        ({"host_ram_gib": 0}, "host_ram_gib: 0 must be positive"),
        ({"workload": "rlhf"}, "workload: 'rlhf' is not allowed (fix: use one of sft, dpo, grpo)"),
        ({"stage": 4}, "stage: 4 is not a ZeRO stage (fix: use 0, 1, 2 or 3)"),
        ({"main_process_port": 70000}, "main_process_port: 70000 is out of range (fix: use 1-"),
        ({"headroom": 1.5}, "headroom: 1.5 is out of range"),
        ({"vllm_gpu_memory_utilization": 1.0}, "vllm_gpu_memory_utilization: 1.0 is out of range"),
        ({"padding": "yes"}, "padding: 'yes' is not true/false"),
        ({"model": " "}, "model: is empty"),
        ({"model": "qwen\n2.5"}, "model: 'qwen\\n2.5' contains a control character"),
        ({"nvme_path": "/nvme\n"}, "nvme_path: '/nvme\\n' contains a control character"),
        ({"offload_optimizer": "nvme"}, "nvme_path: offload to nvme needs a path"),
        ({"gpu": "V100", "precision": "bf16"}, "precision: bf16 is not supported by NVIDIA V100"),
        ({"weights_dtype": "bf16", "precision": "fp16"}, "weights_dtype: bf16 weights cannot"),
        (
            {"gpu": "A100-80GB", "attention": "flash_attention_3"},
            "attention: flash_attention_3 runs on Hopper GPUs only (H100, H200, H800, H20), "
            "not NVIDIA A100",
        ),
        ({"gpu_per_node": 8}, "gpu_per_node: is not a known answer"),
        ({"target_len": 0}, "target_len: 0 must be a positive integer (fix: set target_len to 1"),
        ({"target_len": 2**21}, "target_len: 2097152 is above the limit of 1048576"),
    ],
)
def test_bad_answers_are_one_line_errors_naming_field_and_fix(changes, message):
    with pytest.raises(ZerofitError) as err:
        Answers(**changes)
    text = err.value.render()
    assert text.startswith(message) and "(fix: " in text and "\n" not in text


def test_flash_attention_3_is_an_answer_on_hopper_and_times_faster_there():
    """FlashAttention-3 is what transformers loads as attn_implementation="flash_attention_3";
    on an H100 the speed model times its attention faster than FlashAttention-2's."""
    from zerofit.planning.plan import plan

    base = {"gpu": "H100-SXM", "model": "qwen2.5-7b", "gpus_per_node": 8, "seq_len": 8192}
    fa2 = plan(Answers(**base, attention="flash_attention_2"))
    fa3 = plan(Answers(**base, attention="flash_attention_3"))
    assert fa3.speed.step_time_s < fa2.speed.step_time_s


def test_main_address_is_checked_like_launch_does():
    from zerofit.launch.commands import check_address

    for bad in ("not an address", "10.0.0.1\n", "node;reboot", ""):
        with pytest.raises(ZerofitError, match="is not an IP address or hostname") as err:
            Answers(main_process_ip=bad)
        assert err.value.field == "main_process_ip"
        with pytest.raises(ZerofitError):
            check_address("main_addr", bad)
    assert Answers(main_process_ip="node001.cluster").main_process_ip == "node001.cluster"
    assert Answers(main_process_ip="10.0.0.1").main_process_ip == "10.0.0.1"


def test_answers_are_frozen_and_every_copy_is_validated():
    answers = Answers(gpus_per_node=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        answers.gpus_per_node = 4  # type: ignore[misc]
    assert answers.replace(num_nodes=2).world_size == 16
    with pytest.raises(ZerofitError, match="num_nodes: 0 must be a positive integer"):
        answers.replace(num_nodes=0)
    with pytest.raises(ZerofitError, match="stage: 9 is not a ZeRO stage"):
        dataclasses.replace(answers, stage=9)
    with pytest.raises(ZerofitError, match="is not a known answer"):
        answers.replace(gpus=2)


def test_default_flavour_follows_the_stack():
    # the HF Trainer stops on explicit values that differ from TrainingArguments: "auto" for hf;
    # deepspeed.initialize takes no "auto": explicit for the others
    assert Answers().flavour == "auto" == default_flavour("hf")
    assert Answers(stack="accelerate").flavour == "explicit"
    assert Answers(stack="deepspeed").flavour == "explicit"
    assert Answers(stack="hf", flavour="explicit").flavour == "explicit"
    # a changed stack brings its own flavour, a flavour chosen against the default stays
    assert Answers().replace(stack="deepspeed").flavour == "explicit"
    assert Answers(flavour="explicit").replace(stack="accelerate").flavour == "explicit"
    assert Answers(stack="accelerate", flavour="auto").replace(stack="hf").flavour == "auto"
    assert answers_from_dict({**answers_to_dict(Answers()), "stack": "deepspeed"}).flavour == (
        "explicit"
    )


def test_flavor_is_the_written_key_and_flavour_still_reads():
    text = render_answers(Answers(stack="accelerate"))
    data = yaml.safe_load(text)
    assert data["flavor"] == "explicit" and "flavour" not in data
    assert load_answers(text) == Answers(stack="accelerate")
    assert load_answers("flavour: explicit\n").flavour == "explicit"
    assert load_answers("flavor: explicit\n").flavour == "explicit"
    with pytest.raises(ZerofitError, match="given twice"):
        answers_from_dict({"flavor": "auto", "flavour": "explicit"})


def test_yaml_round_trip_and_types_from_yaml():
    answers = Answers(model="qwen2.5-7b", gpus_per_node=8, num_nodes=2, stage=3, host_ram_gib=512)
    assert load_answers(render_answers(answers)) == answers
    # YAML gives these as text or ints; the model takes them as the field's type
    loaded = load_answers("gpus_per_node: '4'\nhost_ram_gib: 64\nmodel: 7\n")
    assert (loaded.gpus_per_node, loaded.host_ram_gib, loaded.model) == (4, 64.0, "7")
    with pytest.raises(ZerofitError, match="answers: must be a mapping"):
        load_answers("- a list\n")
    with pytest.raises(ZerofitError, match="did you mean gpus_per_node"):
        load_answers("gpus-per-node: 8\n")


def test_choices_are_the_literal_types():
    for name, choices in CHOICES.items():
        for choice in choices:
            Answers(**{name: choice, "nvme_path": "/nvme", "workload": "dpo"})


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"finetuning": "lorA"}, "finetuning: 'lorA' is not allowed (fix: use one of full, lora"),
        ({"lora_rank": 0}, "lora_rank: 0 must be a positive integer"),
        ({"lora_rank": 8192}, "lora_rank: 8192 is above the limit of 4096"),
        ({"lora_dropout": 1.0}, "lora_dropout: 1.0 is out of range (fix: use a probability"),
        ({"lora_dropout": -0.1}, "lora_dropout: -0.1 is out of range"),
        ({"lora_targets": "q_proj,,v_proj"}, "lora_targets: '' is not a module name"),
        ({"lora_targets": "q-proj"}, "lora_targets: 'q-proj' is not a module name"),
    ],
)
def test_lora_answers_are_checked_in_one_line(changes, message):
    """The adapter answers (memory/lora.py owns the choices and the targets' spelling)."""
    with pytest.raises(ZerofitError) as err:
        Answers(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_lora_defaults_are_trl_model_config_and_round_trip():
    """rank 16, dropout 0.05 (TRL's ModelConfig), all-linear; answers.yaml keeps them."""
    answers = Answers(finetuning="qlora", lora_targets="q_proj,v_proj")
    assert (answers.lora_rank, answers.lora_dropout) == (16, 0.05)
    assert Answers().finetuning == "full" and Answers().lora_targets == "all-linear"
    assert load_answers(render_answers(answers)) == answers


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"inter_node_gbps": 0}, "inter_node_gbps", "must be positive"),
        ({"inter_node_gbps": 1e9}, "inter_node_gbps", "above the limit of 100000"),
        ({"intra_node_gbps": -1.0}, "intra_node_gbps", "must be positive"),
        ({"epochs": 0}, "epochs", "must be positive"),
        ({"dataset_tokens": 0}, "dataset_tokens", "positive integer"),
        ({"interconnect": "infiniband"}, "interconnect", "use one of auto, nvlink, pcie"),
        ({"avg_seq_len": 512}, "avg_seq_len", "without dataset_samples"),
        ({"dataset_tokens": 10, "dataset_samples": 10}, "dataset_samples", "dataset_tokens"),
    ],
)
def test_the_network_and_run_answers_are_checked_in_one_line(changes, field, words):
    with pytest.raises(ZerofitError) as caught:
        Answers(**changes)
    assert caught.value.field == field and words in str(caught.value)


def test_the_network_and_run_answers_survive_answers_yaml():
    answers = Answers(
        interconnect="pcie",
        inter_node_gbps=25.0,
        dataset_samples=50_000,
        avg_seq_len=700,
        epochs=3,
    )
    assert load_answers(render_answers(answers)) == answers
