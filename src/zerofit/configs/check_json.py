"""check, the DeepSpeed JSON rules: keys, values, "auto" per client, batch arithmetic, precision.

The top level is checked against ``check_tables.DS_TOP`` (DeepSpeed has no class for it: it reads
known keys and ignores the rest); the sections DeepSpeed validates with its own classes go through
``check_ecosystem`` when DeepSpeed imports, else through the fallback tables.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from zerofit.configs.check_problem import (
    Problem,
    is_int,
    not_a_mapping,
    type_problem,
    unknown_key,
    want,
)
from zerofit.configs.check_tables import ACCELERATE_FILLED, DS_SECTIONS, DS_TOP, HF_FILLED


def check_deepspeed(
    cfg: dict,
    name: str = "ds_config.json",
    world: int | None = None,
    gpu_bf16: bool | None = None,
    trainer: bool = False,
    client: str | None = None,
    use_libraries: bool = True,
) -> list[Problem]:
    """Problems in one DeepSpeed config dict (``world``: total processes, when known).

    ``client`` as in ``check_files``; ``use_libraries`` False forces the fallback tables.
    """
    if not isinstance(cfg, dict):
        return [not_a_mapping(name)]
    client = "trainer" if trainer and client is None else client
    if use_libraries:
        from zerofit.configs.check_ecosystem import deepspeed_version

        use_libraries = deepspeed_version() is not None
    # DeepSpeed has no class for the top level (it reads known keys and ignores the rest, so a
    # typo there is silently lost): the top level is always checked against DS_TOP, which
    # tests/configs/test_check.py keeps equal to the names DeepSpeed's source reads.
    problems = _check_keys(cfg, DS_TOP, name, "", descend=not use_libraries)
    if use_libraries:
        from zerofit.configs.check_ecosystem import check_deepspeed_sections

        problems += check_deepspeed_sections(cfg, name)
    removed = set()
    if use_libraries:
        from zerofit.configs.check_ecosystem import removed_top_level_keys

        removed = removed_top_level_keys()
    kept = {
        k: v for k, v in cfg.items() if k not in removed
    }  # a removed block is reported once, whole
    problems += _merge_auto_warnings(_check_autos(kept, name, "", client), name)
    zero = cfg.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    stage = zero.get("stage", 0)
    for section in ("offload_optimizer", "offload_param"):
        block = zero.get(section)
        if not isinstance(block, dict):
            continue
        device = block.get("device", "none")
        where = f"{name}:zero_optimization.{section}"
        if section == "offload_param" and device not in ("none", None) and stage in (0, 1, 2):
            problems.append(
                Problem(
                    where,
                    f"parameter offload needs ZeRO stage 3 (stage is {stage})",
                    "set zero_optimization.stage to 3, or remove offload_param",
                )
            )
        if device == "nvme" and not block.get("nvme_path"):
            problems.append(
                Problem(
                    where + ".nvme_path",
                    "offload to nvme needs a path",
                    'set "nvme_path" to a local NVMe mount, e.g. "/local_nvme"',
                )
            )
    bf16, fp16 = _enabled(cfg.get("bf16", cfg.get("bfloat16"))), _enabled(cfg.get("fp16"))
    if bf16 is True and fp16 is True:
        problems.append(
            Problem(
                f"{name}:fp16.enabled", "bf16 and fp16 are both enabled", "enable only one of them"
            )
        )
    if bf16 is True and gpu_bf16 is False:
        problems.append(
            Problem(
                f"{name}:bf16.enabled",
                "this GPU has no bf16 support",
                'use "fp16": {"enabled": true} instead (V100, T4), or "auto" with --fp16',
            )
        )
    problems += _check_batch(cfg, name, world)
    if client == "trainer":
        problems += _trainer_must_match(cfg, name)
    if use_libraries and not any(p.severity == "error" for p in problems):
        from zerofit.configs.check_ecosystem import check_deepspeed_whole

        problems += check_deepspeed_whole(_as_filled(cfg), name, world or 1)
    return problems


# transformers HfTrainerDeepSpeedConfig.trainer_config_process: fill_match() raises when a value
# that is not "auto" differs from these TrainingArguments ("ds X=.. vs hf Y=..").
_TRAINER_MATCH = {
    "train_micro_batch_size_per_gpu": "--per_device_train_batch_size {v}",
    "gradient_accumulation_steps": "--gradient_accumulation_steps {v}",
    "train_batch_size": "world x per-device batch x accumulation = {v}",
    "gradient_clipping": "--max_grad_norm {v}",
    "bf16.enabled": "{flag}--bf16",
    "fp16.enabled": "{flag}--fp16",
    "optimizer.params.lr": "--learning_rate {v}",
    "optimizer.params.eps": "--adam_epsilon {v}",
    "optimizer.params.weight_decay": "--weight_decay {v}",
}


def _trainer_must_match(cfg: dict, name: str) -> list[Problem]:
    """Explicit values under the HF Trainer / TRL must equal the training arguments, or it stops."""
    needs = []
    for path, arg in _TRAINER_MATCH.items():
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


def _as_filled(cfg: dict) -> dict:
    """A copy with "auto" replaced the way a client fills it and a consistent batch triple.

    Batch arithmetic is zerofit's own rule (with the fix spelled out); the whole-config run is for
    everything else, so it gets micro x accumulation x world that DeepSpeed's assertion accepts.
    """
    out = copy.deepcopy(cfg)

    def fill(node: dict, prefix: str) -> None:
        for key, value in list(node.items()):
            path = prefix + str(key)
            if isinstance(value, dict):
                fill(value, path + ".")
            elif value == "auto":
                node[key] = _AUTO_STAND_IN.get(path, 1)

    fill(out, "")
    if "train_micro_batch_size_per_gpu" in out or "gradient_accumulation_steps" in out:
        out.pop("train_batch_size", None)  # DeepSpeed derives it from micro x accumulation x world
    return out


# Values a client would put where "auto" stands (any valid value serves: only validity is checked).
_AUTO_STAND_IN = {
    "gradient_clipping": 1.0,
    "fp16.enabled": False,
    "bf16.enabled": False,
    "optimizer.params.lr": 1e-5,
    "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0,
    "scheduler.params.warmup_min_lr": 0,
    "scheduler.params.warmup_max_lr": 1e-5,
    "scheduler.params.warmup_num_steps": 1,
    "scheduler.params.total_num_steps": 10,
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
}


def _enabled(block: Any) -> Any:
    return block.get("enabled") if isinstance(block, dict) else None


def _check_batch(cfg: dict, name: str, world: int | None) -> list[Problem]:
    tbs, micro, accum = (
        cfg.get(k)
        for k in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        )
    )
    if not all(is_int(v) and v > 0 for v in (tbs, micro, accum)):
        return []
    if world is not None:
        if tbs != micro * accum * world:
            return [
                Problem(
                    f"{name}:train_batch_size",
                    f"{tbs} != {micro} micro x {accum} accumulation x {world} processes "
                    f"(= {micro * accum * world}); DeepSpeed stops at start-up",
                    f"set train_batch_size to {micro * accum * world}",
                )
            ]
    elif tbs % (micro * accum):
        return [
            Problem(
                f"{name}:train_batch_size",
                f"{tbs} is not a multiple of {micro} micro x {accum} accumulation, so no world size fits",
                f"use a multiple of {micro * accum}, or set it to \"auto\" with HF Trainer",
            )
        ]
    return []


def _check_keys(
    cfg: dict, table: dict, name: str, prefix: str, descend: bool = True
) -> list[Problem]:
    """Keys and value types against a fallback table ("auto" values are judged by _check_autos)."""
    problems: list[Problem] = []
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        where = f"{name}:{path}"
        if not isinstance(key, str):
            problems.append(Problem(where, "keys must be strings", "quote the key"))
            continue
        if key.startswith("_") and not prefix:
            continue  # "_comment" style notes: DeepSpeed ignores unknown top-level keys
        if key not in table:
            unknown = unknown_key(where, key, table)
            if (
                not prefix
            ):  # DeepSpeed reads known top-level keys and ignores the rest: no effect, no crash
                unknown = Problem(
                    where,
                    "is not a key DeepSpeed reads at the top level (it is ignored)",
                    unknown.fix,
                    "warning",
                )
            problems.append(unknown)
            continue
        if value == "auto":
            continue
        kind = table[key]
        problem = type_problem(kind, value)
        if problem:
            problems.append(Problem(where, f"{value!r} {problem}", f"set {key} to {want(kind)}"))
        elif descend and isinstance(value, dict) and path in DS_SECTIONS:
            problems += _check_keys(value, DS_SECTIONS[path], name, path + ".")
    return problems


def _check_autos(node: dict, name: str, prefix: str, client: str | None) -> list[Problem]:
    """Every "auto" value, judged by who fills it (transformers HfTrainerDeepSpeedConfig, accelerate)."""
    problems: list[Problem] = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            problems += _check_autos(value, name, path + ".", client)
        elif value == "auto":
            problems += _auto(f"{name}:{path}", path, client)
    return problems


_UNKNOWN_CLIENT = '"auto" is filled only by HF Trainer / TRL'


def _merge_auto_warnings(problems: list[Problem], name: str) -> list[Problem]:
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


# Sections DeepSpeed reads with its pydantic config models, which drop "auto" values before
# validating (deepspeed/runtime/config_utils.py DeepSpeedConfigModel.__init__, strict=False).
_DROPS_AUTO = ("zero_optimization.", "bf16.", "bfloat16.", "fp16.")


def _auto(where: str, path: str, client: str | None) -> list[Problem]:
    trainer_fills = (
        path in HF_FILLED or path in ACCELERATE_FILLED
    )  # the Trainer prepares through accelerate
    if not trainer_fills:
        if path == "zero_optimization.stage":
            return [
                Problem(
                    where,
                    '"auto" is filled by no client: DeepSpeed drops it and runs stage 0 (ZeRO off)',
                    "write the stage: 1, 2 or 3",
                )
            ]
        if path.startswith(_DROPS_AUTO):
            return [
                Problem(
                    where,
                    '"auto" is filled by no client for this key: DeepSpeed drops it and uses its '
                    "default",
                    "write the value itself (or remove the key)",
                    "warning",
                )
            ]
        return [
            Problem(
                where,
                '"auto" is filled by no client for this key (DeepSpeed passes it on as text)',
                "write the value itself",
            )
        ]
    if client == "trainer":
        return []
    if client == "accelerate":
        if path in ACCELERATE_FILLED:
            return []
        return [
            Problem(
                where,
                '"auto" here is filled only by the HF Trainer / TRL, not by accelerate.prepare()',
                "write the value itself, or run the file with the HF Trainer / TRL",
            )
        ]
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
