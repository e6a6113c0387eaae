"""check: validate DeepSpeed JSON and accelerate YAML, alone and together; every problem at once.

Texts in, ``list[Problem]`` out. With DeepSpeed and accelerate importable (the normal install),
keys and values are judged by the libraries' own classes (``check_ecosystem``: DeepSpeedZeroConfig,
the precision configs, the whole DeepSpeedConfig, accelerate's ClusterConfig loader and launch
flags), so every current key, alias and deprecated or removed form is judged as the run will judge
it. Without them, the hand tables in ``check_tables`` stand in, and ``engine()`` says so.
zerofit's own cross-file rules sit on top either way: batch arithmetic against the YAML's process
count, "auto" values against the client that runs the file, precision against the GPU, process
and machine counts, the multi-node launcher and its hostfile.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from zerofit.configs.check_json import check_deepspeed
from zerofit.configs.check_problem import Problem, is_int
from zerofit.configs.check_yaml import check_accelerate

__all__ = ["CLIENTS", "Problem", "check_accelerate", "check_deepspeed", "check_files", "engine"]

# Who runs the file decides which "auto" values get filled (None: unknown, "auto" is a warning).
CLIENTS = ("trainer", "accelerate", "deepspeed")


def engine(use_libraries: bool = True) -> str:
    """What judges keys and values: "DeepSpeed X + accelerate Y", or the fallback tables."""
    if use_libraries:
        from zerofit.configs.check_ecosystem import accelerate_version, deepspeed_version

        ds, acc = deepspeed_version(), accelerate_version()
        if ds and acc:
            return f"DeepSpeed {ds} + accelerate {acc}"
        if ds or acc:
            return (
                f"DeepSpeed {ds}" if ds else f"accelerate {acc}"
            ) + " (the other: zerofit's key tables)"
    return "zerofit's key tables (DeepSpeed/accelerate not importable)"


def _libraries(use_libraries: bool) -> tuple[bool, bool]:
    if not use_libraries:
        return False, False
    from zerofit.configs.check_ecosystem import accelerate_version, deepspeed_version

    return deepspeed_version() is not None, accelerate_version() is not None


def check_files(
    texts: dict[str, str],
    gpu_bf16: bool | None = None,
    trainer: bool = False,
    exists: Callable[[str], bool] | None = None,
    client: str | None = None,
    use_libraries: bool = True,
) -> list[Problem]:
    """Check every file in ``texts`` ({name: text}) and the pairs an accelerate YAML references.

    Args:
        texts: file name -> content; ``.json`` is read as DeepSpeed, ``.yaml``/``.yml`` as accelerate.
        gpu_bf16: whether the target GPU supports bf16 (None: unknown, not checked).
        trainer: shorthand for ``client="trainer"``.
        exists: predicate for paths named in a YAML (``deepspeed_config_file``, ``deepspeed_hostfile``);
            None skips those checks.
        client: who runs the files: "trainer" (HF Trainer / TRL), "accelerate" (your own loop under
            accelerate launch), "deepspeed" (deepspeed.initialize / the deepspeed launcher), or None.
        use_libraries: judge keys with the installed DeepSpeed/accelerate (False: the tables only).
    """
    client = "trainer" if trainer and client is None else client
    ds_lib, acc_lib = _libraries(use_libraries)
    problems: list[Problem] = []
    ds_files: dict[str, dict] = {}
    yaml_files: dict[str, dict] = {}
    for name, text in texts.items():
        kind, data, problem = _parse(name, text)
        if problem:
            problems.append(problem)
        elif kind == "deepspeed":
            ds_files[name] = data
        else:
            yaml_files[name] = data
    paired: dict[str, int] = {}  # DeepSpeed file -> world size from the YAML that references it
    for name, cfg in yaml_files.items():
        problems += check_accelerate(cfg, name, exists=exists, use_libraries=acc_lib)
        ref = (
            (cfg.get("deepspeed_config") or {}).get("deepspeed_config_file")
            if isinstance(cfg.get("deepspeed_config"), dict)
            else None
        )
        target = _match_file(ref, ds_files) if isinstance(ref, str) else None
        world = cfg.get("num_processes")
        if target and is_int(world) and world > 0:
            paired[target] = world
            problems += _check_pair(cfg, name, ds_files[target], target)
    for name, cfg in ds_files.items():
        problems += check_deepspeed(
            cfg,
            name,
            world=paired.get(name),
            gpu_bf16=gpu_bf16,
            client=client,
            use_libraries=ds_lib,
        )
    return problems


def _parse(name: str, text: str) -> tuple[str, Any, Problem | None]:
    low = name.lower()
    kind = "accelerate" if low.endswith((".yaml", ".yml")) else "deepspeed"
    duplicates: list[str] = []
    try:
        if kind == "deepspeed":
            data = json.loads(
                text, object_pairs_hook=lambda pairs: _no_duplicates(pairs, duplicates)
            )
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # any parser failure is the user's file, not our crash
        first = (str(exc).splitlines() or ["unparsable"])[0][:200]
        return (
            kind,
            None,
            Problem(
                name,
                f"is not valid {'JSON' if kind == 'deepspeed' else 'YAML'} ({first})",
                "fix the syntax",
                "unreadable",
            ),
        )
    if not isinstance(data, dict):
        return (
            kind,
            None,
            Problem(
                name,
                "must hold a mapping of keys to values",
                "start from `zerofit config`",
                "unreadable",
            ),
        )
    if duplicates:
        # json keeps the last value silently; DeepSpeed's own loader refuses the file
        # (deepspeed/runtime/config_utils.py dict_raise_error_on_duplicate_keys).
        return (
            kind,
            None,
            Problem(
                f"{name}:{duplicates[0]}",
                "appears twice in one object (DeepSpeed refuses duplicate keys; json keeps "
                "the last one silently)"
                + (f"; also {', '.join(duplicates[1:])}" if duplicates[1:] else ""),
                "keep one of them",
                "error",
            ),
        )
    return kind, data, None


def _no_duplicates(pairs: list, seen: list[str]) -> dict:
    keys = [k for k, _ in pairs]
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
