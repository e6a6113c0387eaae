"""Answers -> Plan -> {filename: text}: the files `zerofit config` writes, as deterministic text."""

from __future__ import annotations

import json

from zerofit.configs.accelerate_yaml import DS_CONFIG_FILE, render_accelerate_config
from zerofit.configs.deepspeed_json import build_zero_config
from zerofit.errors import ZerofitError
from zerofit.planning.answers import Answers, render_answers

FILE_NAMES = ("ds_config.json", "accelerate.yaml", "answers.yaml")  # every file it may write


def render_zero_config(plan) -> str:
    """DeepSpeed JSON text: indent 2, key order as built, trailing newline (byte-stable)."""
    return json.dumps(build_zero_config(plan), indent=2) + "\n"


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

    Raises ZerofitError for a plan whose files `zerofit check` would reject (see refuse_unrunnable).
    """
    from zerofit.planning.plan import plan as make_plan

    p = make_plan(answers)
    refuse_unrunnable(p)
    return p, render_files(p, ds_config_file=ds_config_file)


def refuse_unrunnable(plan) -> None:
    """Raise ZerofitError when the plan's files cannot run on its GPU (what `check --gpu` rejects).

    bf16 on a GPU without bf16 (V100, T4): DeepSpeed's bf16 engine needs native bf16 kernels, and
    `zerofit check --gpu` reports the same file as an error, so never write it.
    """
    if plan.precision == "bf16" and not plan.gpu.bf16:
        raise ZerofitError(
            "precision",
            f"bf16 is not supported by {plan.gpu.name}",
            "use --precision fp16 (or leave --precision unset: fp16 with loss " "scaling)",
        )
