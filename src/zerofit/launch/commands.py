"""Multi-node launch: one LaunchSpec -> the command list and environment of every node, in each
dialect.

Pure: nothing here runs a process, reads a file or looks at the environment. The four values that
every node must agree on (node count, main address, main port, processes per node) live in one
frozen spec, so the per-node commands cannot disagree; `render.py` turns them into scripts.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from zerofit.addresses import check_address  # shared with `zerofit config`
from zerofit.errors import ZerofitError

STYLES = ("accelerate", "torchrun", "torchrun-static", "env", "slurm", "deepspeed")
RDZV_BACKENDS = ("static", "c10d")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
# What DeepSpeed's runner writes unquoted into the remote `export K=V;` (multinode_runner.py,
# MultiNodeRunner.add_export); anything else it wraps in double quotes, where $ ` " \ stay live.
_DS_ENV_UNSAFE = re.compile(r'[$`"\\\n\0]')


def count_words(count: int, noun: str, plural: str | None = None) -> str:
    """``1 node``, ``2 nodes``: the count and its noun, singular or plural."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


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
    config_files: tuple[
        str, ...
    ] = ()  # accelerate YAML: one shared, or one per node by machine_rank
    use_deepspeed: bool = False
    accelerate_env: tuple[
        tuple[str, str], ...
    ] = ()  # ACCELERATE_* for torchrun/env/deepspeed styles
    rdzv_backend: str = "static"  # accelerate style; torchrun style is always c10d
    timeout: int = 600  # seconds a node waits for the others at rendezvous
    hostnames: tuple[str, ...] = ()  # deepspeed hostfile, in node order
    python: str = "python"  # env style interpreter; slurm's doctor step
    log_dir: str = "logs"  # slurm
    workdir: str = ""  # absolute; every script cd's here, so relative paths hold
    setup: str = ""  # shell command run first on every node (activate an env)
    extra_env: tuple[tuple[str, str], ...] = ()  # --env / --ifname: exported on every node
    time_limit: str = "02:00:00"  # slurm --time
    cpus_per_node: int = 0  # slurm --cpus-per-task; 0 = 8 per process
    requeue: bool = False  # slurm: requeue at the time limit, resume on restart
    signal_seconds: int = 120  # slurm: warning this long before the time limit
    resume_args: tuple[str, ...] = ("--resume-from", "latest")  # appended when resuming
    doctor: bool = True  # slurm: `zerofit doctor --allocation` before training

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def config_for(self, rank: int) -> str | None:
        """The accelerate YAML node ``rank`` uses (None when launching without one)."""
        if not self.config_files:
            return None
        return self.config_files[rank] if len(self.config_files) > 1 else self.config_files[0]


