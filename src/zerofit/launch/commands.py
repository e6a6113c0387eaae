"""Multi-node launch: one LaunchSpec -> the command list and environment of every node, in each dialect.

Pure: nothing here runs a process, reads a file or looks at the environment. The four values that
every node must agree on (node count, main address, main port, processes per node) live in one
frozen spec, so the per-node commands cannot disagree; `launch_render` turns them into scripts.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from zerofit.errors import ZerofitError

STYLES = ("accelerate", "torchrun", "torchrun-static", "env", "slurm", "deepspeed")
RDZV_BACKENDS = ("static", "c10d")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ShellVar(str):
    """A token rendered unquoted so the shell expands it on each node, e.g. ``"$SLURM_NODEID"``."""


def _word(value: object) -> str:
    return value if isinstance(value, ShellVar) else str(value)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one job on ``nodes`` machines; identical on every node."""

    nodes: int
    procs_per_node: int
    main_addr: str
    main_port: int
    script: str
    script_args: tuple[str, ...] = ()
    style: str = "accelerate"
    job_id: str = "zerofit"
    config_files: tuple[str, ...] = ()       # accelerate YAML: one shared, or one per node by machine_rank
    use_deepspeed: bool = False
    accelerate_env: tuple[tuple[str, str], ...] = ()  # ACCELERATE_* for torchrun/env/deepspeed styles
    rdzv_backend: str = "static"             # accelerate style; torchrun style is always c10d
    timeout: int = 600                       # seconds a node waits for the others at rendezvous
    hostnames: tuple[str, ...] = ()          # deepspeed hostfile, in node order
    python: str = "python"                   # env style interpreter
    log_dir: str = "logs"                    # slurm

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def config_for(self, rank: int) -> str | None:
        """The accelerate YAML node ``rank`` uses (None when launching without one)."""
        if not self.config_files:
            return None
        return self.config_files[rank] if len(self.config_files) > 1 else self.config_files[0]


