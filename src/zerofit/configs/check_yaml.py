"""check, the accelerate YAML rules: keys, process and machine counts, the DeepSpeed section, launchers.

With accelerate importable its own loader, launch flags and conversions judge keys and values
(``check_ecosystem``); the rules here add what accelerate only finds at run time, or never.
"""

from __future__ import annotations

from typing import Callable

from zerofit.configs.check_problem import (
    Problem,
    is_int,
    not_a_mapping,
    type_problem,
    unknown_key,
    want,
)
from zerofit.configs.check_tables import (
    ACCELERATE_DS_KEYS,
    ACCELERATE_KEYS,
    DISTRIBUTED_TYPES,
    DS_FILE_CONFLICTS,
    DS_MULTINODE_LAUNCHERS,
    MIXED_PRECISIONS,
)


def check_accelerate(
    cfg: dict,
    name: str = "accelerate.yaml",
    exists: Callable[[str], bool] | None = None,
    use_libraries: bool = True,
) -> list[Problem]:
    """Problems in one accelerate config dict (ClusterConfig keys).

    With accelerate importable its loader, launch flags and DeepSpeedPlugin conversions judge keys
    and values (``check_ecosystem.check_accelerate_loader``); else the tables in ``check_tables``.
    """
    if not isinstance(cfg, dict):
        return [not_a_mapping(name)]
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
                problems.append(unknown_key(f"{name}:{key}", str(key), ACCELERATE_KEYS))
            continue
        problem = None if value is None else type_problem(ACCELERATE_KEYS[key], value)
        if problem:
            problems.append(
                Problem(
                    f"{name}:{key}",
                    f"{value!r} {problem}",
                    f"set {key} to {want(ACCELERATE_KEYS[key])}",
                )
            )
    dtype = cfg.get("distributed_type")
    if "distributed_type" not in cfg:
        problems.append(
            Problem(
                f"{name}:distributed_type",
                "is missing (accelerate refuses the file)",
                "add distributed_type: DEEPSPEED (or MULTI_GPU / NO)",
            )
        )
    elif dtype not in DISTRIBUTED_TYPES:
        problems.append(
            Problem(
                f"{name}:distributed_type",
                f"{dtype!r} is not a distributed type",
                "use one of " + ", ".join(DISTRIBUTED_TYPES),
            )
        )
    mp = cfg.get("mixed_precision")
    if mp is not None and mp not in MIXED_PRECISIONS:
        problems.append(
            Problem(
                f"{name}:mixed_precision",
                f"{mp!r} is not a precision",
                "use one of " + ", ".join(MIXED_PRECISIONS),
            )
        )
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
    procs, machines, rank = (
        cfg.get("num_processes", 1),
        cfg.get("num_machines", 1),
        cfg.get("machine_rank", 0),
    )
    if not (is_int(procs) and is_int(machines) and procs > 0 and machines > 0):
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
                    f"{name}:num_machines",
                    f"{machines} is not a machine count",
                    "set it to 1 or more",
                )
            )
        return problems
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
    if is_int(rank) and not 0 <= rank < machines:
        problems.append(
            Problem(
                f"{name}:machine_rank",
                f"{rank} is outside 0..{machines - 1}",
                "give each machine its own rank from 0 to num_machines-1",
            )
        )
    if machines > 1:
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


def _check_ds_section(cfg: dict, ds: dict, name: str, exists, keys: bool = True) -> list[Problem]:
    problems: list[Problem] = []
    for key in ds if keys else ():
        if key not in ACCELERATE_DS_KEYS:
            problems.append(
                unknown_key(f"{name}:deepspeed_config.{key}", str(key), ACCELERATE_DS_KEYS)
            )
    if keys:
        problems += _plugin_values_fallback(ds, name)
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
        return [
            Problem(
                f"{where}.deepspeed_multinode_launcher",
                f"{launcher!r} is not a DeepSpeed multi-node launcher",
                "use one of " + ", ".join(DS_MULTINODE_LAUNCHERS),
            )
        ]
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
        problems.append(
            Problem(
                f"{where}.deepspeed_multinode_launcher",
                f"the {launcher} launcher starts every node from machine 0 through {hostfile}: run "
                "`accelerate launch` on machine 0 only"
                + (
                    "; it needs pdsh and passwordless ssh to each host"
                    if launcher == "pdsh"
                    else ""
                ),
                "nothing if pdsh/ssh work; else deepspeed_multinode_launcher: standard",
                "warning",
            )
        )
    return problems


def _plugin_values_fallback(ds: dict, name: str) -> list[Problem]:
    """Without accelerate importable: the values DeepSpeedPlugin converts, against the tables."""
    problems: list[Problem] = []
    where = f"{name}:deepspeed_config"
    stage = ds.get("zero_stage")
    if stage is not None and not (is_int(stage) and 0 <= stage <= 3):
        problems.append(
            Problem(f"{where}.zero_stage", f"{stage!r} is not a ZeRO stage", "use 0, 1, 2 or 3")
        )
    for key in ("offload_optimizer_device", "offload_param_device"):
        value = ds.get(key)
        if value is not None and value not in ("none", "cpu", "nvme"):
            problems.append(
                Problem(
                    f"{where}.{key}",
                    f"{value!r} is not an offload device",
                    'use "none", "cpu" or "nvme"',
                )
            )
    for key in ("zero3_init_flag", "zero3_save_16bit_model"):
        value = ds.get(key)
        if (
            value is not None
            and not isinstance(value, bool)
            and str(value).lower()
            not in ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0")
        ):
            problems.append(
                Problem(
                    f"{where}.{key}", f"{value!r} is not true/false", f"set {key}: true or false"
                )
            )
    return problems
