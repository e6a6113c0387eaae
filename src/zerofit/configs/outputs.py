"""Answers -> Plan -> {filename: text}: the files `zerofit config` writes, as deterministic text."""

from __future__ import annotations

import json

from zerofit.configs.accelerate_yaml import (
    DS_CONFIG_FILE,
    quant_storage_dtype,
    render_accelerate_config,
)
from zerofit.configs.deepspeed_json import build_zero_config
from zerofit.planning.answers import Answers, render_answers

FILE_NAMES = ("ds_config.json", "accelerate.yaml", "answers.yaml")  # every file it may write


def render_zero_config(plan) -> str:
    """DeepSpeed JSON text: indent 2, key order as built, trailing newline (byte-stable).

    QLoRA under ZeRO-3: the `_comment` names the `bnb_4bit_quant_storage` the model must load
    with (accelerate_yaml.quant_storage_dtype says why)."""
    config = build_zero_config(plan)
    storage = quant_storage_dtype(plan)
    if storage and isinstance(config.get("_comment"), str):
        config["_comment"] += (
            f"; QLoRA: load with bnb_4bit_quant_storage={storage} (the compute dtype), "
            "or ZeRO-3 cannot partition the 4-bit weights"
        )
    return json.dumps(config, indent=2) + "\n"


def render_files(plan, ds_config_file: str = DS_CONFIG_FILE) -> dict[str, str]:
    """{"ds_config.json", "accelerate.yaml", "answers.yaml"} texts for ``plan``.

    A stage-0 plan runs plain DDP: its accelerate.yaml names no DeepSpeed file, so none is written.

    Args:
        plan: a ``zerofit.plan.Plan``.
        ds_config_file: how accelerate.yaml refers to the JSON; the CLI passes an absolute path,
            because accelerate opens it relative to each worker's working directory.
    """
    files = {"ds_config.json": render_zero_config(plan)} if plan.stage > 0 else {}
    files["accelerate.yaml"] = render_accelerate_config(
        plan, machine_rank=0, ds_config_file=ds_config_file
    )
    files["answers.yaml"] = render_answers(plan.answers)
    return files


def build_files(answers: Answers, ds_config_file: str = DS_CONFIG_FILE):
    """Plan ``answers`` and render its files; returns ``(plan, {filename: text})``.

    A plan whose files `zerofit check` would reject never gets here: ``Answers`` refuses bf16 on a
    GPU without it (planning/answers.py:check_hardware).
    """
    from zerofit.planning.plan import plan as make_plan

    planned = make_plan(answers)
    return planned, render_files(planned, ds_config_file=ds_config_file)

