"""`zerofit launch`: the per-node launch commands (or slurm / deepspeed files) for one multi-node
job."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from zerofit.errors import ZerofitError
from zerofit.launch.commands import RDZV_BACKENDS, STYLES

EXAMPLES = """examples:
  zerofit launch --config accelerate.yaml --main-addr 10.0.0.1 --out launch/ -- train.py --lr 1e-5
  zerofit launch --style torchrun --nodes 2 --gpus-per-node 8 --main-addr 10.0.0.1 -- train.py
  zerofit launch --style slurm --config accelerate.yaml --requeue --out . \\
      -- recipes/grpo.py --output-dir run
  zerofit launch --style deepspeed --config accelerate.yaml --hosts node1,node2 --ifname eth0 \\
      --out ds/
      -- train.py --prompt "it's"
"""


def register(sub) -> None:
    """`zerofit launch` and its flags: the job's shape, each node's environment, slurm's extras."""
    p = sub.add_parser(
        "launch",
        help="render the launch command of every node "
        "(accelerate, torchrun, env, slurm, deepspeed)",
        description="Render one multi-node job in the dialect you use. Every node gets the same "
        "node count, main address and port; only its rank differs. Without --out the files are "
        "printed.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_flags(p)
    add_node_environment_flags(p)
    add_slurm_flags(p.add_argument_group("slurm"))
    p.add_argument("--out", metavar="DIR", help="write the files here instead of printing them")
    p.add_argument("--force", action="store_true", help="overwrite existing files in --out")
    p.add_argument(
        "command", nargs="*", metavar="-- SCRIPT ARGS", help="training script and its arguments"
    )
    p.set_defaults(func=run)


def add_job_flags(p) -> None:
    """The job's shape: config, dialect, node count, main address and port, rendezvous."""
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="YAML",
        help="accelerate.yaml from `zerofit config`: one shared, or one per node in rank order",
    )
    p.add_argument(
        "--style",
        choices=STYLES,
        help="launch dialect (default: accelerate with --config, else torchrun)",
    )
    p.add_argument("--nodes", type=int, help="number of nodes (must match the config)")
    p.add_argument(
        "--gpus-per-node",
        type=int,
        dest="procs_per_node",
        metavar="M",
        help="processes per node (must match the config)",
    )
    # `zerofit config` calls them --main-process-ip/-port (accelerate's names): both spellings work
    p.add_argument(
        "--main-addr",
        "--main-process-ip",
        dest="main_addr",
        help="address of node 0 that every node can reach",
    )
    p.add_argument(
        "--main-port",
        "--main-process-port",
        dest="main_port",
        type=int,
        help="free port on node 0 (default: the config's, else 29500)",
    )
    p.add_argument(
        "--rdzv-id",
        default="zerofit",
        dest="job_id",
        help="job id for c10d rendezvous / slurm job name",
    )
    p.add_argument(
        "--rdzv-backend",
        choices=RDZV_BACKENDS,
        help="rendezvous of the accelerate style (default: the config's, else static; "
        "torchrun style: c10d; torchrun-static: static)",
    )
    p.add_argument(
        "--timeout", type=int, default=600, help="seconds a node waits for the others to join (600)"
    )
    p.add_argument(
        "--hosts", help="comma-separated hostnames for the deepspeed hostfile, node 0 first"
    )


def add_node_environment_flags(p) -> None:
    """What every node runs in: interpreter, working directory, setup command, variables."""
    p.add_argument(
        "--python", default="python", help="interpreter of the env style (default: python)"
    )
    p.add_argument("--log-dir", default="logs", help="slurm log directory (default: logs)")
    p.add_argument(
        "--workdir",
        help="absolute directory every script runs in, the same on every node "
        "(default: this directory); relative paths are taken from there",
    )
    p.add_argument(
        "--setup",
        default="",
        metavar="CMD",
        help="shell command run first on every node, e.g. 'source /shared/venv/bin/activate'",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="variable exported on every node (deepspeed: written to .deepspeed_env); repeatable",
    )
    p.add_argument(
        "--ifname",
        metavar="IFACE",
        help="network interface the nodes share: sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME",
    )


