"""`zerofit doctor`: pre-flight checks on each node; `--serve`/`--connect` prove a port is
reachable; `--allocation --measure-bandwidth --facts-out FILE` times the network between the
nodes and writes the cluster-facts file."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from zerofit.errors import ZerofitError

EXAMPLES = """examples:
  zerofit doctor --config accelerate.yaml --checkpoint-dir /ckpt --need-gib 200
  zerofit doctor --json > node0.json            # on node 0, then on node 1:
  zerofit doctor --compare node0.json
  zerofit doctor --serve 29500                  # on node 0, then on node 1:
  zerofit doctor --connect 10.0.0.1:29500
  srun --ntasks-per-node=1 zerofit doctor --allocation logs/doctor \\
      --main-addr node001 --main-port 29500
                                                # every node of a Slurm job at once, compared
  srun --ntasks-per-node=1 zerofit doctor --allocation logs/doctor \\
      --main-addr node001 --main-port 29500 --measure-bandwidth --facts-out cluster.json
                                                # and time the network: plan --cluster-facts
"""


def register(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this node before a (multi-node) job: versions, GPUs, disk, address, port, "
        "network",
        description="Checks this node and prints pass / warn / fail with the fix for each. "
        "Exit 1 on any fail.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        metavar="YAML",
        help="this node's accelerate.yaml (GPU count, main address/port)",
    )
    # `zerofit config` calls them --main-process-ip/-port (accelerate's names): both spellings work
    p.add_argument(
        "--main-addr",
        "--main-process-ip",
        dest="main_addr",
        help="main node address (default: the config's main_process_ip)",
    )
    p.add_argument(
        "--main-port",
        "--main-process-port",
        dest="main_port",
        type=int,
        help="main node port (default: the config's main_process_port)",
    )
    p.add_argument(
        "--node-rank", type=int, help="this node's rank (default: the config's machine_rank)"
    )
    p.add_argument(
        "--checkpoint-dir", metavar="DIR", help="where checkpoints go: free disk is checked"
    )
    p.add_argument("--need-gib", type=float, help="GiB the checkpoints need (fails below it)")
    p.add_argument(
        "--compare", metavar="JSON", help="another node's `zerofit doctor --json` report"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--allocation",
        metavar="DIR",
        help="run on every node at once (one srun step): reports go to DIR on shared storage, "
        "node 0 serves the main port to the others, all are compared",
    )
    p.add_argument(
        "--nodes", type=int, help="with --allocation: node count (default: $SLURM_NNODES)"
    )
    p.add_argument(
        "--measure-bandwidth",
        action="store_true",
        help="with --allocation: time a TCP transfer around the nodes (a ring, all pairs at once) "
        "on the interface NCCL_SOCKET_IFNAME selects, else the one that routes to the main node, "
        "and print Gbit/s per pair",
    )
    p.add_argument(
        "--bandwidth-seconds",
        type=float,
        default=2.0,
        metavar="S",
        help="with --measure-bandwidth: seconds each pair streams (2; it stops early after 2 GiB)",
    )
    p.add_argument(
        "--facts-out",
        metavar="FILE",
        help="with --allocation: measure the bandwidth and write the cluster-facts JSON that "
        "plan / estimate / config --cluster-facts read (node 0 writes it)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing --facts-out file")
    net = p.add_mutually_exclusive_group()
    net.add_argument(
        "--serve", type=int, metavar="PORT", help="listen on PORT for one --connect, then exit"
    )
    net.add_argument(
        "--connect", metavar="ADDR:PORT", help="handshake with a --serve on another node"
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds --serve waits / --connect tries (60)"
    )
    p.add_argument(
        "--token", default="zerofit", help="shared word so --connect knows it reached --serve"
    )
    p.set_defaults(func=run)


def _load(path: str, what: str) -> dict:
    """A --compare JSON report or a --config accelerate.yaml, as a mapping (else ZerofitError)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ZerofitError(what, f"cannot read {path} ({exc.strerror})", "check the path") from None
    fix = (
        "pass the file written by `zerofit doctor --json`"
        if what == "compare"
        else "regenerate it with `zerofit config`"
    )
    try:
        data = json.loads(text) if what == "compare" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ZerofitError(what, f"{path} is not valid ({str(exc).splitlines()[0]})", fix) from None
    if not isinstance(data, dict):
        raise ZerofitError(what, f"{path} does not hold a mapping", fix)
    return data


def _parse_target(text: str) -> tuple[str, int]:
    addr, sep, port = text.rpartition(":")
    addr = addr.strip("[]")
    if not sep or not addr or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ZerofitError(
            "connect", f"{text!r} is not ADDR:PORT", "use e.g. --connect 10.0.0.1:29500"
        )
    return addr, int(port)


