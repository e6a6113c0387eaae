"""accelerate.yaml (ClusterConfig) -> LaunchSpec: the config files' rules, their DeepSpeed
environment, and the merge with command-line flags. Pure: the caller reads the YAML files.
"""

from __future__ import annotations

from typing import Any

from zerofit.errors import ZerofitError
from zerofit.launch.commands import LaunchSpec, count_words, validate_spec

# ClusterConfig.deepspeed_config key -> the variable `accelerate launch` exports for it, so a
# torchrun / env / deepspeed launch of the same script configures DeepSpeed identically.
DS_ENV_MAPPING = {
    "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
}


def config_total_processes(config: dict[str, Any]) -> Any:
    """The file's num_processes (every GPU of every node), or None where it leaves the count to
    the command line, as the shipped presets do.

    accelerate's loader (commands/config/config_args.py, ``load_config_from_file``) makes an absent
    num_processes 1 only for distributed_type NO; otherwise it stays ClusterConfig's -1, which
    ``accelerate launch`` (commands/launch.py, ``_validate_launch_command``) refuses without
    ``--num_processes``.
    """
    distributed = config.get("distributed_type", "NO") != "NO"
    total = config.get("num_processes", -1 if distributed else 1)
    return None if total == -1 else total


def validate_cluster_configs(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Check accelerate YAMLs (one shared, or one per node) agree; return the shared settings.

    Every file must hold the same num_machines, num_processes (total), main_process_ip/port and
    distributed_type; per-node files need machine_rank 0..N-1, each exactly once, in order.
    """
    if not configs:
        raise ZerofitError("config", "no accelerate config given", "pass --config accelerate.yaml")
    first = configs[0]
    for key in (
        "num_machines",
        "num_processes",
        "main_process_ip",
        "main_process_port",
        "distributed_type",
    ):
        values = [c.get(key) for c in configs]
        if len(set(map(str, values))) > 1:
            raise ZerofitError(
                key,
                f"differs between the config files ({', '.join(map(str, values))})",
                f"set the same {key} in every node's accelerate.yaml",
            )
    machines = first.get("num_machines", 1)
    total = config_total_processes(first)
    for key, value in (("num_machines", machines), ("num_processes", total)):
        if value is None:  # left to --num_processes / --gpus-per-node
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ZerofitError(
                key, f"{value!r} must be a positive integer", f"fix {key} in accelerate.yaml"
            )
    if total is not None and total % machines:
        raise ZerofitError(
            "num_processes",
            f"{total} (total over all nodes) is not divisible by " f"num_machines {machines}",
            "num_processes counts every GPU of every node: use N x M",
        )
    if len(configs) > 1:
        ranks = [c.get("machine_rank", 0) for c in configs]
        if len(configs) != machines:
            raise ZerofitError(
                "config",
                f"{count_words(len(configs), 'config file')} for num_machines {machines}",
                "give one file per node, or one shared file",
            )
        if sorted(ranks) != list(range(machines)):
            raise ZerofitError(
                "machine_rank",
                f"ranks {ranks} are not unique and 0..{machines - 1}",
                "give each node's file its own machine_rank, starting at 0",
            )
        if ranks != list(range(machines)):
            raise ZerofitError(
                "machine_rank",
                f"files are in rank order {ranks}",
                "list the config files by machine_rank: node 0's first",
            )
    return first


# Keys `accelerate launch` refuses next to a deepspeed_config_file (the JSON decides them).
_IGNORED_WITH_DS_FILE = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
)


def check_ds_file_conflicts(config: dict[str, Any]) -> None:
    """Raise the ZerofitError `accelerate launch` would turn into a traceback on every node."""
    ds = config.get("deepspeed_config") or {}
    if config.get("distributed_type") != "DEEPSPEED" or not ds.get("deepspeed_config_file"):
        return
    clash = [k for k in _IGNORED_WITH_DS_FILE if k in ds] + (
        ["mixed_precision"] if "mixed_precision" in config else []
    )
    if clash:
        raise ZerofitError(
            "config",
            f"accelerate.yaml sets {', '.join(clash)} next to deepspeed_config_file, "
            "which `accelerate launch` refuses",
            "remove them; the DeepSpeed JSON decides",
        )


def build_accelerate_env(config: dict[str, Any]) -> dict[str, str]:
    """The ACCELERATE_* variables `accelerate launch` would set for this config (DeepSpeed part)."""
    env: dict[str, str] = {}
    if config.get("distributed_type") != "DEEPSPEED":
        return env
    env["ACCELERATE_USE_DEEPSPEED"] = "true"
    if config.get("mixed_precision"):
        env["ACCELERATE_MIXED_PRECISION"] = str(config["mixed_precision"])
    ds = config.get("deepspeed_config") or {}
    for key, var in DS_ENV_MAPPING.items():
        if ds.get("deepspeed_config_file") and key in _IGNORED_WITH_DS_FILE:
            continue  # accelerate ignores them next to a JSON file; exporting them would conflict
        value = ds.get(key)
        if value is not None:
            env[var] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def check_config_sizes(
    shared: dict[str, Any], nodes: int | None, procs_per_node: int | None
) -> tuple[int, int]:
    """(nodes, processes per node) from accelerate.yaml; flags may restate them, not change them.

    The DeepSpeed JSON's batch arithmetic was computed for the config's world size.
    """
    cfg_nodes = shared.get("num_machines", 1)
    total = config_total_processes(shared)
    if total is None:  # a preset: the count comes from the command line
        if procs_per_node is None:
            raise ZerofitError(
                "gpus_per_node",
                "accelerate.yaml leaves num_processes to the command line",
                "pass --gpus-per-node M (the GPUs of each node)",
            )
        total = procs_per_node * cfg_nodes
    cfg_procs = total // cfg_nodes
    for flag, given, expected in (
        ("nodes", nodes, cfg_nodes),
        ("gpus_per_node", procs_per_node, cfg_procs),
    ):
        if given is not None and given != expected:
            raise ZerofitError(
                flag,
                f"{given} disagrees with accelerate.yaml ({expected}; num_processes there is"
                " the total of all nodes)",
                "regenerate with `zerofit config` or drop the flag",
            )
    return cfg_nodes, cfg_procs


def merge_config(configs: list[dict[str, Any]], flags: dict[str, Any]) -> tuple[dict, list[str]]:
    """``flags`` completed from accelerate.yaml(s), plus warnings where a flag overrides the file.

    The address and port may be overridden (a warning says so); the sizes may not.
    """
    shared = validate_cluster_configs(configs)
    merged = dict(flags)
    merged["nodes"], merged["procs_per_node"] = check_config_sizes(
        shared, flags.get("nodes"), flags.get("procs_per_node")
    )
    warnings = []
    for name, key, cfg_key in (
        ("main address", "main_addr", "main_process_ip"),
        ("main port", "main_port", "main_process_port"),
    ):
        given, value = flags.get(key), shared.get(cfg_key)
        if given is not None and value is not None and str(given) != str(value):
            warnings.append(
                f"{name}: using {given} from the command line, not {value} from accelerate.yaml"
            )
    merged["main_addr"] = flags.get("main_addr") or shared.get("main_process_ip")
    if flags.get("main_port") is None:
        merged["main_port"] = shared.get("main_process_port")
    merged["use_deepspeed"] = shared.get("distributed_type") == "DEEPSPEED"
    merged["accelerate_env"] = tuple(build_accelerate_env(shared).items())
    if flags.get("rdzv_backend") is None:
        merged["rdzv_backend"] = shared.get("rdzv_backend") or "static"
    launcher = (shared.get("deepspeed_config") or {}).get("deepspeed_multinode_launcher") or "pdsh"
    node_scripts = (flags.get("style") or "accelerate") == "accelerate"
    if merged["use_deepspeed"] and merged["nodes"] > 1 and launcher != "standard" and node_scripts:
        warnings.append(
            f"accelerate.yaml sets deepspeed_multinode_launcher: {launcher}, which needs pdsh, "
            "passwordless ssh and a hostfile; the node scripts pass "
            "--deepspeed_multinode_launcher standard (torchrun on each node) instead"
        )
    return merged, warnings


def default_main_addr(style: str, nodes: int, hostnames: tuple[str, ...]) -> str:
    """The main address when no flag or accelerate.yaml gives one; ZerofitError if one is needed."""
    if style == "deepspeed":
        return hostnames[0] if hostnames else "node0"
    if style == "slurm" or nodes == 1:
        return "127.0.0.1"  # slurm reads the real one from scontrol at run time
    raise ZerofitError(
        "main_addr",
        f"is needed for {nodes} nodes",
        "pass --main-addr with node 0's address on the network the nodes share",
    )


def loopback_warnings(style: str, nodes: int, main_addr: str) -> list[str]:
    """A multi-node main address only this machine can reach (fine for a local test)."""
    loopback = main_addr == "localhost" or main_addr.startswith("127.") or main_addr == "::1"
    if nodes == 1 or style == "slurm" or not loopback:
        return []
    return [
        f"main address {main_addr} is loopback: only a single machine can reach it "
        "(fine for a local test); pass --main-addr with node 0's address on the shared network"
    ]


def build_spec(
    configs: list[dict[str, Any]] = (), config_paths: tuple[str, ...] = (), **flags: Any
) -> tuple[LaunchSpec, list[str]]:
    """Merge accelerate YAML(s) and flags into a validated spec, plus warnings for the user.

    ``flags`` are LaunchSpec fields (``style``, ``nodes``, ``procs_per_node``, ``main_addr``,
    ``main_port``, ``script``, ``script_args``, ``job_id``, ...); None means not given. Flags may
    restate the config but not contradict its sizes (see check_config_sizes).
    """
    warnings: list[str] = []
    fields = dict(flags)
    if configs:
        fields, warnings = merge_config(list(configs), fields)
    nodes, procs_per_node = fields.get("nodes"), fields.get("procs_per_node")
    if nodes is None or procs_per_node is None:
        missing = "nodes" if nodes is None else "gpus_per_node"
        raise ZerofitError(
            missing, "is not given", "pass --nodes N --gpus-per-node M, or --config accelerate.yaml"
        )
    style = fields["style"] = fields.get("style") or ("accelerate" if configs else "torchrun")
    if configs and style in ("accelerate", "slurm"):
        check_ds_file_conflicts(configs[0])
    if fields.get("rdzv_backend") is None:
        fields["rdzv_backend"] = "static"
    hostnames = fields["hostnames"] = tuple(fields.get("hostnames") or ())
    if fields.get("main_addr") is None:
        fields["main_addr"] = default_main_addr(style, nodes, hostnames)
    fields["main_addr"] = str(fields["main_addr"])
    warnings += loopback_warnings(style, nodes, fields["main_addr"])
    if fields.get("main_port") is None:
        fields["main_port"] = 29500
    fields["script_args"] = tuple(fields.get("script_args", ()))
    spec = LaunchSpec(config_files=tuple(config_paths), **fields)
    return validate_spec(spec), warnings
