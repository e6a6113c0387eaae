"""check: validate DeepSpeed JSON and accelerate YAML, alone and together; every problem at once.

Pure: texts in, ``list[Problem]`` out; nothing here imports deepspeed or accelerate. The key
tables in ``check_tables`` mirror DeepSpeed's pydantic config models and accelerate's
ClusterConfig; ``tests/configs/test_check.py`` keeps them equal to the installed classes.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

from zerofit.configs.check_tables import (ACCELERATE_DS_KEYS, ACCELERATE_KEYS, DISTRIBUTED_TYPES, DS_FILE_CONFLICTS, DS_SECTIONS,
                           DS_TOP, HF_FILLED, MIXED_PRECISIONS)


@dataclass(frozen=True)
class Problem:
    """One finding: ``path`` is ``FILE:dotted.key``; ``severity`` error | warning | unreadable."""

    path: str
    message: str
    fix: str
    severity: str = "error"

    def render(self) -> str:
        return f"{self.path}: {self.message} (fix: {self.fix})"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def check_files(texts: dict[str, str], gpu_bf16: bool | None = None, trainer: bool = False,
                exists: Callable[[str], bool] | None = None) -> list[Problem]:
    """Check every file in ``texts`` ({name: text}) and the pairs an accelerate YAML references.

    Args:
        texts: file name -> content; ``.json`` is read as DeepSpeed, ``.yaml``/``.yml`` as accelerate.
        gpu_bf16: whether the target GPU supports bf16 (None: unknown, not checked).
        trainer: HF Trainer / TRL fills ``"auto"`` values, so don't warn about them.
        exists: predicate for paths named in a YAML (``deepspeed_config_file``); None skips that check.
    """
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
        problems += check_accelerate(cfg, name, exists=exists)
        ref = (cfg.get("deepspeed_config") or {}).get("deepspeed_config_file") if isinstance(
            cfg.get("deepspeed_config"), dict) else None
        target = _match_file(ref, ds_files) if isinstance(ref, str) else None
        world = cfg.get("num_processes")
        if target and _is_int(world) and world > 0:
            paired[target] = world
            problems += _check_pair(cfg, name, ds_files[target], target)
    for name, cfg in ds_files.items():
        problems += check_deepspeed(cfg, name, world=paired.get(name), gpu_bf16=gpu_bf16, trainer=trainer)
    return problems


def _parse(name: str, text: str) -> tuple[str, Any, Problem | None]:
    low = name.lower()
    kind = "accelerate" if low.endswith((".yaml", ".yml")) else "deepspeed"
    try:
        if kind == "deepspeed":
            data = json.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
    except Exception as exc:  # any parser failure is the user's file, not our crash
        first = (str(exc).splitlines() or ["unparsable"])[0][:200]
        return kind, None, Problem(name, f"is not valid {'JSON' if kind == 'deepspeed' else 'YAML'} ({first})",
                                   "fix the syntax", "unreadable")
    if not isinstance(data, dict):
        return kind, None, Problem(name, "must hold a mapping of keys to values", "start from `zerofit config`",
                                   "unreadable")
    return kind, data, None


def _match_file(ref: str, files: dict[str, Any]) -> str | None:
    norm = os.path.normpath(ref)
    for name in files:
        if os.path.normpath(name) == norm:
            return name
    same_base = [n for n in files if os.path.basename(n) == os.path.basename(ref)]
    return same_base[0] if len(same_base) == 1 else None


# --------------------------------------------------------------------------- DeepSpeed JSON
def check_deepspeed(cfg: dict, name: str = "ds_config.json", world: int | None = None,
                    gpu_bf16: bool | None = None, trainer: bool = False) -> list[Problem]:
    """Problems in one DeepSpeed config dict (``world``: total processes, when known)."""
    if not isinstance(cfg, dict):
        return [Problem(name, "must hold a mapping of keys to values", "start from `zerofit config`", "unreadable")]
    problems = _check_keys(cfg, DS_TOP, name, "", trainer)
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
            problems.append(Problem(where, f"parameter offload needs ZeRO stage 3 (stage is {stage})",
                                    "set zero_optimization.stage to 3, or remove offload_param"))
        if device == "nvme" and not block.get("nvme_path"):
            problems.append(Problem(where + ".nvme_path", "offload to nvme needs a path",
                                    'set "nvme_path" to a local NVMe mount, e.g. "/local_nvme"'))
    bf16, fp16 = _enabled(cfg.get("bf16", cfg.get("bfloat16"))), _enabled(cfg.get("fp16"))
    if bf16 is True and fp16 is True:
        problems.append(Problem(f"{name}:fp16.enabled", "bf16 and fp16 are both enabled",
                                "enable only one of them"))
    if bf16 is True and gpu_bf16 is False:
        problems.append(Problem(f"{name}:bf16.enabled", "this GPU has no bf16 support",
                                'use "fp16": {"enabled": true} instead (V100, T4)'))
    problems += _check_batch(cfg, name, world)
    return problems


def _enabled(block: Any) -> Any:
    return block.get("enabled") if isinstance(block, dict) else None


def _check_batch(cfg: dict, name: str, world: int | None) -> list[Problem]:
    tbs, micro, accum = (cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                              "gradient_accumulation_steps"))
    if not all(_is_int(v) and v > 0 for v in (tbs, micro, accum)):
        return []
    if world is not None:
        if tbs != micro * accum * world:
            return [Problem(f"{name}:train_batch_size",
                            f"{tbs} != {micro} micro x {accum} accumulation x {world} processes "
                            f"(= {micro * accum * world}); DeepSpeed stops at start-up",
                            f"set train_batch_size to {micro * accum * world}")]
    elif tbs % (micro * accum):
        return [Problem(f"{name}:train_batch_size",
                        f"{tbs} is not a multiple of {micro} micro x {accum} accumulation, so no world size fits",
                        f"use a multiple of {micro * accum}, or set it to \"auto\" with HF Trainer")]
    return []


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_keys(cfg: dict, table: dict, name: str, prefix: str, trainer: bool) -> list[Problem]:
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
            problems.append(_unknown(where, key, table))
            continue
        kind = table[key]
        if value == "auto":
            problems += _auto(where, path, trainer)
            continue
        problem = _type_problem(kind, value)
        if problem:
            problems.append(Problem(where, f"{value!r} {problem}", f"set {key} to {_want(kind)}"))
        elif kind == "dict" and path in DS_SECTIONS:
            problems += _check_keys(value, DS_SECTIONS[path], name, path + ".", trainer)
    return problems


def _unknown(where: str, key: str, table: dict) -> Problem:
    near = difflib.get_close_matches(key, list(table), n=1, cutoff=0.6)
    fix = f"did you mean {near[0]!r}?" if near else "remove it (see the DeepSpeed / accelerate config docs)"
    return Problem(where, "is not a known key", fix)


def _auto(where: str, path: str, trainer: bool) -> list[Problem]:
    if path not in HF_FILLED:
        return [Problem(where, '"auto" is not filled by anyone for this key (accelerate raises at prepare())',
                        "write the value itself")]
    if trainer:
        return []
    return [Problem(where, '"auto" is filled only by HF Trainer / TRL (or accelerate.prepare() given a '
                           "DataLoader); plain DeepSpeed rejects it",
                    "write a number, or pass --trainer if HF Trainer/TRL runs this config", "warning")]


_WANT = {"int": "a whole number", "int_or_minus1": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
         "path": "a path string", "dict": "a mapping", "list": "a list", "stage": "0, 1, 2 or 3",
         "device": '"none", "cpu" or "nvme"', "any": "a value"}


def _want(kind: str) -> str:
    return _WANT.get(kind, kind)


def _type_problem(kind: str, value: Any) -> str | None:
    ok = {
        "int": _is_int(value) and value >= 0,
        "int_or_minus1": _is_int(value),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "path": isinstance(value, str) or value is None,
        "dict": isinstance(value, dict),
        "list": isinstance(value, list),
        "stage": _is_int(value) and value in (0, 1, 2, 3),
        "device": value in ("none", "cpu", "nvme"),
        "any": True,
    }.get(kind, True)
    return None if ok else f"is not {_want(kind)}"


# --------------------------------------------------------------------------- accelerate YAML
def check_accelerate(cfg: dict, name: str = "accelerate.yaml",
                     exists: Callable[[str], bool] | None = None) -> list[Problem]:
    """Problems in one accelerate config dict (ClusterConfig keys)."""
    if not isinstance(cfg, dict):
        return [Problem(name, "must hold a mapping of keys to values", "start from `zerofit config`", "unreadable")]
    problems: list[Problem] = []
    for key, value in cfg.items():
        if not isinstance(key, str) or key not in ACCELERATE_KEYS:
            problems.append(_unknown(f"{name}:{key}", str(key), ACCELERATE_KEYS))
            continue
        problem = None if value is None else _type_problem(ACCELERATE_KEYS[key], value)
        if problem:
            problems.append(Problem(f"{name}:{key}", f"{value!r} {problem}",
                                    f"set {key} to {_want(ACCELERATE_KEYS[key])}"))
    dtype = cfg.get("distributed_type")
    if "distributed_type" not in cfg:
        problems.append(Problem(f"{name}:distributed_type", "is missing (accelerate refuses the file)",
                                "add distributed_type: DEEPSPEED (or MULTI_GPU / NO)"))
    elif dtype not in DISTRIBUTED_TYPES:
        problems.append(Problem(f"{name}:distributed_type", f"{dtype!r} is not a distributed type",
                                "use one of " + ", ".join(DISTRIBUTED_TYPES)))
    mp = cfg.get("mixed_precision")
    if mp is not None and mp not in MIXED_PRECISIONS:
        problems.append(Problem(f"{name}:mixed_precision", f"{mp!r} is not a precision",
                                "use one of " + ", ".join(MIXED_PRECISIONS)))
    problems += _check_processes(cfg, name)
    ds = cfg.get("deepspeed_config")
    if dtype == "DEEPSPEED" and isinstance(ds, dict):
        problems += _check_ds_section(cfg, ds, name, exists)
    return problems


def _check_processes(cfg: dict, name: str) -> list[Problem]:
    problems: list[Problem] = []
    procs, machines, rank = cfg.get("num_processes", 1), cfg.get("num_machines", 1), cfg.get("machine_rank", 0)
    if not (_is_int(procs) and _is_int(machines) and procs > 0 and machines > 0):
        if _is_int(procs) and procs < 1 and procs != -1:
            problems.append(Problem(f"{name}:num_processes", f"{procs} is not a process count",
                                    "set it to the total number of GPUs across all machines"))
        if _is_int(machines) and machines < 1:
            problems.append(Problem(f"{name}:num_machines", f"{machines} is not a machine count", "set it to 1 or more"))
        return problems
    if procs % machines:
        problems.append(Problem(f"{name}:num_processes",
                                f"{procs} processes do not split evenly over {machines} machines "
                                "(uneven GPUs per node hang at start-up)",
                                f"num_processes is the TOTAL across machines: use a multiple of {machines}, "
                                f"e.g. {machines * max(1, procs // machines)}"))
    elif machines > 1 and procs == machines and cfg.get("distributed_type") == "DEEPSPEED":
        problems.append(Problem(f"{name}:num_processes",
                                f"{procs} processes on {machines} machines is 1 GPU per machine",
                                "num_processes is the TOTAL across machines (GPUs per node x machines); "
                                "ignore this if each machine really has one GPU", "warning"))
    if _is_int(rank) and not 0 <= rank < machines:
        problems.append(Problem(f"{name}:machine_rank", f"{rank} is outside 0..{machines - 1}",
                                "give each machine its own rank from 0 to num_machines-1"))
    if machines > 1:
        if not cfg.get("main_process_ip"):
            problems.append(Problem(f"{name}:main_process_ip", "multi-machine runs need the rank-0 machine's address",
                                    "set main_process_ip to machine 0's IP address"))
        if cfg.get("main_process_port") is None:
            problems.append(Problem(f"{name}:main_process_port", "multi-machine runs need a rendezvous port",
                                    "set main_process_port, e.g. 29500 (open between the machines)"))
    return problems


def _check_ds_section(cfg: dict, ds: dict, name: str, exists) -> list[Problem]:
    problems: list[Problem] = []
    for key in ds:
        if key not in ACCELERATE_DS_KEYS:
            problems.append(_unknown(f"{name}:deepspeed_config.{key}", str(key), ACCELERATE_DS_KEYS))
    path = ds.get("deepspeed_config_file")
    if isinstance(path, str) and path not in ("", "none"):
        for key in ds:
            if key in DS_FILE_CONFLICTS:
                problems.append(Problem(f"{name}:deepspeed_config.{key}",
                                        "is ignored next to deepspeed_config_file and accelerate launch refuses it",
                                        f"remove it and set the value in {path}"))
        if cfg.get("mixed_precision") is not None:
            problems.append(Problem(f"{name}:mixed_precision",
                                    "accelerate launch refuses mixed_precision next to deepspeed_config_file",
                                    f"remove it; precision is the bf16/fp16 block of {path}"))
        if exists is not None and not exists(path):
            problems.append(Problem(f"{name}:deepspeed_config.deepspeed_config_file",
                                    f"{path} does not exist (it is opened relative to the launch directory)",
                                    "fix the path, or launch from the directory it is relative to"))
    machines = cfg.get("num_machines", 1)
    launcher = ds.get("deepspeed_multinode_launcher", "pdsh")
    if _is_int(machines) and machines > 1 and launcher in ("pdsh", None):
        problems.append(Problem(f"{name}:deepspeed_config.deepspeed_multinode_launcher",
                                "multi-node with the pdsh launcher needs pdsh, a hostfile and passwordless ssh; "
                                "without them each machine trains alone",
                                "set deepspeed_multinode_launcher: standard and run the launch on every node"))
    return problems


def _check_pair(acc: dict, acc_name: str, ds: dict, ds_name: str) -> list[Problem]:
    zero = ds.get("zero_optimization")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    flag = (acc.get("deepspeed_config") or {}).get("zero3_init_flag")
    if flag is True and _is_int(stage) and stage != 3:
        return [Problem(f"{acc_name}:deepspeed_config.zero3_init_flag",
                        f"is for ZeRO-3 but {ds_name} uses stage {stage} (accelerate turns it off)",
                        "set zero3_init_flag: false", "warning")]
    return []
