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

import copy
import difflib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

from zerofit.configs.check_tables import (ACCELERATE_DS_KEYS, ACCELERATE_FILLED, ACCELERATE_KEYS, DISTRIBUTED_TYPES,
                                          DS_FILE_CONFLICTS, DS_MULTINODE_LAUNCHERS, DS_SECTIONS,
                                           DS_TOP, HF_FILLED, MIXED_PRECISIONS)

# Who runs the file decides which "auto" values get filled (None: unknown, "auto" is a warning).
CLIENTS = ("trainer", "accelerate", "deepspeed")


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


def engine(use_libraries: bool = True) -> str:
    """What judges keys and values: "DeepSpeed X + accelerate Y", or the fallback tables."""
    if use_libraries:
        from zerofit.configs.check_ecosystem import accelerate_version, deepspeed_version
        ds, acc = deepspeed_version(), accelerate_version()
        if ds and acc:
            return f"DeepSpeed {ds} + accelerate {acc}"
        if ds or acc:
            return (f"DeepSpeed {ds}" if ds else f"accelerate {acc}") + " (the other: zerofit's key tables)"
    return "zerofit's key tables (DeepSpeed/accelerate not importable)"


def _libraries(use_libraries: bool) -> tuple[bool, bool]:
    if not use_libraries:
        return False, False
    from zerofit.configs.check_ecosystem import accelerate_version, deepspeed_version
    return deepspeed_version() is not None, accelerate_version() is not None


def check_files(texts: dict[str, str], gpu_bf16: bool | None = None, trainer: bool = False,
                exists: Callable[[str], bool] | None = None, client: str | None = None,
                use_libraries: bool = True) -> list[Problem]:
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
        ref = (cfg.get("deepspeed_config") or {}).get("deepspeed_config_file") if isinstance(
            cfg.get("deepspeed_config"), dict) else None
        target = _match_file(ref, ds_files) if isinstance(ref, str) else None
        world = cfg.get("num_processes")
        if target and _is_int(world) and world > 0:
            paired[target] = world
            problems += _check_pair(cfg, name, ds_files[target], target)
    for name, cfg in ds_files.items():
        problems += check_deepspeed(cfg, name, world=paired.get(name), gpu_bf16=gpu_bf16, client=client,
                                    use_libraries=ds_lib)
    return problems


def _parse(name: str, text: str) -> tuple[str, Any, Problem | None]:
    low = name.lower()
    kind = "accelerate" if low.endswith((".yaml", ".yml")) else "deepspeed"
    duplicates: list[str] = []
    try:
        if kind == "deepspeed":
            data = json.loads(text, object_pairs_hook=lambda pairs: _no_duplicates(pairs, duplicates))
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
    if duplicates:
        # json keeps the last value silently; DeepSpeed's own loader refuses the file
        # (deepspeed/runtime/config_utils.py dict_raise_error_on_duplicate_keys).
        return kind, None, Problem(f"{name}:{duplicates[0]}",
                                   "appears twice in one object (DeepSpeed refuses duplicate keys; json keeps "
                                   "the last one silently)" + (f"; also {', '.join(duplicates[1:])}"
                                                               if duplicates[1:] else ""),
                                   "keep one of them", "error")
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


# --------------------------------------------------------------------------- DeepSpeed JSON
def check_deepspeed(cfg: dict, name: str = "ds_config.json", world: int | None = None,
                    gpu_bf16: bool | None = None, trainer: bool = False, client: str | None = None,
                    use_libraries: bool = True) -> list[Problem]:
    """Problems in one DeepSpeed config dict (``world``: total processes, when known).

    ``client`` as in ``check_files``; ``use_libraries`` False forces the fallback tables.
    """
    if not isinstance(cfg, dict):
        return [Problem(name, "must hold a mapping of keys to values", "start from `zerofit config`", "unreadable")]
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
    kept = {k: v for k, v in cfg.items() if k not in removed}  # a removed block is reported once, whole
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
                                'use "fp16": {"enabled": true} instead (V100, T4), or "auto" with --fp16'))
    problems += _check_batch(cfg, name, world)
    if client == "trainer":
        problems += _trainer_must_match(cfg, name)
    if use_libraries and not any(p.severity == "error" for p in problems):
        from zerofit.configs.check_ecosystem import check_deepspeed_whole
        problems += check_deepspeed_whole(_as_filled(cfg), name, world or 1)
    return problems


