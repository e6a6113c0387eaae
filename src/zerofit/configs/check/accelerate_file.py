"""check, one accelerate YAML: accelerate's own loader, enums and launch flags, then launch rules.

accelerate judges keys and values: the top-level keys are ``ClusterConfig``'s fields (plus the
legacy ones ``process_config`` converts), nested keys must be ``accelerate launch`` flags
(``commands/launch.py``: ``_validate_launch_command`` copies them onto its arguments and silently
ignores the ones it has no flag for), distributed types, precisions and multi-node launchers are
accelerate's enums and constants, ``DeepSpeedPlugin``'s conversions (``str_to_bool``) and the ZeRO
section it builds are run as the launch runs them, and ``ClusterConfig(**process_config(cfg))`` is
what ``load_config_from_file`` does. zerofit's rules add what accelerate only finds at run time,
or never: process and machine counts, the DeepSpeed section next to a JSON file, the multi-node
launcher and its hostfile, and FSDP, which zerofit does not model.
"""

from __future__ import annotations

import copy
import functools
import importlib
import sys
import types
import typing
from types import ModuleType
from typing import Any, Callable

from zerofit.configs.check.deepspeed_file import first_line, quiet_libraries, validate_model
from zerofit.configs.check.facts import (
    ACCELERATE_LEGACY_KEYS,
    DS_FILE_CONFLICTS,
    NESTED_LAUNCH_SECTIONS,
    PLUGIN_BOOL_KEYS,
    PLUGIN_TO_ZERO,
)
from zerofit.configs.check.problems import (
    Problem,
    is_int,
    not_a_mapping,
    suggest_key,
    type_problem,
)
from zerofit.errors import ZerofitError
from zerofit.memory.ds_config import NOT_MODELLED
from zerofit.memory.ds_defaults import import_deepspeed

_REINSTALL = "reinstall it (pip install --force-reinstall accelerate); zerofit reads its loader"


def import_accelerate(module: str = "accelerate") -> ModuleType:
    """``accelerate`` (or one of its modules); a broken install is one ZerofitError."""
    try:
        if sys.modules.get("accelerate") is None:
            importlib.import_module("accelerate")
        return importlib.import_module(module)
    except Exception as exc:  # an import error or a broken dependency
        raise ZerofitError(
            "accelerate", f"cannot be imported ({first_line(exc)})", _REINSTALL
        ) from None


def accelerate_version() -> str:
    """The installed accelerate's version (a broken install is a ZerofitError)."""
    return getattr(import_accelerate(), "__version__", "?")


def check_accelerate(
    cfg: dict,
    name: str = "accelerate.yaml",
    exists: Callable[[str], bool] | None = None,
) -> list[Problem]:
    """Problems in one accelerate config dict (``ClusterConfig`` keys).

    ``exists``: predicate for the paths the YAML names (``deepspeed_config_file``,
    ``deepspeed_hostfile``); None skips those checks.
    """
    if not isinstance(cfg, dict):
        return [not_a_mapping(name)]
    accelerate_version()  # a broken install stops here, as one error
    problems = _unknown_keys(cfg, name) + _value_types(cfg, name)
    problems += _check_enums(cfg, name)
    problems += _check_processes(cfg, name)
    ds = cfg.get("deepspeed_config")
    if isinstance(ds, dict):
        if cfg.get("distributed_type") == "DEEPSPEED":
            problems += _check_ds_section(cfg, ds, name, exists)
        problems += _check_plugin_values(ds, name)
    # The loader stops at the first problem, which the rules above already name with a fix: its
    # verdict on the whole file counts only when they found no error.
    if not any(p.severity == "error" for p in problems):
        problems += _load(cfg, name)
    return problems


# --------------------------------------------------------------------------- accelerate's verdicts
@functools.lru_cache(maxsize=1)
def _cluster_fields() -> dict[str, Any]:
    """ClusterConfig's fields and their annotations (config_args.py, BaseConfig's included)."""
    config_args = import_accelerate("accelerate.commands.config.config_args")
    return typing.get_type_hints(config_args.ClusterConfig)


