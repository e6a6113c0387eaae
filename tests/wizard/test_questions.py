"""The wizard's questions as data: when / validate / defaults, no terminal involved.

Run: .venv/bin/python -m pytest tests/wizard/test_questions.py -q
"""

from __future__ import annotations

import socket

import pytest

from zerofit.planning.answers import Answers, answers_from_dict
from zerofit.wizard.questions import (
    AUTO,
    apply_defaults,
    build_questions,
    default_for,
    gpu_choices,
    int_text,
    message_for,
    nvme_question,
    override_question,
    settle,
    shown_default,
    start_answers,
    still_valid,
)


def qmap(base: Answers | None = None, detected=(None, 0)):
    return {q.name: q for q in build_questions(base or Answers(), detected)}


def answers(**changes) -> dict:
    return {**start_answers(Answers()), **changes}


def test_order_follows_the_issue():
    names = [q.name for q in build_questions(Answers())]
    assert names == [
        "model",
        "gpu",
        "gpus_per_node",
        "num_nodes",
        "main_process_ip",
        "main_process_port",
        "launcher",
        "host_ram_gib",
        "inter_node_gbps",
        "workload",
        "num_generations",
        "completion_len",
        "seq_len",
        "target_len",
        "global_batch",
        "precision",
        "stack",
        "loss_kernel",
        "padding",
        "weights_dtype",
        "autocast",
    ]


def test_autocast_is_asked_only_when_it_changes_the_plan():
    """A plain loop without autocast saves fp32 copies for peft's fp32 adapters: asked where
    that moves the plan (a LoRA fine-tune of a 3B model on one L40S: the micro batch), not
    where every answer gets the same plan (0.5B on one H100)."""
    q = qmap()["autocast"]
    assert q.when(answers()) is False
    tight = answers(
        gpu="L40S", model="qwen2.5-3b", seq_len=2048, finetuning="lora", weights_dtype="bf16"
    )
    assert q.when(tight) is True
    assert q.convert("plain") is False and q.convert("autocast") is True


def test_stack_is_asked_only_when_it_changes_the_plan():
    q = qmap()["stack"]
    assert q.when(answers()) is False  # 0.5B on one H100: every stack gets the same plan
    # 1.5B on one L40S: the stacks' optimizers hold different step temporaries
    # (memory/optimizers.py): DeepSpeed's own optimizer leaves stage 0 without room, the
    # others fit it
    tight = answers(gpu="L40S", model="qwen2.5-1.5b", seq_len=2048)
    assert q.when(tight) is True


def test_loss_kernel_is_asked_only_when_it_changes_the_plan():
    q = qmap()["loss_kernel"]
    # 0.5B on one H100 at 2048 tokens: the fp32 logits of 151,936 entries per token hold the
    # micro batch at 8, TRL 1.16's fused head and Liger never build them and allow 16
    free = answers()
    assert q.when(free) is True
    # a global batch of 8 on one GPU caps the micro batch at 8 whatever the loss builds
    assert q.when(answers(global_batch=8)) is False
    assert q.convert("default") is None and q.convert("trl_fused") == "trl_fused"
    assert default_for(q, free) == "default"
    assert default_for(qmap(Answers(loss_kernel="liger"))["loss_kernel"], free) == "liger"


def test_defaults_walk_stores_what_a_picked_choice_would():
    """``--defaults`` takes each select's default as if it were picked: "padded" and "default"
    are choices, stored as the Answers values the prompt's convert gives them."""
    tight = answers(gpu="A100-40GB", seq_len=2048, gpus_per_node=1)
    assert qmap()["padding"].when(tight) and qmap()["loss_kernel"].when(tight)
    walked = apply_defaults(build_questions(Answers()), tight)
    assert walked["padding"] is None and walked["loss_kernel"] is None
    answers_from_dict(walked)  # valid Answers


def test_weights_dtype_is_asked_only_when_it_changes_the_plan():
    q = qmap()["weights_dtype"]
    assert q.when(answers()) is False  # 0.5B on one H100: stage 0 fits either way
    # 1.5B on one L4: fp32 weights + Adam + grads (16 B/param) do not fit 22 GiB without
    # DeepSpeed, bf16 ones (8 B/param) do (memory/states.py plain_resident_states)
    tight = answers(model="qwen2.5-1.5b", gpu="L4", seq_len=1024)
    assert q.when(tight) is True
    assert q.when({**tight, "precision": "fp16"}) is False  # bf16 weights need bf16 compute
    assert q.convert("fp32") is None and q.convert("bf16") == "bf16"


def test_padding_is_asked_only_when_it_changes_the_plan():
    q = qmap()["padding"]
    assert q.when(answers()) is False  # 0.5B on one H100: the same plan padded or packed
    # 0.5B on one A100 40GB at 2048 tokens: the micro batch the planner can afford differs
    # once every sdpa layer keeps a mask copy and K/V repeated to all heads
    tight = answers(gpu="A100-40GB", seq_len=2048, gpus_per_node=1)
    assert q.when(tight) is True
    assert q.convert("packed") is False and q.convert("padded") is None
    assert default_for(qmap(Answers(padding=False))["padding"], tight) == "packed"
    assert qmap(Answers(padding=True))["padding"].convert("padded") is True


