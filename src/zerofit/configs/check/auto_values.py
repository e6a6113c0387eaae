"""check, "auto" per client: who fills each "auto" value of a DeepSpeed JSON, and what must match.

No library states this in a form check can read: the data is in ``facts`` (transformers'
HfTrainerDeepSpeedConfig and accelerate's fill lists), the rules here.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from zerofit.configs.check.facts import (
    ACCELERATE_FILLED,
    AUTO_STAND_IN,
    DROPS_AUTO,
    HF_FILLED,
    TRAINER_MATCH,
)
from zerofit.configs.check.problems import Problem

_UNKNOWN_CLIENT = '"auto" is filled only by HF Trainer / TRL'


def check_autos(cfg: dict, name: str, client: str | None) -> list[Problem]:
    """Every "auto" value judged by who fills it; one merged warning when the client is unknown."""
    return _merge_unknown_client_warnings(_autos_under(cfg, name, "", client), name)


def _autos_under(node: dict, name: str, prefix: str, client: str | None) -> list[Problem]:
    problems: list[Problem] = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            problems += _autos_under(value, name, path + ".", client)
        elif value == "auto":
            problems += _judge_auto(f"{name}:{path}", path, client)
    return problems


def _merge_unknown_client_warnings(problems: list[Problem], name: str) -> list[Problem]:
    """One warning per file for "auto" values with an unknown client, naming every key."""
    warned = [
        p for p in problems if p.severity == "warning" and p.message.startswith(_UNKNOWN_CLIENT)
    ]
    if len(warned) < 2:
        return problems
    keys = ", ".join(p.path.split(":", 1)[1] for p in warned)
    merged = Problem(
        f"{name}:auto",
        f"{len(warned)} values are \"auto\" ({keys}): filled only by HF Trainer / "
        "TRL / accelerate.prepare(); plain DeepSpeed rejects them",
        "pass --client trainer, accelerate or deepspeed to check for the client that runs it",
        "warning",
    )
    return [p for p in problems if p not in warned] + [merged]


def _judge_auto(where: str, path: str, client: str | None) -> list[Problem]:
    # the Trainer prepares through accelerate, so it fills accelerate's list too
    if path not in HF_FILLED and path not in ACCELERATE_FILLED:
        return [_filled_by_nobody(where, path)]
    if client == "trainer" or client == "accelerate" and path in ACCELERATE_FILLED:
        return []
    if client == "accelerate":
        message = '"auto" here is filled only by the HF Trainer / TRL, not by accelerate.prepare()'
        fix = "write the value itself, or run the file with the HF Trainer / TRL"
        return [Problem(where, message, fix)]
    if client == "deepspeed":
        return [
            Problem(
                where,
                '"auto" is filled only by HF Trainer / TRL / accelerate; plain DeepSpeed '
                "(deepspeed.initialize, the deepspeed launcher) rejects it",
                "write a number (zerofit config --flavour explicit)",
            )
        ]
    return [
        Problem(
            where,
            _UNKNOWN_CLIENT + " (or accelerate.prepare() given a "
            "DataLoader); plain DeepSpeed rejects it",
            "write a number, or pass --client trainer / --client accelerate for who runs it",
            "warning",
        )
    ]


def _filled_by_nobody(where: str, path: str) -> Problem:
    if path == "zero_optimization.stage":
        return Problem(
            where,
            '"auto" is filled by no client: DeepSpeed drops it and runs stage 0 (ZeRO off)',
            "write the stage: 1, 2 or 3",
        )
    if path.startswith(DROPS_AUTO):
        return Problem(
            where,
            '"auto" is filled by no client for this key: DeepSpeed drops it and uses its default',
            "write the value itself (or remove the key)",
            "warning",
        )
    return Problem(
        where,
        '"auto" is filled by no client for this key (DeepSpeed passes it on as text)',
        "write the value itself",
    )


def trainer_must_match(cfg: dict, name: str) -> list[Problem]:
    """Explicit values under the HF Trainer / TRL must equal the training arguments, or it stops."""
    needs = []
    for path, arg in TRAINER_MATCH.items():
        node: Any = cfg
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or node == "auto":
            continue
        flag = "" if node is True else "no "
        needs.append(f"{path}={json.dumps(node)} needs " + arg.format(v=node, flag=flag))
    if not needs:
        return []
    return [
        Problem(
            f"{name}:explicit",
            "the HF Trainer / TRL stop unless these explicit values equal their "
            "arguments: " + "; ".join(needs),
            'pass exactly those arguments, or write "auto" (zerofit config --flavour auto)',
            "warning",
        )
    ]


def as_filled(cfg: dict) -> dict:
    """A copy with "auto" replaced the way a client fills it and a consistent batch triple.

    Batch arithmetic is zerofit's own rule (with the fix spelled out); DeepSpeed's whole-config run
    is for everything else, so it gets micro x accumulation x world that DeepSpeed's assertion
    accepts.
    """
    out = copy.deepcopy(cfg)

    def fill(node: dict, prefix: str) -> None:
        for key, value in list(node.items()):
            path = prefix + str(key)
            if isinstance(value, dict):
                fill(value, path + ".")
            elif value == "auto":
                node[key] = AUTO_STAND_IN.get(path, 1)

    fill(out, "")
    if "train_micro_batch_size_per_gpu" in out or "gradient_accumulation_steps" in out:
        out.pop("train_batch_size", None)  # DeepSpeed derives it from micro x accumulation x world
    return out