def add_slurm_flags(slurm) -> None:
    """job.sbatch only: time limit, cores, requeue and resume, the doctor step."""
    slurm.add_argument(
        "--time", default="02:00:00", dest="time_limit", help="--time of the job (02:00:00)"
    )
    slurm.add_argument(
        "--cpus-per-node",
        type=int,
        default=0,
        metavar="N",
        help="cores per node for the launcher and its ranks (default: 8 per GPU)",
    )
    slurm.add_argument(
        "--requeue",
        action="store_true",
        help="requeue the job at its time limit (--signal) and resume on the next start",
    )
    slurm.add_argument(
        "--signal-seconds",
        type=int,
        default=120,
        metavar="S",
        help="with --requeue: seconds before the time limit to requeue (120)",
    )
    slurm.add_argument(
        "--resume-args",
        default="--resume-from latest",
        metavar="ARGS",
        help="with --requeue: arguments added to the script to resume ('--resume-from latest')",
    )
    slurm.add_argument(
        "--no-doctor",
        dest="doctor",
        action="store_false",
        help="skip the `zerofit doctor --allocation` step before training",
    )


def _read_configs(paths: list[str]) -> list[dict]:
    import yaml

    configs = []
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ZerofitError(
                "config", f"cannot read {path} ({exc.strerror})", "check the path"
            ) from None
        except yaml.YAMLError as exc:
            raise ZerofitError(
                "config",
                f"{path} is not valid YAML ({str(exc).splitlines()[0]})",
                "fix the YAML or regenerate it with `zerofit config`",
            ) from None
        if not isinstance(data, dict):
            raise ZerofitError(
                "config", f"{path} is not an accelerate config mapping", "regenerate it"
            )
        configs.append(data)
    return configs


def _parse_env(pairs: list[str], ifname: str | None) -> tuple[tuple[str, str], ...]:
    """--env KEY=VALUE pairs plus --ifname, in order; later keys win."""
    env: dict[str, str] = {}
    if ifname:
        env.update(NCCL_SOCKET_IFNAME=ifname, GLOO_SOCKET_IFNAME=ifname)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ZerofitError(
                "env", f"{pair!r} is not KEY=VALUE", "pass e.g. --env NCCL_DEBUG=INFO"
            )
        env[key] = value
    return tuple(env.items())


def run(args: argparse.Namespace) -> int:
    from zerofit.launch.cluster_config import build_spec
    from zerofit.launch.render import render_launch_files

    command = [w for w in args.command]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ZerofitError("script", "no training script given", "append `-- train.py ARGS...`")
    configs = _read_configs(args.config)
    hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip()) if args.hosts else ()
    workdir = os.path.abspath(args.workdir) if args.workdir else os.getcwd()
    extra_env = _parse_env(args.env, args.ifname)
    import shlex

    try:
        resume_args = tuple(shlex.split(args.resume_args))
    except ValueError as exc:
        raise ZerofitError(
            "resume_args", f"{args.resume_args!r}: {exc}", "quote it like a shell command line"
        ) from None
    spec, warnings = build_spec(
        configs,
        tuple(args.config),
        style=args.style,
        nodes=args.nodes,
        procs_per_node=args.procs_per_node,
        main_addr=args.main_addr,
        main_port=args.main_port,
        script=command[0],
        script_args=tuple(command[1:]),
        job_id=args.job_id,
        rdzv_backend=args.rdzv_backend,
        timeout=args.timeout,
        hostnames=hosts,
        python=args.python,
        log_dir=args.log_dir,
        workdir=workdir,
        setup=args.setup,
        extra_env=extra_env,
        time_limit=args.time_limit,
        cpus_per_node=args.cpus_per_node,
        requeue=args.requeue,
        signal_seconds=args.signal_seconds,
        resume_args=resume_args,
        doctor=args.doctor,
    )
    ds_file = dict(spec.accelerate_env).get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if ds_file and not (Path(workdir) / ds_file).exists():
        warnings.append(
            f"{ds_file} (deepspeed_config_file) is not found from {workdir}, where the generated "
            "files run"
        )
    files = render_launch_files(spec)
    for line in warnings:
        print(f"zerofit: warning: {line}", file=sys.stderr)
    if args.out:
        from zerofit.files import write_files

        for path in write_files(args.out, files, args.force):
            if path.suffix in (".sh", ".sbatch"):
                path.chmod(0o755)
            print(f"wrote {path}")
        return 0
    for name, text in files.items():
        print(f"# ===== {name} =====")
        print(text)
    return 0