def check_address(field: str, value: str) -> str:
    """``value`` if it is an IP address or an RFC 1123 hostname, else ZerofitError."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not isinstance(value, str) or not _HOSTNAME.match(value):
        raise ZerofitError(field, f"{value!r} is not an IP address or hostname",
                           "use e.g. 10.0.0.1 or node001 (letters, digits, '-', '.')")
    return value


def validate_spec(spec: LaunchSpec) -> LaunchSpec:
    """Enforce the rules every node must share; returns ``spec`` or raises ZerofitError."""
    if spec.style not in STYLES:
        raise ZerofitError("style", f"{spec.style!r} is not a launch style", "use one of " + ", ".join(STYLES))
    for name in ("nodes", "procs_per_node", "timeout"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ZerofitError(name, f"{value!r} must be a positive integer", f"set {name} to 1 or more")
    if isinstance(spec.main_port, bool) or not isinstance(spec.main_port, int) or not 1 <= spec.main_port <= 65535:
        raise ZerofitError("main_port", f"{spec.main_port!r} is out of range", "use a port in 1-65535, e.g. 29500")
    check_address("main_addr", spec.main_addr)
    if not _JOB_ID.match(spec.job_id):
        raise ZerofitError("job_id", f"{spec.job_id!r} is not a valid job id", "use letters, digits, '_', '.', '-'")
    if spec.rdzv_backend not in RDZV_BACKENDS:
        raise ZerofitError("rdzv_backend", f"{spec.rdzv_backend!r} is unknown", "use static or c10d")
    if not spec.script or any(c in spec.script for c in "\0\n"):
        raise ZerofitError("script", "no training script given", "append `-- train.py ARGS...`")
    for text in (spec.python, spec.log_dir, *spec.script_args, *spec.config_files):
        if "\0" in text:
            raise ZerofitError("arguments", "contain a NUL byte", "remove it")
    for key, value in spec.accelerate_env:  # also written to .deepspeed_env, one KEY=VALUE per line
        if any(c in value for c in "\0\n"):
            raise ZerofitError(key, "contains a line break", "fix the value in accelerate.yaml")
    if not re.match(r"^[A-Za-z0-9_./-]+$", spec.log_dir):
        raise ZerofitError("log_dir", f"{spec.log_dir!r} has characters #SBATCH lines cannot hold",
                           "use letters, digits, '_', '.', '/', '-'")
    if len(spec.config_files) not in (0, 1, spec.nodes):
        raise ZerofitError("config", f"{len(spec.config_files)} config files for {spec.nodes} nodes",
                           "give one shared accelerate.yaml or exactly one per node")
    if spec.style == "accelerate" and not spec.config_files:
        raise ZerofitError("config", "the accelerate style needs an accelerate.yaml",
                           "pass --config accelerate.yaml (from `zerofit config`) or use --style torchrun")
    if spec.hostnames:
        if len(spec.hostnames) != spec.nodes:
            raise ZerofitError("hosts", f"{len(spec.hostnames)} hosts for {spec.nodes} nodes", "list one host per node")
        if len(set(spec.hostnames)) != len(spec.hostnames):
            raise ZerofitError("hosts", "a host is listed twice", "list each node once")
        for host in spec.hostnames:
            check_address("hosts", host)
    return spec


def rdzv_endpoint(addr: str, port: int | str) -> str:
    """``host:port``; IPv6 addresses get the brackets torchrun expects; ShellVars stay expandable."""
    if isinstance(addr, ShellVar) or isinstance(port, ShellVar):
        return ShellVar(f'"{addr.strip(chr(34))}:{str(port).strip(chr(34))}"')
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def build_accelerate_cmd(spec: LaunchSpec, rank: int | ShellVar, addr: str | None = None,
                         port: int | str | None = None) -> list[str]:
    """``accelerate launch`` for node ``rank``; ``addr``/``port`` may be ShellVars (slurm)."""
    addr = spec.main_addr if addr is None else addr
    port = spec.main_port if port is None else port
    config = spec.config_for(rank if isinstance(rank, int) else 0)
    cmd = ["accelerate", "launch"]
    if config:
        cmd += ["--config_file", config]
    cmd += ["--num_machines", str(spec.nodes), "--machine_rank", _word(rank),
            "--main_process_ip", addr, "--main_process_port", _word(port),
            "--num_processes", str(spec.world_size)]
    if spec.nodes > 1:
        if spec.use_deepspeed:  # pdsh (the default) needs ssh + a hostfile; standard = torchrun per node
            cmd += ["--deepspeed_multinode_launcher", "standard"]
        key = "timeout" if spec.rdzv_backend == "static" else "join_timeout"
        cmd += ["--rdzv_backend", spec.rdzv_backend, "--rdzv_conf", f"{key}={spec.timeout}"]
    return cmd + [spec.script, *spec.script_args]


def build_torchrun_cmd(spec: LaunchSpec, rank: int | ShellVar, static: bool = False,
                       addr: str | None = None, port: int | str | None = None,
                       job_id: str | None = None) -> list[str]:
    """``torchrun`` for node ``rank``: c10d rendezvous, or the static node_rank/master form."""
    addr = spec.main_addr if addr is None else addr
    port = spec.main_port if port is None else port
    cmd = ["torchrun", "--nnodes", str(spec.nodes), "--nproc_per_node", str(spec.procs_per_node)]
    if static:
        cmd += ["--node_rank", _word(rank), "--master_addr", addr, "--master_port", _word(port),
                "--rdzv_conf", f"timeout={spec.timeout}"]
    else:  # c10d assigns ranks itself and ignores --node_rank, so none is passed
        cmd += ["--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv_endpoint(addr, port),
                "--rdzv_id", job_id or spec.job_id, "--rdzv_conf", f"join_timeout={spec.timeout}"]
    return cmd + [spec.script, *spec.script_args]


def build_rank_env(spec: LaunchSpec, node_rank: int, local_rank: int) -> dict[str, str]:
    """The torch.distributed ``env://`` variables of one process (plain DDP scripts)."""
    return {
        "MASTER_ADDR": spec.main_addr, "MASTER_PORT": str(spec.main_port),
        "WORLD_SIZE": str(spec.world_size), "NODE_RANK": str(node_rank),
        "RANK": str(node_rank * spec.procs_per_node + local_rank), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(spec.procs_per_node),
    }


def build_env_cmd(spec: LaunchSpec) -> list[str]:
    """What each env-style process runs (its rank comes from the environment)."""
    return [spec.python, spec.script, *spec.script_args]


def build_deepspeed_cmd(spec: LaunchSpec) -> list[str]:
    """DeepSpeed's own launcher over ``hostfile`` (it reaches the other hosts with pdsh/ssh)."""
    cmd = ["deepspeed", "--hostfile", "hostfile", "--num_nodes", str(spec.nodes),
           "--num_gpus", str(spec.procs_per_node), "--master_addr", spec.main_addr,
           "--master_port", str(spec.main_port)]
    if spec.config_files:  # accelerate scripts read their rank from the env, not --local_rank
        cmd.append("--no_local_rank")
    return cmd + [spec.script, *spec.script_args]