@pytest.mark.parametrize("name", ["main_process_ip", "main_process_port", "launcher"])
def test_multi_node_questions_only_for_more_than_one_node(name):
    q = qmap()[name]
    assert q.when(answers(num_nodes=1)) is False
    assert q.when(answers(num_nodes=2)) is True


@pytest.mark.parametrize("name", ["num_generations", "completion_len"])
def test_grpo_questions_only_for_grpo(name):
    q = qmap()[name]
    assert [q.when(answers(workload=w)) for w in ("sft", "dpo", "grpo")] == [False, False, True]


def test_int_validation_messages():
    v = int_text(1, 64)
    assert v("8", {}) is True
    assert v(" 8 ", {}) is True
    assert v("", {}) == "enter a whole number from 1"
    assert v("8x", {}) == "enter a whole number"
    assert v("0", {}) == "use 1-64"
    assert v("65", {}) == "use 1-64"
    assert int_text(blank_ok=True)("", {}) is True


def test_port_range():
    v = qmap()["main_process_port"].validate
    assert v("29500", {}) is True
    assert v("70000", {}) == "use 1-65535"


def test_host_validation():
    v = qmap()["main_process_ip"].validate
    assert v("10.0.0.1", {}) is True
    assert v("node-001.cluster", {}) is True
    assert v("fe80::1", {}) is True
    assert "no scheme, port" in v("10.0.0.1:29500", {})
    assert "no scheme, port" in v("tcp://10.0.0.1", {})
    assert "main node's address" in v("", {})


def test_model_validation(tmp_path):
    v = qmap()["model"].validate
    assert v("qwen2.5-7b", {}) is True
    assert v("Qwen/Qwen2.5-7B", {}) is True  # hub ids are resolved after Enter, not while typing
    assert v(str(tmp_path), {}) is True
    assert v(str(tmp_path / "missing" / "config.json"), {}).startswith("no such file or directory")
    assert v("my model", {}) == "no spaces in a model reference"
    assert v("", {}).startswith("enter a built-in name")


def test_target_len_is_asked_for_encoder_decoders_only(tmp_path):
    """T5's targets have their own length (the decoder's and the loss's); a decoder reads one
    sequence. Blank keeps the sequence length."""
    from transformers import T5Config

    T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4).save_pretrained(tmp_path)
    q = qmap()["target_len"]
    assert q.when(answers(model=str(tmp_path / "config.json"))) is True
    assert q.when(answers(model="qwen2.5-0.5b")) is False
    assert q.validate("", {}) is True and q.convert("") is None
    assert q.validate("128", {}) is True and q.convert("128") == 128
    assert q.validate("0", {}) is not True


def test_seq_len_must_leave_room_for_the_prompt_in_grpo():
    v = qmap()["seq_len"].validate
    assert (
        v("256", answers(workload="grpo", completion_len=256))
        == "must exceed the completion length 256 (prompt + completion)"
    )
    assert v("257", answers(workload="grpo", completion_len=256)) is True
    assert v("256", answers(workload="sft", completion_len=256)) is True
    assert v("8", answers()) == "use 16-1048576"


def test_global_batch_arithmetic():
    v = qmap()["global_batch"].validate
    assert v("", answers(gpus_per_node=8)) is True  # blank: planner picks
    assert v("64", answers(gpus_per_node=8, num_nodes=2)) is True
    assert (
        v("60", answers(gpus_per_node=8, num_nodes=2))
        == "must be a multiple of the 16 GPUs (micro batch x accumulation x GPUs)"
    )
    assert (
        v("48", answers(gpus_per_node=8, workload="grpo", num_generations=32))
        == "must be a multiple of num_generations (32)"
    )
    assert qmap()["global_batch"].convert("") is None
    assert qmap()["global_batch"].convert("64") == 64


def test_precision_default_follows_the_gpu():
    q = qmap()["precision"]
    assert default_for(q, answers(gpu="H100-SXM")) == "bf16"
    assert default_for(q, answers(gpu="V100-32GB")) == "fp16"
    assert message_for(q, answers(gpu="V100-32GB")) == "Precision (V100-32GB has no bf16)"
    # a precision the user gave wins over the GPU's
    assert (
        default_for(qmap(Answers(precision="fp32"))["precision"], answers(gpu="H100-SXM")) == "fp32"
    )


def test_seq_len_default_grows_past_a_long_completion():
    q = qmap()["seq_len"]
    assert default_for(q, answers(workload="grpo", completion_len=4096)) == 4608
    assert default_for(q, answers(workload="grpo", completion_len=256)) == 2048