def _net(args) -> int:
    from zerofit.doctor.net import connect, serve

    if args.timeout <= 0:
        raise ZerofitError("timeout", f"{args.timeout:g} must be positive", "use e.g. --timeout 60")
    if args.serve is not None:
        if not 1 <= args.serve <= 65535:
            raise ZerofitError("serve", f"{args.serve} is out of range", "use a port in 1-65535")
        print(
            f"zerofit doctor: listening on port {args.serve} for {args.timeout:g} s; "
            f"run `zerofit doctor --connect THIS_HOST:{args.serve}` on the other node",
            flush=True,
        )
        ok, message = serve(args.serve, args.token, args.timeout)
    else:
        addr, port = _parse_target(args.connect)
        ok, message = connect(addr, port, args.token, args.timeout)
    print(
        f"{'PASS' if ok else 'FAIL'}  reachability  {message}",
        file=sys.stdout if ok else sys.stderr,
    )
    return 0 if ok else 1


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _fill_from_slurm(args) -> None:
    """--allocation: the node's rank and the node count default to SLURM_NODEID / SLURM_NNODES."""
    if args.node_rank is None:
        args.node_rank = _env_int("SLURM_NODEID")
    if args.nodes is None:
        args.nodes = _env_int("SLURM_NNODES")
    if args.node_rank is None or args.nodes is None:
        raise ZerofitError(
            "allocation",
            "needs this node's rank and the node count",
            "run it inside a Slurm job step, or pass --node-rank and --nodes",
        )
    if not 0 <= args.node_rank < args.nodes:
        raise ZerofitError(
            "node_rank", f"{args.node_rank} is not in 0..{args.nodes - 1}", "fix --node-rank"
        )
    if args.timeout <= 0:
        raise ZerofitError("timeout", f"{args.timeout:g} must be positive", "use e.g. --timeout 60")


def _check_bandwidth_flags(args) -> None:
    """--measure-bandwidth / --facts-out: refused up front, before any node waits on another."""
    if args.facts_out:
        args.measure_bandwidth = True
    if not args.measure_bandwidth:
        return
    if not args.allocation:
        raise ZerofitError(
            "measure-bandwidth",
            "times the network between the nodes of an allocation",
            "add --allocation DIR and run it on every node at once",
        )
    if not 0 < args.bandwidth_seconds <= 60:
        raise ZerofitError(
            "bandwidth-seconds",
            f"{args.bandwidth_seconds:g} is not in (0, 60]",
            "use e.g. --bandwidth-seconds 2",
        )
    if args.facts_out:
        from zerofit.cluster_facts import refuse_existing_facts

        refuse_existing_facts(args.facts_out, args.force)


def _allocation(args, facts: dict) -> int:
    from zerofit.doctor.allocation import check_allocation

    if args.measure_bandwidth:
        if args.nodes < 2:
            raise ZerofitError(
                "measure-bandwidth", "needs two or more nodes", "run it in a multi-node job"
            )
        if not facts["main_addr"]:
            raise ZerofitError(
                "main_addr",
                "--measure-bandwidth needs the main node's address (the launch's network)",
                "pass --main-addr or --config",
            )
    result = check_allocation(
        facts,
        args.allocation,
        args.nodes,
        args.token,
        args.timeout,
        bandwidth_seconds=args.bandwidth_seconds if args.measure_bandwidth else None,
    )
    print(result.text, end="", file=sys.stdout if result.ok else sys.stderr, flush=True)
    if args.facts_out and facts["node_rank"] == 0:
        _write_facts(args, result)
    return 0 if result.ok else 1


def _write_facts(args, result) -> None:
    """Node 0 writes the facts file once every ring pair was measured."""
    from zerofit.cluster_facts import write_cluster_facts
    from zerofit.doctor.allocation import build_cluster_facts

    failed = [p for p in result.pairs if p["gbps"] is None]
    if failed or not result.pairs:
        print(
            f"zerofit doctor: {args.facts_out} not written: {len(failed)} of "
            f"{len(result.pairs)} pairs were not measured",
            file=sys.stderr,
        )
        return
    facts = build_cluster_facts(result.pairs, result.hosts, args.bandwidth_seconds)
    path = Path(args.facts_out)
    # refused again without --force: the file may have appeared while the nodes measured
    write_cluster_facts(path, facts, force=args.force)
    print(
        f"wrote {path} (inter_node_gbps {facts.inter_node_gbps:g}: the slowest pair); "
        f"use it with `zerofit plan --cluster-facts {path}`",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    _check_bandwidth_flags(args)
    if args.serve is not None or args.connect:
        return _net(args)
    from zerofit.doctor.checks import (
        build_report,
        gather_facts,
        render_report,
        run_checks,
        validate_config,
    )

    config = validate_config(_load(args.config, "config")) if args.config else None
    other = _load(args.compare, "compare") if args.compare else None
    if args.main_port is not None and not 1 <= args.main_port <= 65535:
        raise ZerofitError(
            "main_port", f"{args.main_port} is out of range", "use a port in 1-65535"
        )
    if args.allocation:
        _fill_from_slurm(args)
    facts = gather_facts(
        config,
        main_addr=args.main_addr,
        main_port=args.main_port,
        node_rank=args.node_rank,
        checkpoint_dir=args.checkpoint_dir,
        need_gib=args.need_gib,
    )
    if args.allocation:
        return _allocation(args, facts)
    checks = run_checks(facts, other)
    if args.json:
        print(json.dumps(build_report(facts, checks), indent=2))
    else:
        print(render_report(facts, checks), end="")
    return 1 if any(c.status == "fail" for c in checks) else 0