@functools.lru_cache(maxsize=1)
def _launch_flags() -> frozenset[str]:
    """Every ``accelerate launch`` option name without dashes (what nested YAML keys become)."""
    parser = import_accelerate("accelerate.commands.launch").launch_command_parser()
    return frozenset(o.lstrip("-") for a in parser._actions for o in a.option_strings)


def accelerate_keys() -> frozenset[str]:
    """The top-level keys accelerate's loader takes: ``ClusterConfig``'s fields and the legacy
    keys ``process_config`` converts."""
    return frozenset(_cluster_fields()) | ACCELERATE_LEGACY_KEYS


def _unknown_keys(cfg: dict, name: str) -> list[Problem]:
    top = accelerate_keys()
    problems = [
        Problem(
            f"{name}:{key}",
            "is not a key accelerate knows (its loader refuses the file)",
            suggest_key(key, top),
        )
        for key in cfg
        if not isinstance(key, str) or key not in top
    ]
    flags = _launch_flags()
    for section, prefix in NESTED_LAUNCH_SECTIONS.items():
        block = cfg.get(section)
        for key in block if isinstance(block, dict) else ():
            flag = str(key) if str(key).startswith(prefix) else prefix + str(key)
            if flag in flags:
                continue
            known = sorted(f for f in flags if f.startswith(prefix or section.split("_")[0]))
            problems.append(
                Problem(
                    f"{name}:{section}.{key}",
                    "is not an accelerate launch setting (accelerate ignores it silently)",
                    suggest_key(flag, known or flags),
                )
            )
    return problems


def _value_types(cfg: dict, name: str) -> list[Problem]:
    """Counts, ports and sections of the wrong type, by ClusterConfig's annotations.

    Only int, dict and list: accelerate computes with those and crashes on anything else, while
    its bool and str fields take the strings `accelerate config` itself writes ('no').
    """
    problems = []
    for key, annotation in _cluster_fields().items():
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        kind = typing.get_origin(annotation) or annotation
        if len(inner) == 1 and kind in (typing.Union, types.UnionType):
            kind = typing.get_origin(inner[0]) or inner[0]
        if kind in (int, dict, list) and cfg.get(key) is not None:
            problem = type_problem(f"{name}:{key}", key, cfg[key], kind)
            problems += [problem] if problem else []
    return problems


def _check_enums(cfg: dict, name: str) -> list[Problem]:
    """distributed_type and mixed_precision against accelerate's enums; FSDP is not modelled."""
    utils = import_accelerate("accelerate.utils")
    types = [member.value for member in utils.DistributedType]
    precisions = [member.value for member in utils.PrecisionType]
    dtype, mp = cfg.get("distributed_type"), cfg.get("mixed_precision")
    problems = []
    if "distributed_type" not in cfg:
        problems.append(
            Problem(
                f"{name}:distributed_type",
                "is missing (accelerate refuses the file)",
                "add distributed_type: DEEPSPEED (or MULTI_GPU / NO)",
            )
        )
    elif dtype not in types:
        problems.append(
            Problem(
                f"{name}:distributed_type",
                f"{dtype!r} is not a distributed type",
                "use one of " + ", ".join(types),
            )
        )
    elif dtype in NOT_MODELLED:
        problems.append(not_modelled(f"{name}:distributed_type", dtype))
    if mp is not None and mp not in precisions:
        problems.append(
            Problem(
                f"{name}:mixed_precision",
                f"{mp!r} is not a precision",
                "use one of " + ", ".join(precisions),
            )
        )
    return problems


def not_modelled(where: str, dtype: str) -> Problem:
    """A valid distributed type zerofit cannot estimate: a warning, since accelerate runs it."""
    return Problem(
        where,
        f"{dtype} runs, but zerofit does not model its memory yet: `zerofit estimate` refuses "
        "this file, and check judged only accelerate's own keys and values",
        "nothing for the run itself; for a memory estimate, estimate the DeepSpeed equivalent "
        f"({NOT_MODELLED[dtype]})",
        "warning",
    )