def test_detected_gpu_is_named_in_the_messages():
    q = qmap(Answers(gpu="A100-80GB", gpus_per_node=4), detected=("A100-80GB", 4))
    assert q["gpu"].message == "GPU (detected 4 x A100-80GB)"
    assert q["gpu"].default == "A100-80GB"
    assert q["gpus_per_node"].message == "GPUs per node (detected 4)"
    assert q["gpus_per_node"].default == 4


def test_gpu_alias_default_is_the_catalog_key():
    assert qmap(Answers(gpu="h100"))["gpu"].default == "H100-SXM"
    assert gpu_choices()[0] == ("B200", "B200       NVIDIA B200 180GB, 178.4 GiB, bf16")


def test_apply_defaults_is_the_default_walk():
    base = Answers(
        model="qwen2.5-7b", workload="grpo", num_generations=4, global_batch=32, gpus_per_node=8
    )
    got = apply_defaults(build_questions(base), start_answers(base))
    assert (
        answers_from_dict(got) == base
    )  # precision: the GPU's default, so it stays "follow the GPU"


def test_apply_defaults_skips_questions_whose_when_is_false():
    base = Answers(main_process_ip="10.1.1.1")
    got = apply_defaults(build_questions(base), start_answers(base))
    assert got["main_process_ip"] == "10.1.1.1" and got["num_nodes"] == 1


def test_invalid_prefilled_global_batch_falls_back_to_blank():
    base = Answers(global_batch=12, gpus_per_node=8)  # 12 is not a multiple of 8 GPUs
    assert default_for(qmap(base)["global_batch"], start_answers(base)) is None


def test_settle_keeps_precision_unset_only_when_it_matches_the_gpu():
    start = start_answers(Answers())
    assert settle({**start, "precision": "bf16"}, start)["precision"] is None
    assert settle({**start, "precision": "fp32"}, start)["precision"] == "fp32"
    assert settle({**start, "gpu": "V100-32GB", "precision": "bf16"}, start)["precision"] == "bf16"
    given = start_answers(Answers(precision="bf16"))
    assert (
        settle({**given, "precision": "bf16"}, given)["precision"] == "bf16"
    )  # the user's own stays


def test_override_questions():
    stage = override_question("stage", None, 2)
    assert stage.default == AUTO
    assert stage.choices[0] == (AUTO, "auto (planner decides; now 2)")
    assert stage.convert(AUTO) is None and stage.convert(3) == 3
    gc = override_question("gradient_checkpointing", False, False)
    assert gc.default is False and [v for v, _ in gc.choices] == [AUTO, True, False]
    micro = override_question("micro_batch", None, 4)
    assert stage.message == "New ZeRO stage"
    assert micro.kind == "text" and micro.convert("") is None and micro.convert("2") == 2
    assert micro.validate("0", {}) == "use 1-4096"
    nvme = nvme_question(None)
    assert (
        nvme.default == "/local_nvme"
        and nvme.validate("nvme", {}) == "an absolute path, e.g. /local_nvme"
    )


def test_the_nodes_ram_is_asked_when_the_plan_is_for_other_machines():
    """Offload is budgeted against the training nodes' RAM: this machine's MemTotal (what
    host_ram_gib None means) says nothing about a cluster or a remote main node."""
    q = qmap()["host_ram_gib"]
    assert q.when(answers()) is False  # one node, this machine: its own MemTotal is right
    assert q.when(answers(num_nodes=2)) is True
    assert q.when(answers(main_process_ip="10.200.0.1")) is True  # one node elsewhere
    assert q.when(answers(main_process_ip="localhost")) is False
    assert q.when(answers(main_process_ip=socket.gethostname())) is False
    assert q.validate("1024", {}) is True and q.validate("1.5e3", {}) is True
    assert q.validate("", {}).startswith("enter the RAM of one training node in GiB")
    assert q.validate("0", {}).startswith("use 1-")
    assert q.convert(" 512 ") == 512.0
    assert default_for(q, answers()) is None  # no guess: --defaults writes what `config` does
    assert default_for(qmap(Answers(host_ram_gib=768.0))["host_ram_gib"], answers()) == 768.0


def test_every_question_has_a_short_label_for_the_plan_menu():
    assert all(q.label for q in build_questions(Answers()))


def test_shown_default_is_the_choice_or_text_that_gives_the_answer():
    qs = qmap(Answers(padding=True))
    assert shown_default(qs["padding"], True) == "padded"
    assert shown_default(qs["padding"], False) == "packed"
    assert shown_default(qs["loss_kernel"], None) == "default"
    assert shown_default(qs["weights_dtype"], None) == "fp32"
    assert shown_default(qs["global_batch"], None) == ""
    assert shown_default(qs["num_nodes"], 4) == "4"


def test_still_valid_rechecks_an_answer_against_the_others():
    q = qmap()["global_batch"]
    assert still_valid(q, answers(global_batch=16, gpus_per_node=8, num_nodes=2)) is True
    assert still_valid(q, answers(global_batch=16, gpus_per_node=8, num_nodes=4)) is False
    assert still_valid(q, answers(global_batch=None, gpus_per_node=8, num_nodes=4)) is True
