"""check, files and pairs: parse each text, pair a YAML with the DeepSpeed JSON it names, check.

A file a YAML names as ``deepspeed_config_file`` is always read as DeepSpeed JSON, whatever its
name: accelerate opens it with ``json.load`` (``utils/deepspeed.py``: ``HfDeepSpeedConfig``).
zerofit's own answers file, the answers.yaml `zerofit config` writes beside the other two, is
recognised by its keys and read with the Answers loader `config --answers` uses, not as accelerate.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from zerofit.configs.check.accelerate_file import accelerate_keys, check_accelerate
from zerofit.configs.check.deepspeed_file import check_deepspeed
from zerofit.configs.check.problems import Problem, is_int, not_a_mapping
from zerofit.configs.check.training import check_training, read_model_config
from zerofit.errors import ZerofitError


def is_yaml(name: str) -> bool:
    return name.lower().endswith((".yaml", ".yml"))


def check_files(
    texts: dict[str, str],
    gpu_bf16: bool | None = None,
    trainer: bool = False,
    exists: Callable[[str], bool] | None = None,
    client: str | None = None,
    training=None,
) -> list[Problem]:
    """Check every file in ``texts`` ({name: text}) and the pairs an accelerate YAML references.

    Args:
        texts: file name -> content; ``.yaml``/``.yml`` is read as accelerate, anything else, and
            any file a YAML names as ``deepspeed_config_file``, as DeepSpeed JSON.
        gpu_bf16: whether the target GPU supports bf16 (None: unknown, not checked).
        trainer: shorthand for ``client="trainer"``.
        exists: predicate for paths named in a YAML (``deepspeed_config_file``,
            ``deepspeed_hostfile``); None skips those checks.
        client: who runs the files: "trainer" (HF Trainer / TRL), "accelerate" (your own loop
            under accelerate launch), "deepspeed" (deepspeed.initialize / the deepspeed launcher),
            or None.
        training: how the model is trained (``training.TrainingSetup``, from a TRL /
            LLaMA-Factory YAML or a command line), judged against every ZeRO-3 config; None
            skips those rules.
    """
    client = "trainer" if trainer and client is None else client
    problems: list[Problem] = []
    yamls = {name: parse_yaml(name, texts[name]) for name in filter(is_yaml, texts)}
    targets = {name: _named_json(cfg, texts) for name, (cfg, _) in yamls.items()}
    # a YAML another YAML names as its DeepSpeed JSON is that JSON, not an accelerate config
    named_by_another = {t for name, t in targets.items() if t and t != name}
    answers = {name for name in answers_files(texts) if name not in named_by_another}
    for name, (_, found) in yamls.items():
        problems += found if name not in named_by_another else []
    for name in sorted(answers):
        problems += check_answers(name, texts[name])
    deepspeed: dict[str, dict] = {}
    for name, text in texts.items():
        if is_yaml(name) and name not in named_by_another:
            continue
        data, found = parse_json(name, text)
        if data is not None or not is_yaml(name):
            problems += found  # an unreadable YAML named as JSON is the reference's problem
        if data is not None:
            deepspeed[name] = data
    paired: dict[str, int] = {}  # DeepSpeed file -> world size from the YAML that references it
    for name, (cfg, _) in yamls.items():
        if cfg is None or name in named_by_another or name in answers:
            continue
        problems += check_accelerate(cfg, name, exists=exists)
        problems += _check_reference(cfg, name, targets[name], deepspeed, paired)
    for name, cfg in deepspeed.items():
        problems += check_deepspeed(
            cfg, name, world=paired.get(name), gpu_bf16=gpu_bf16, client=client
        )
    if training is not None:
        problems += check_training(training, deepspeed, client, read_model_config)
    return problems


def answers_files(texts: dict[str, str]) -> list[str]:
    """The YAMLs in ``texts`` that are zerofit's own answers files, in the order given.

    Recognised by their keys, whatever the file's name: most are Answers fields (or the alias
    ``flavor``), at least one of them a key accelerate does not know, and none is a key accelerate
    knows that is no answer. ``main_process_ip`` and ``main_process_port`` are both, so they
    decide nothing. A misspelt key is neither, so an answers file with a typo is still read as
    answers and the typo reported by the Answers loader, while a training YAML (TRL's
    ``gradient_checkpointing`` among its own keys) is not taken for one.
    """
    import dataclasses

    from zerofit.planning.answers import KEY_ALIASES, Answers

    answer_keys = {field.name for field in dataclasses.fields(Answers)} | set(KEY_ALIASES)
    accelerate = accelerate_keys()
    found = []
    for name in filter(is_yaml, texts):
        cfg, _ = parse_yaml(name, texts[name])
        if cfg is None:
            continue
        keys = {str(key) for key in cfg}
        mostly_answers = len(keys & answer_keys) > len(keys - answer_keys)
        only_answers = keys & (answer_keys - accelerate)
        if mostly_answers and only_answers and not keys & (accelerate - answer_keys):
            found.append(name)
    return found


def check_answers(name: str, text: str) -> list[Problem]:
    """An answers file read as `zerofit config --answers` reads it (``load_answers``): its first
    problem, or none."""
    from zerofit.planning.answers import load_answers

    try:
        load_answers(text)
    except ZerofitError as exc:
        fix = exc.fix or "see `zerofit config --help`"
        return [Problem(f"{name}:{exc.field}" if exc.field else name, exc.problem, fix)]
    return []


def _check_reference(
    cfg: dict, name: str, target: str | None, deepspeed: dict, paired: dict
) -> list[Problem]:
    """The JSON a YAML names: readable as JSON, and consistent with the YAML's process count
    (recorded in ``paired`` for the JSON's batch arithmetic)."""
    if target is None:
        return []
    if target not in deepspeed:
        if not is_yaml(target):
            return []  # an unreadable .json is reported as that file's own problem
        itself = " (it is this accelerate YAML itself)" if target == name else ""
        return [
            Problem(
                f"{name}:deepspeed_config.deepspeed_config_file",
                f"{target} is not a DeepSpeed JSON file{itself}: accelerate reads it with "
                "json.load and stops",
                "point it at a DeepSpeed JSON file, e.g. the ds_config.json `zerofit config` "
                "writes",
            )
        ]
    world = cfg.get("num_processes")
    if not (is_int(world) and world > 0):
        return []
    paired[target] = world
    return _check_pair(cfg, name, deepspeed[target], target)


def _named_json(cfg: Any, texts: dict[str, str]) -> str | None:
    """The file in ``texts`` a YAML names as ``deepspeed_config_file``, if any."""
    ds = cfg.get("deepspeed_config") if isinstance(cfg, dict) else None
    ref = ds.get("deepspeed_config_file") if isinstance(ds, dict) else None
    return _match_file(ref, texts) if isinstance(ref, str) and ref else None


def referenced_files(texts: dict[str, str]) -> list[str]:
    """The ``deepspeed_config_file`` paths the YAMLs in ``texts`` name (to read alongside)."""
    refs = []
    for name in filter(is_yaml, texts):
        cfg, _ = parse_yaml(name, texts[name])
        ds = cfg.get("deepspeed_config") if isinstance(cfg, dict) else None
        ref = ds.get("deepspeed_config_file") if isinstance(ds, dict) else None
        if isinstance(ref, str) and ref:
            refs.append(ref)
    return refs


def _unreadable(name: str, kind: str, exc: BaseException) -> Problem:
    if isinstance(exc, RecursionError):
        detail = "nested too deeply to read"
    else:
        detail = (str(exc).splitlines() or ["unparsable"])[0][:200]
    return Problem(name, f"is not valid {kind} ({detail})", "fix the syntax", "unreadable")


def parse_yaml(name: str, text: str) -> tuple[dict | None, list[Problem]]:
    """An accelerate YAML's mapping, or None and the problem that makes it unreadable."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except Exception as exc:  # any parser failure (RecursionError included) is the user's file
        return None, [_unreadable(name, "YAML", exc)]
    if not isinstance(data, dict):
        return None, [not_a_mapping(name)]
    return data, []


def parse_json(name: str, text: str) -> tuple[dict | None, list[Problem]]:
    """A DeepSpeed JSON's mapping and its problems: unreadable (None), or duplicate keys, which
    are reported while the rest of the file is still checked (json keeps the last value)."""
    duplicates: list[str] = []
    try:
        data = json.loads(text, object_pairs_hook=lambda pairs: _no_duplicates(pairs, duplicates))
    except Exception as exc:  # any parser failure is the user's file, not our crash
        return None, [_unreadable(name, "JSON", exc)]
    if not isinstance(data, dict):
        return None, [not_a_mapping(name)]
    if not duplicates:
        return data, []
    # json keeps the last value silently; DeepSpeed's own loader refuses the file
    # (deepspeed/runtime/config_utils.py dict_raise_error_on_duplicate_keys).
    also = f"; also {', '.join(duplicates[1:])}" if duplicates[1:] else ""
    duplicate = Problem(
        f"{name}:{duplicates[0]}",
        "appears twice in one object (DeepSpeed refuses duplicate keys; json keeps the last one "
        "silently)" + also,
        "keep one of them",
    )
    return data, [duplicate]


def _no_duplicates(pairs: list, seen: list[str]) -> dict:
    keys = [key for key, _ in pairs]
    for key in dict.fromkeys(keys):
        if keys.count(key) > 1:
            seen.append(str(key))
    return dict(pairs)


def _match_file(ref: str, files: dict[str, Any]) -> str | None:
    norm = os.path.normpath(ref)
    for name in files:
        if os.path.normpath(name) == norm:
            return name
    same_base = [n for n in files if os.path.basename(n) == os.path.basename(ref)]
    return same_base[0] if len(same_base) == 1 else None


def _check_pair(acc: dict, acc_name: str, ds: dict, ds_name: str) -> list[Problem]:
    zero = ds.get("zero_optimization")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    flag = (acc.get("deepspeed_config") or {}).get("zero3_init_flag")
    if flag is True and is_int(stage) and stage != 3:
        return [
            Problem(
                f"{acc_name}:deepspeed_config.zero3_init_flag",
                f"is for ZeRO-3 but {ds_name} uses stage {stage} (accelerate turns it off)",
                "set zero3_init_flag: false",
                "warning",
            )
        ]
    return []