def _load(cfg: dict, name: str) -> list[Problem]:
    """The whole file through ``ClusterConfig(**ClusterConfig.process_config(cfg))``."""
    config_args = import_accelerate("accelerate.commands.config.config_args")
    try:
        with quiet_libraries():
            config_args.ClusterConfig(
                **config_args.ClusterConfig.process_config(copy.deepcopy(cfg))
            )
    except Exception as exc:  # enum conversions raise ValueError, bad kwargs TypeError
        return [
            Problem(
                name,
                f"accelerate's loader refuses it: {first_line(exc)}",
                "fix the value named in the message (compare with `accelerate config`)",
            )
        ]
    return []


def _check_plugin_values(ds: dict, name: str) -> list[Problem]:
    """The DeepSpeed values of an accelerate YAML, converted and validated as the launch would."""
    str_to_bool = import_accelerate("accelerate.utils").str_to_bool
    problems: list[Problem] = []
    for key in PLUGIN_BOOL_KEYS:
        value = ds.get(key)
        if value is None or isinstance(value, bool):
            continue
        try:
            str_to_bool(str(value))
        except ValueError:
            problems.append(
                Problem(
                    f"{name}:deepspeed_config.{key}",
                    f"{value!r} is not true/false (accelerate's str_to_bool raises at start-up)",
                    f"set {key}: true or false",
                )
            )
    if ds.get("deepspeed_config_file"):
        return problems  # the JSON holds the ZeRO settings; check reads it separately
    zero: dict[str, Any] = {}
    for key, path in PLUGIN_TO_ZERO.items():
        value = ds.get(key)
        if value is None:
            continue
        if key == "zero_stage" and isinstance(value, str) and value.isdigit():
            value = int(value)  # accelerate passes it through the environment as text
        node = zero
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    if not zero:
        return problems
    zero_config = import_deepspeed("deepspeed.runtime.zero.config").DeepSpeedZeroConfig
    yaml_key = {".".join(path): key for key, path in PLUGIN_TO_ZERO.items()}
    for p in validate_model(zero_config, zero, "", "\0"):
        inner = p.path.split(":", 1)[1]
        key = yaml_key.get(inner, inner)
        problems.append(Problem(f"{name}:deepspeed_config.{key}", p.message, p.fix, p.severity))
    return problems


# --------------------------------------------------------------------------- zerofit's own rules
def _check_processes(cfg: dict, name: str) -> list[Problem]:
    """Process and machine counts, the machine rank, and a multi-machine rendezvous."""
    procs = cfg.get("num_processes", 1)
    machines = cfg.get("num_machines", 1)
    if not (is_int(procs) and is_int(machines) and procs > 0 and machines > 0):
        return _bad_counts(procs, machines, name)
    problems = []
    if procs % machines:
        problems.append(
            Problem(
                f"{name}:num_processes",
                f"{procs} processes do not split evenly over {machines} machines "
                "(uneven GPUs per node hang at start-up)",
                f"num_processes is the TOTAL across machines: use a multiple of {machines}, "
                f"e.g. {machines * max(1, procs // machines)}",
            )
        )
    elif machines > 1 and procs == machines and cfg.get("distributed_type") == "DEEPSPEED":
        problems.append(
            Problem(
                f"{name}:num_processes",
                f"{procs} processes on {machines} machines is 1 GPU per machine",
                "num_processes is the TOTAL across machines (GPUs per node x machines); "
                "ignore this if each machine really has one GPU",
                "warning",
            )
        )
    rank = cfg.get("machine_rank", 0)
    if is_int(rank) and not 0 <= rank < machines:
        problems.append(
            Problem(
                f"{name}:machine_rank",
                f"{rank} is outside 0..{machines - 1}",
                "give each machine its own rank from 0 to num_machines-1",
            )
        )
    if machines > 1:
        problems += _check_rendezvous(cfg, name)
    return problems


def _bad_counts(procs: Any, machines: Any, name: str) -> list[Problem]:
    problems = []
    if is_int(procs) and procs < 1 and procs != -1:
        problems.append(
            Problem(
                f"{name}:num_processes",
                f"{procs} is not a process count",
                "set it to the total number of GPUs across all machines",
            )
        )
    if is_int(machines) and machines < 1:
        problems.append(
            Problem(
                f"{name}:num_machines", f"{machines} is not a machine count", "set it to 1 or more"
            )
        )
    return problems