# transformers HfTrainerDeepSpeedConfig.trainer_config_process: fill_match() raises when a value
# that is not "auto" differs from these TrainingArguments ("ds X=.. vs hf Y=..").
_TRAINER_MATCH = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size {v}",
                  "gradient_accumulation_steps": "--gradient_accumulation_steps {v}",
                  "train_batch_size": "world x per-device batch x accumulation = {v}",
                  "gradient_clipping": "--max_grad_norm {v}",
                  "bf16.enabled": "{flag}--bf16", "fp16.enabled": "{flag}--fp16",
                  "optimizer.params.lr": "--learning_rate {v}", "optimizer.params.eps": "--adam_epsilon {v}",
                  "optimizer.params.weight_decay": "--weight_decay {v}"}


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
    return [Problem(f"{name}:explicit", "the HF Trainer / TRL stop unless these explicit values equal their "
                    "arguments: " + "; ".join(needs),
                    'pass exactly those arguments, or write "auto" (zerofit config --flavour auto)', "warning")]


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
_AUTO_STAND_IN = {"gradient_clipping": 1.0, "fp16.enabled": False, "bf16.enabled": False,
                  "optimizer.params.lr": 1e-5, "optimizer.params.betas": [0.9, 0.999],
                  "optimizer.params.eps": 1e-8, "optimizer.params.weight_decay": 0.0,
                  "scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": 1e-5,
                  "scheduler.params.warmup_num_steps": 1, "scheduler.params.total_num_steps": 10,
                  "zero_optimization.stage3_gather_16bit_weights_on_model_save": False}


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


def _check_keys(cfg: dict, table: dict, name: str, prefix: str, descend: bool = True) -> list[Problem]:
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
            unknown = _unknown(where, key, table)
            if not prefix:  # DeepSpeed reads known top-level keys and ignores the rest: no effect, no crash
                unknown = Problem(where, "is not a key DeepSpeed reads at the top level (it is ignored)",
                                  unknown.fix, "warning")
            problems.append(unknown)
            continue
        if value == "auto":
            continue
        kind = table[key]
        problem = _type_problem(kind, value)
        if problem:
            problems.append(Problem(where, f"{value!r} {problem}", f"set {key} to {_want(kind)}"))
        elif descend and isinstance(value, dict) and path in DS_SECTIONS:
            problems += _check_keys(value, DS_SECTIONS[path], name, path + ".")
    return problems


def _unknown(where: str, key: str, table: dict) -> Problem:
    near = difflib.get_close_matches(key, list(table), n=1, cutoff=0.6)
    fix = f"did you mean {near[0]!r}?" if near else "remove it (see the DeepSpeed / accelerate config docs)"
    return Problem(where, "is not a known key", fix)


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
    warned = [p for p in problems if p.severity == "warning" and p.message.startswith(_UNKNOWN_CLIENT)]
    if len(warned) < 2:
        return problems
    keys = ", ".join(p.path.split(":", 1)[1] for p in warned)
    merged = Problem(f"{name}:auto", f"{len(warned)} values are \"auto\" ({keys}): filled only by HF Trainer / "
                     "TRL / accelerate.prepare(); plain DeepSpeed rejects them",
                     "pass --client trainer, accelerate or deepspeed to check for the client that runs it",
                     "warning")
    return [p for p in problems if p not in warned] + [merged]


# Sections DeepSpeed reads with its pydantic config models, which drop "auto" values before
# validating (deepspeed/runtime/config_utils.py DeepSpeedConfigModel.__init__, strict=False).
_DROPS_AUTO = ("zero_optimization.", "bf16.", "bfloat16.", "fp16.")