def validate_spec(spec: LaunchSpec) -> LaunchSpec:
    """Enforce the rules every node must share; returns ``spec`` or raises ZerofitError."""
    if spec.style not in STYLES:
        raise ZerofitError(
            "style", f"{spec.style!r} is not a launch style", "use one of " + ", ".join(STYLES)
        )
    for name in ("nodes", "procs_per_node", "timeout"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ZerofitError(
                name, f"{value!r} must be a positive integer", f"set {name} to 1 or more"
            )
    if (
        isinstance(spec.main_port, bool)
        or not isinstance(spec.main_port, int)
        or not 1 <= spec.main_port <= 65535
    ):
        raise ZerofitError(
            "main_port", f"{spec.main_port!r} is out of range", "use a port in 1-65535, e.g. 29500"
        )
    check_address("main_addr", spec.main_addr)
    if not _JOB_ID.match(spec.job_id):
        raise ZerofitError(
            "job_id", f"{spec.job_id!r} is not a valid job id", "use letters, digits, '_', '.', '-'"
        )
    if spec.rdzv_backend not in RDZV_BACKENDS:
        raise ZerofitError(
            "rdzv_backend", f"{spec.rdzv_backend!r} is unknown", "use static or c10d"
        )
    if not spec.script or any(c in spec.script for c in "\0\n"):
        raise ZerofitError("script", "no training script given", "append `-- train.py ARGS...`")
    for text in (spec.python, spec.log_dir, *spec.script_args, *spec.config_files):
        if "\0" in text:
            raise ZerofitError("arguments", "contain a NUL byte", "remove it")
    for key, value in spec.accelerate_env:  # also written to .deepspeed_env, one KEY=VALUE per line
        if any(c in value for c in "\0\n"):
            raise ZerofitError(key, "contains a line break", "fix the value in accelerate.yaml")
    _validate_additions(spec)
    if not re.match(r"^[A-Za-z0-9_./-]+$", spec.log_dir):
        raise ZerofitError(
            "log_dir",
            f"{spec.log_dir!r} has characters #SBATCH lines cannot hold",
            "use letters, digits, '_', '.', '/', '-'",
        )
    if len(spec.config_files) not in (0, 1, spec.nodes):
        raise ZerofitError(
            "config",
            f"{count_words(len(spec.config_files), 'config file')} for "
            f"{count_words(spec.nodes, 'node')}",
            "give one shared accelerate.yaml or exactly one per node",
        )
    if spec.style == "accelerate" and not spec.config_files:
        raise ZerofitError(
            "config",
            "the accelerate style needs an accelerate.yaml",
            "pass --config accelerate.yaml (from `zerofit config`) or use --style torchrun",
        )
    if spec.hostnames:
        if len(spec.hostnames) != spec.nodes:
            raise ZerofitError(
                "hosts",
                f"{count_words(len(spec.hostnames), 'host')} for {count_words(spec.nodes, 'node')}",
                "list one host per node",
            )
        if len(set(spec.hostnames)) != len(spec.hostnames):
            raise ZerofitError("hosts", "a host is listed twice", "list each node once")
        for host in spec.hostnames:
            check_address("hosts", host)
    return spec


def _validate_additions(spec: LaunchSpec) -> None:
    """Rules for the working directory, setup hook, extra variables and the slurm options."""
    if spec.workdir and (
        not spec.workdir.startswith("/") or any(c in spec.workdir for c in "\0\n")
    ):
        raise ZerofitError(
            "workdir",
            f"{spec.workdir!r} must be an absolute path",
            "pass --workdir /shared/project (the same path on every node)",
        )
    if "\0" in spec.setup or "\n" in spec.setup:
        raise ZerofitError("setup", "is more than one line", "join the commands with `&&` or `;`")
    for key, value in (*spec.accelerate_env, *spec.extra_env):
        if not _ENV_KEY.match(key):
            raise ZerofitError(
                "env", f"{key!r} is not a variable name", "use KEY=VALUE with KEY like NCCL_DEBUG"
            )
        if any(c in value for c in "\0\n"):
            raise ZerofitError(key, "contains a line break", "give a one-line value")
    if not _SLURM_TIME.match(spec.time_limit):
        raise ZerofitError(
            "time",
            f"{spec.time_limit!r} is not a Slurm time",
            "use minutes, HH:MM:SS or D-HH:MM:SS, e.g. 02:00:00",
        )
    for name in ("cpus_per_node", "signal_seconds"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ZerofitError(
                name, f"{value!r} must be a whole number >= 0", f"fix --{name.replace('_', '-')}"
            )
    if spec.style == "deepspeed":
        _validate_for_pdsh(spec)


def _validate_for_pdsh(spec: LaunchSpec) -> None:
    """What DeepSpeed's pdsh runner cannot carry to a remote shell intact (``quote_for_pdsh``)."""
    for key, value in (*spec.accelerate_env, *spec.extra_env, *build_remote_env(spec)):
        if _DS_ENV_UNSAFE.search(value) or value != value.strip():
            raise ZerofitError(
                key,
                f"value {value!r} has characters .deepspeed_env cannot carry "
                "(DeepSpeed puts it in double quotes on the remote shell)",
                'avoid $ ` " \\ and leading/trailing spaces in the value',
            )
    if spec.workdir and not re.match(r"^[A-Za-z0-9_@%+=:,./-]+$", spec.workdir):
        raise ZerofitError(
            "workdir",
            f"{spec.workdir!r} has characters DeepSpeed's pdsh runner passes "
            "unquoted (`cd DIR` on each host)",
            "run from a directory whose path has "
            "only letters, digits and _@%+=:,./-, or pass --workdir",
        )


def quote_for_pdsh(arg: str) -> str:
    """One argument of the user script, pre-quoted so the remote shell pdsh runs gets it verbatim.

    DeepSpeed's PDSHRunner.parse_user_args (deepspeed/launcher/multinode_runner.py) wraps an
    argument containing a space in double quotes (escaping only ``"``) and passes the rest as-is;
    pdsh joins everything into one string that the remote shell evaluates. So: without a space,
    single-quote it (the quotes add no space); with one, escape what double quotes leave live.
    """
    if " " not in arg:
        return shlex.quote(arg)
    return re.sub(r"([\\$`])", r"\\\1", arg)


def find_output_dir(args: tuple[str, ...]) -> str | None:
    """The value of ``--output-dir`` / ``--output_dir`` in the script's arguments, if any."""
    for i, word in enumerate(args):
        for flag in ("--output-dir", "--output_dir"):
            if word == flag and i + 1 < len(args):
                return args[i + 1]
            if word.startswith(flag + "="):
                return word[len(flag) + 1 :]
    return None


def build_remote_env(spec: LaunchSpec) -> tuple[tuple[str, str], ...]:
    """Defaults every rank of a DeepSpeed-launched job needs, which pdsh would not carry."""
    minutes = max(1, -(-spec.timeout // 60))
    return (("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"), ("DEEPSPEED_TIMEOUT", str(minutes)))


def rdzv_endpoint(addr: str, port: int | str) -> str:
    """``host:port``; IPv6 addresses get torchrun's brackets; ShellVars stay expandable."""
    if isinstance(addr, ShellVar) or isinstance(port, ShellVar):
        return ShellVar(f'"{addr.strip(chr(34))}:{str(port).strip(chr(34))}"')
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def build_accelerate_cmd(
    spec: LaunchSpec, rank: int | ShellVar, addr: str | None = None, port: int | str | None = None
) -> list[str]:
    """``accelerate launch`` for node ``rank``; ``addr``/``port`` may be ShellVars (slurm)."""
    addr = spec.main_addr if addr is None else addr
    port = spec.main_port if port is None else port
    config = spec.config_for(rank if isinstance(rank, int) else 0)
    cmd = ["accelerate", "launch"]
    if config:
        cmd += ["--config_file", config]
    cmd += [
        "--num_machines",
        str(spec.nodes),
        "--machine_rank",
        _word(rank),
        "--main_process_ip",
        addr,
        "--main_process_port",
        _word(port),
        "--num_processes",
        str(spec.world_size),
    ]
    if spec.nodes > 1:
        if (
            spec.use_deepspeed
        ):  # pdsh (the default) needs ssh + a hostfile; standard = torchrun per node
            cmd += ["--deepspeed_multinode_launcher", "standard"]
        key = "timeout" if spec.rdzv_backend == "static" else "join_timeout"
        cmd += ["--rdzv_backend", spec.rdzv_backend, "--rdzv_conf", f"{key}={spec.timeout}"]
    return cmd + [spec.script, *spec.script_args]


def build_torchrun_cmd(
    spec: LaunchSpec,
    rank: int | ShellVar,
    static: bool = False,
    addr: str | None = None,
    port: int | str | None = None,
    job_id: str | None = None,
) -> list[str]:
    """``torchrun`` for node ``rank``: c10d rendezvous, or the static node_rank/master form."""
    addr = spec.main_addr if addr is None else addr
    port = spec.main_port if port is None else port
    cmd = ["torchrun", "--nnodes", str(spec.nodes), "--nproc_per_node", str(spec.procs_per_node)]
    if static:
        cmd += [
            "--node_rank",
            _word(rank),
            "--master_addr",
            addr,
            "--master_port",
            _word(port),
            "--rdzv_conf",
            f"timeout={spec.timeout}",
        ]
    else:  # c10d assigns ranks itself and ignores --node_rank, so none is passed
        cmd += [
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            rdzv_endpoint(addr, port),
            "--rdzv_id",
            job_id or spec.job_id,
            "--rdzv_conf",
            f"join_timeout={spec.timeout}",
        ]
    return cmd + [spec.script, *spec.script_args]


def build_rank_env(spec: LaunchSpec, node_rank: int, local_rank: int) -> dict[str, str]:
    """The torch.distributed ``env://`` variables of one process (plain DDP scripts)."""
    return {
        "MASTER_ADDR": spec.main_addr,
        "MASTER_PORT": str(spec.main_port),
        "WORLD_SIZE": str(spec.world_size),
        "NODE_RANK": str(node_rank),
        "RANK": str(node_rank * spec.procs_per_node + local_rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(spec.procs_per_node),
    }


def build_doctor_cmd(spec: LaunchSpec, log_dir: str) -> list[str]:
    """`zerofit doctor --allocation` for every node of a Slurm job; the reports go to ``log_dir``.

    ``log_dir`` passed validate_spec (letters, digits, ``_./-``), so double quotes hold it.
    """
    cmd = [
        spec.python,
        "-m",
        "zerofit",
        "doctor",
        "--allocation",
        ShellVar(f'"{log_dir}/doctor-$SLURM_JOB_ID"'),
        "--main-addr",
        ShellVar('"$MAIN_ADDR"'),
        "--main-port",
        ShellVar('"$MAIN_PORT"'),
        "--timeout",
        str(min(spec.timeout, 120)),
    ]
    if spec.config_files:
        cmd += ["--config", spec.config_files[0]]
    return cmd


def build_env_cmd(spec: LaunchSpec) -> list[str]:
    """What each env-style process runs (its rank comes from the environment)."""
    return [spec.python, spec.script, *spec.script_args]


def build_deepspeed_cmd(
    spec: LaunchSpec, hostfile: str = "hostfile", setup_script: str | None = None
) -> list[str]:
    """DeepSpeed's own launcher over ``hostfile`` (it reaches the other hosts with pdsh/ssh).

    With more than one node every word after the launcher's own flags is evaluated once more by
    the remote shell, so the script and its arguments are pre-quoted for it (``quote_for_pdsh``).
    """
    cmd = [
        "deepspeed",
        "--hostfile",
        hostfile,
        "--num_nodes",
        str(spec.nodes),
        "--num_gpus",
        str(spec.procs_per_node),
        "--master_addr",
        spec.main_addr,
        "--master_port",
        str(spec.main_port),
    ]
    if setup_script is not None:  # sourced on every host before the launcher (runner --venv_script)
        cmd += ["--venv_script", setup_script]
    if spec.config_files:  # accelerate scripts read their rank from the env, not --local_rank
        cmd.append("--no_local_rank")
    if spec.nodes == 1:  # DeepSpeed runs a single node locally, without pdsh: no second shell
        return cmd + [spec.script, *spec.script_args]
    # the script itself is joined raw (never wrapped), so plain shell quoting is exact for it
    return cmd + [shlex.quote(spec.script), *map(quote_for_pdsh, spec.script_args)]