def _check_rendezvous(cfg: dict, name: str) -> list[Problem]:
    problems = []
    if not cfg.get("main_process_ip"):
        problems.append(
            Problem(
                f"{name}:main_process_ip",
                "multi-machine runs need the rank-0 machine's address",
                "set main_process_ip to machine 0's IP address",
            )
        )
    if cfg.get("main_process_port") is None:
        problems.append(
            Problem(
                f"{name}:main_process_port",
                "multi-machine runs need a rendezvous port",
                "set main_process_port, e.g. 29500 (open between the machines)",
            )
        )
    return problems


def _check_ds_section(cfg: dict, ds: dict, name: str, exists) -> list[Problem]:
    """The DeepSpeed section next to a JSON file, and the multi-node launcher."""
    problems: list[Problem] = []
    path = ds.get("deepspeed_config_file")
    if isinstance(path, str) and path not in ("", "none"):
        for key in ds:
            if key in DS_FILE_CONFLICTS:
                problems.append(
                    Problem(
                        f"{name}:deepspeed_config.{key}",
                        "is ignored next to deepspeed_config_file and accelerate launch refuses it",
                        f"remove it and set the value in {path}",
                    )
                )
        if cfg.get("mixed_precision") is not None:
            problems.append(
                Problem(
                    f"{name}:mixed_precision",
                    "accelerate launch refuses mixed_precision next to deepspeed_config_file",
                    f"remove it; precision is the bf16/fp16 block of {path}",
                )
            )
        if exists is not None and not exists(path):
            problems.append(
                Problem(
                    f"{name}:deepspeed_config.deepspeed_config_file",
                    f"{path} does not exist (it is opened relative to the launch directory)",
                    "fix the path, or launch from the directory it is relative to",
                )
            )
    return problems + _check_multinode_launcher(cfg, ds, name, exists)


def _check_multinode_launcher(cfg: dict, ds: dict, name: str, exists) -> list[Problem]:
    """Multi-node launchers other than `standard` run `deepspeed --hostfile H` on machine 0.

    accelerate ``utils/launch.py`` ``prepare_deepspeed_cmd_env`` passes ``--hostfile`` (the string
    "None" when unset); DeepSpeed's runner then finds no hostfile and starts only local ranks, so
    every node that runs the launch trains alone. With a hostfile, pdsh needs ssh to every host.
    """
    launchers = list(import_accelerate("accelerate.utils.constants").DEEPSPEED_MULTINODE_LAUNCHERS)
    machines = cfg.get("num_machines", 1)
    launcher = ds.get("deepspeed_multinode_launcher") or launchers[0]
    hostfile = ds.get("deepspeed_hostfile")
    where = f"{name}:deepspeed_config"
    if launcher not in launchers:
        return [
            Problem(
                f"{where}.deepspeed_multinode_launcher",
                f"{launcher!r} is not a DeepSpeed multi-node launcher",
                "use one of " + ", ".join(launchers),
            )
        ]
    problems: list[Problem] = []
    if isinstance(hostfile, str) and hostfile and exists is not None and not exists(hostfile):
        problems.append(
            Problem(
                f"{where}.deepspeed_hostfile",
                f"{hostfile} does not exist",
                "write the hostfile (one 'HOST slots=N' line per machine) or fix the path",
            )
        )
    if not (is_int(machines) and machines > 1) or launcher in ("standard", "slurm"):
        return problems
    if not hostfile:
        problems.append(
            Problem(
                f"{where}.deepspeed_multinode_launcher",
                f"multi-node with the {launcher} launcher and no deepspeed_hostfile: DeepSpeed's "
                "runner finds no hosts and starts ranks on this machine only",
                "set deepspeed_hostfile to a hostfile, or deepspeed_multinode_launcher: standard "
                "and run the launch on every node",
            )
        )
    elif not problems:
        ssh = "; it needs pdsh and passwordless ssh to each host" if launcher == "pdsh" else ""
        problems.append(
            Problem(
                f"{where}.deepspeed_multinode_launcher",
                f"the {launcher} launcher starts every node from machine 0 through {hostfile}: run "
                "`accelerate launch` on machine 0 only" + ssh,
                "nothing if pdsh/ssh work; else deepspeed_multinode_launcher: standard",
                "warning",
            )
        )
    return problems