def _auto(where: str, path: str, client: str | None) -> list[Problem]:
    trainer_fills = path in HF_FILLED or path in ACCELERATE_FILLED  # the Trainer prepares through accelerate
    if not trainer_fills:
        if path == "zero_optimization.stage":
            return [Problem(where, '"auto" is filled by no client: DeepSpeed drops it and runs stage 0 (ZeRO off)',
                            "write the stage: 1, 2 or 3")]
        if path.startswith(_DROPS_AUTO):
            return [Problem(where, '"auto" is filled by no client for this key: DeepSpeed drops it and uses its '
                                   "default", "write the value itself (or remove the key)", "warning")]
        return [Problem(where, '"auto" is filled by no client for this key (DeepSpeed passes it on as text)',
                        "write the value itself")]
    if client == "trainer":
        return []
    if client == "accelerate":
        if path in ACCELERATE_FILLED:
            return []
        return [Problem(where, '"auto" here is filled only by the HF Trainer / TRL, not by accelerate.prepare()',
                        "write the value itself, or run the file with the HF Trainer / TRL")]
    if client == "deepspeed":
        return [Problem(where, '"auto" is filled only by HF Trainer / TRL / accelerate; plain DeepSpeed '
                               "(deepspeed.initialize, the deepspeed launcher) rejects it",
                        "write a number (zerofit config --flavour explicit)")]
    return [Problem(where, _UNKNOWN_CLIENT + " (or accelerate.prepare() given a "
                           "DataLoader); plain DeepSpeed rejects it",
                    "write a number, or pass --client trainer / --client accelerate for who runs it", "warning")]


_WANT = {"dict_or_bool": "a mapping", "int": "a whole number", "int_or_minus1": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
         "path": "a path string", "dict": "a mapping", "list": "a list", "stage": "0, 1, 2 or 3",
         "device": '"none", "cpu" or "nvme"', "any": "a value"}


def _want(kind: str) -> str:
    return _WANT.get(kind, kind)


def _type_problem(kind: str, value: Any) -> str | None:
    ok = {
        # 5e8 is a JSON float; DeepSpeed's pydantic int fields accept whole-number floats.
        "int": (_is_int(value) or isinstance(value, float) and value.is_integer()) and value >= 0,
        "int_or_minus1": _is_int(value),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "path": isinstance(value, str) or value is None,
        "dict": isinstance(value, dict),
        "dict_or_bool": isinstance(value, (dict, bool)),  # "zero_optimization": true, the legacy form
        "list": isinstance(value, list),
        "stage": _is_int(value) and value in (0, 1, 2, 3),
        "device": value in ("none", "cpu", "nvme"),
        "any": True,
    }.get(kind, True)
    return None if ok else f"is not {_want(kind)}"


# --------------------------------------------------------------------------- accelerate YAML
def check_accelerate(cfg: dict, name: str = "accelerate.yaml",
                     exists: Callable[[str], bool] | None = None, use_libraries: bool = True) -> list[Problem]:
    """Problems in one accelerate config dict (ClusterConfig keys).

    With accelerate importable its loader, launch flags and DeepSpeedPlugin conversions judge keys
    and values (``check_ecosystem.check_accelerate_loader``); else the tables in ``check_tables``.
    """
    if not isinstance(cfg, dict):
        return [Problem(name, "must hold a mapping of keys to values", "start from `zerofit config`", "unreadable")]
    if use_libraries:
        from zerofit.configs.check_ecosystem import accelerate_version
        use_libraries = accelerate_version() is not None
    problems: list[Problem] = []
    if use_libraries:
        from zerofit.configs.check_ecosystem import check_accelerate_loader
        library = check_accelerate_loader(cfg, name)
    for key, value in cfg.items():
        if not isinstance(key, str) or key not in ACCELERATE_KEYS:
            if not use_libraries:
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
        problems += _check_ds_section(cfg, ds, name, exists, keys=not use_libraries)
    if use_libraries:
        # The loader's verdict on the whole file is reported only when zerofit's own rules found
        # no error: it stops at the first problem, which the rules above already name with a fix.
        ours = {p.path for p in problems}
        loader_whole = [p for p in library if p.path == name]
        problems += [p for p in library if p.path != name and p.path not in ours]
        if not any(p.severity == "error" for p in problems):
            problems += loader_whole
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


def _check_ds_section(cfg: dict, ds: dict, name: str, exists, keys: bool = True) -> list[Problem]:
    problems: list[Problem] = []
    for key in ds if keys else ():
        if key not in ACCELERATE_DS_KEYS:
            problems.append(_unknown(f"{name}:deepspeed_config.{key}", str(key), ACCELERATE_DS_KEYS))
    if keys:
        problems += _plugin_values_fallback(ds, name)
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
    problems += _check_multinode_launcher(cfg, ds, name, exists)
    return problems


def _check_multinode_launcher(cfg: dict, ds: dict, name: str, exists) -> list[Problem]:
    """Multi-node DeepSpeed launchers other than `standard` run `deepspeed --hostfile H` on machine 0.

    accelerate ``utils/launch.py`` ``prepare_deepspeed_cmd_env`` passes ``--hostfile`` (the string
    "None" when unset); DeepSpeed's runner then finds no hostfile and starts only local ranks, so
    every node that runs the launch trains alone. With a hostfile, pdsh needs ssh to every host.
    """
    machines = cfg.get("num_machines", 1)
    launcher = ds.get("deepspeed_multinode_launcher") or "pdsh"
    hostfile = ds.get("deepspeed_hostfile")
    where = f"{name}:deepspeed_config"
    problems: list[Problem] = []
    if launcher not in DS_MULTINODE_LAUNCHERS:
        return [Problem(f"{where}.deepspeed_multinode_launcher", f"{launcher!r} is not a DeepSpeed multi-node launcher",
                        "use one of " + ", ".join(DS_MULTINODE_LAUNCHERS))]
    if isinstance(hostfile, str) and hostfile and exists is not None and not exists(hostfile):
        problems.append(Problem(f"{where}.deepspeed_hostfile", f"{hostfile} does not exist",
                                "write the hostfile (one 'HOST slots=N' line per machine) or fix the path"))
    if not (_is_int(machines) and machines > 1) or launcher in ("standard", "slurm"):
        return problems
    if not hostfile:
        problems.append(Problem(f"{where}.deepspeed_multinode_launcher",
                                f"multi-node with the {launcher} launcher and no deepspeed_hostfile: DeepSpeed's "
                                "runner finds no hosts and starts ranks on this machine only",
                                "set deepspeed_hostfile to a hostfile, or deepspeed_multinode_launcher: standard "
                                "and run the launch on every node"))
    elif not problems:
        problems.append(Problem(f"{where}.deepspeed_multinode_launcher",
                                f"the {launcher} launcher starts every node from machine 0 through {hostfile}: run "
                                "`accelerate launch` on machine 0 only"
                                + ("; it needs pdsh and passwordless ssh to each host" if launcher == "pdsh" else ""),
                                "nothing if pdsh/ssh work; else deepspeed_multinode_launcher: standard", "warning"))
    return problems


def _plugin_values_fallback(ds: dict, name: str) -> list[Problem]:
    """Without accelerate importable: the values DeepSpeedPlugin converts, against the tables."""
    problems: list[Problem] = []
    where = f"{name}:deepspeed_config"
    stage = ds.get("zero_stage")
    if stage is not None and not (_is_int(stage) and 0 <= stage <= 3):
        problems.append(Problem(f"{where}.zero_stage", f"{stage!r} is not a ZeRO stage", "use 0, 1, 2 or 3"))
    for key in ("offload_optimizer_device", "offload_param_device"):
        value = ds.get(key)
        if value is not None and value not in ("none", "cpu", "nvme"):
            problems.append(Problem(f"{where}.{key}", f"{value!r} is not an offload device",
                                    'use "none", "cpu" or "nvme"'))
    for key in ("zero3_init_flag", "zero3_save_16bit_model"):
        value = ds.get(key)
        if value is not None and not isinstance(value, bool) and str(value).lower() not in (
                "y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"):
            problems.append(Problem(f"{where}.{key}", f"{value!r} is not true/false", f"set {key}: true or false"))
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
