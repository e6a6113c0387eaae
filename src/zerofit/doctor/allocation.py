"""`zerofit doctor --allocation DIR`: the doctor on every node of a job at once, compared.

Started once per node (e.g. one `srun` step inside a Slurm job). Each node checks itself, proves
the main address and port reachable (node 0 listens on the main port, every other node completes
the handshake with it), writes its report to DIR (shared storage, as a job's working directory
is), waits for every other node's report and compares them. Every node reaches the same verdict;
node 0 prints the table. Every wait is bounded by the timeout.

With ``--measure-bandwidth`` the nodes then time a TCP transfer around a ring, all at once:
node i streams to node i+1 (the last to node 0) while receiving from node i-1, between the
addresses the job's traffic uses (``launch_address``: NCCL_SOCKET_IFNAME's interface, else the
route to the main node), with ``doctor.bandwidth``. A ring, because it is what NCCL's ring
collectives do (every NIC sends and receives at the same time) and its slowest pair is what
every step of one waits on; all pairs at once, so the measurement takes one transfer's time on
any node count and sees a switch that cannot carry every node at full rate. Each node writes
its pair's result to DIR; node 0 gathers them.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from zerofit.cluster_facts import ClusterFacts
from zerofit.doctor.bandwidth import (
    MAX_BYTES,
    STREAMS,
    BandwidthError,
    BandwidthServer,
    Limits,
    measure_to,
    slowest_pair,
)
from zerofit.doctor.checks import (
    Check,
    build_report,
    check_compare,
    route_interface,
    run_checks,
)
from zerofit.doctor.net import connect_until, serve

IO_TIMEOUT = 10.0  # s: the most one socket call of the bandwidth transfer waits on a silent peer


def check_reachability(facts: dict, nodes: int, token: str, timeout: float) -> Check:
    """Node 0 serves the main port for the other nodes; each of them connects to it."""
    addr, port, rank = facts["main_addr"], facts["main_port"], facts["node_rank"]
    if nodes == 1 or not addr or not port:
        return Check("reachability", "pass", "single node: nothing to reach")
    if rank == 0:
        if facts["port_problem"]:  # check_port reports it; no point listening
            return Check(
                "reachability",
                "fail",
                f"cannot listen on port {port}: {facts['port_problem']}",
                "pick another main port",
            )
        ok, message = serve(int(port), token, timeout, count=nodes - 1)
    else:
        ok, message = connect_until(addr, int(port), token, timeout)
    fix = (
        ""
        if ok
        else (
            f"check that {addr} is node 0's address on the network the nodes share and that "
            f"no firewall blocks port {port}"
        )
    )
    return Check("reachability", "pass" if ok else "fail", message, fix)


def write_report(directory: Path, rank: int, report: dict) -> Path:
    """node-RANK.json, written atomically so a reader never sees half a report."""
    directory.mkdir(parents=True, exist_ok=True)
    path, tmp = directory / f"node-{rank}.json", directory / f".node-{rank}.json.{os.getpid()}"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, path)
    return path


def wait_for_reports(directory: Path, nodes: int, timeout: float) -> dict[int, dict]:
    """Every node's report that appears within ``timeout`` seconds, by rank."""
    deadline, found = time.monotonic() + timeout, {}
    while True:
        for rank in range(nodes):
            path = directory / f"node-{rank}.json"
            if rank not in found and path.exists():
                try:
                    found[rank] = json.loads(path.read_text())
                except ValueError:
                    pass  # being replaced right now: read it next round
        if len(found) == nodes or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def compare_reports(reports: dict[int, dict], nodes: int, timeout: float) -> list[Check]:
    """The allocation-wide checks: a report from every node, the same stack, the same GPU count."""
    checks = []
    missing = [r for r in range(nodes) if r not in reports]
    if missing:
        checks.append(
            Check(
                "reports",
                "fail",
                f"no report from node rank(s) {', '.join(map(str, missing))} "
                f"within {timeout:g} s",
                "check that their doctor ran and that the report "
                "directory is on storage every node shares",
            )
        )
    if 0 in reports:
        base = reports[0]["facts"]
        for rank, report in sorted(reports.items()):
            if rank:
                c = check_compare(base, report["facts"])
                checks.append(Check(f"compare {rank}", c.status, c.detail, c.fix))
    gpus = {r: rep["facts"]["gpus"]["count"] for r, rep in reports.items()}
    if len(set(gpus.values())) > 1:
        listed = ", ".join(f"{reports[r]['host']} {n}" for r, n in sorted(gpus.items()))
        checks.append(
            Check(
                "gpu counts",
                "fail",
                f"nodes see different GPU counts ({listed})",
                "fix the allocation (--gres) or CUDA_VISIBLE_DEVICES on the odd node",
            )
        )
    return checks


def render_table(reports: dict[int, dict], shared: list[Check]) -> str:
    """Node 0's summary: one line per node, then every failed or warned check with its node."""
    lines = ["zerofit doctor --allocation: " + f"{len(reports)} node report(s)"]
    for rank, rep in sorted(reports.items()):
        checks = rep["checks"]
        fails = [c for c in checks if c["status"] == "fail"]
        state = "ok" if not fails else f"{len(fails)} failed"
        versions = rep["facts"]["versions"]
        lines.append(
            f"  rank {rank}  {rep['host']:<16} fingerprint {rep['fingerprint']}  gpus "
            f"{rep['facts']['gpus']['count']}  torch {versions.get('torch') or '-'}  {state}"
        )
    for rank, rep in sorted(reports.items()):
        for c in rep["checks"]:
            if c["status"] != "pass":
                lines.append(
                    f"{c['status'].upper():<5} {rep['host']} (rank {rank}) "
                    f"{c['name']}: {c['detail']}" + (f" (fix: {c['fix']})" if c["fix"] else "")
                )
    for c in shared:
        if c.status != "pass":
            lines.append(
                f"{c.status.upper():<5} {c.name}: {c.detail}"
                + (f" (fix: {c.fix})" if c.fix else "")
            )
    return "\n".join(lines) + "\n"


@dataclass
class AllocationResult:
    """What ``check_allocation`` found: the verdict, the text to print, and on node 0 with
    ``--measure-bandwidth`` every ring pair (``pairs``) and each node's host (``hosts``)."""

    ok: bool
    text: str
    pairs: list[dict] = field(default_factory=list)
    hosts: dict[int, str] = field(default_factory=dict)


def run_allocation(
    facts: dict, directory: str, nodes: int, token: str, timeout: float
) -> tuple[bool, str]:
    """Check this node, prove reachability, publish the report, compare all; (ok, text to print)."""
    result = check_allocation(facts, directory, nodes, token, timeout)
    return result.ok, result.text


def check_allocation(
    facts: dict,
    directory: str,
    nodes: int,
    token: str,
    timeout: float,
    bandwidth_seconds: float | None = None,
) -> AllocationResult:
    """``run_allocation``, and with ``bandwidth_seconds`` the ring's bandwidth measured too."""
    checks = run_checks(facts) + [check_reachability(facts, nodes, token, timeout)]
    rank, where = facts["node_rank"], Path(directory)
    receiver, endpoint = None, None
    if bandwidth_seconds is not None:
        (where / f"bandwidth-{rank}.json").unlink(missing_ok=True)  # a previous run's result
        receiver, endpoint, problem = start_receiver(facts, token, timeout)
        if problem:
            checks.append(problem)
    report = build_report(facts, checks)
    if endpoint:
        report["bandwidth_endpoint"] = endpoint
    write_report(where, rank, report)
    reports = wait_for_reports(where, nodes, timeout)
    shared = compare_reports(reports, nodes, timeout)
    pair, pairs = None, []
    if bandwidth_seconds is not None:
        pair = measure_ring_step(facts, reports, nodes, token, bandwidth_seconds, timeout)
        if receiver is not None:
            receiver.wait(timeout if (rank - 1) % nodes in reports else 0.0)
        write_bandwidth(where, rank, endpoint, pair)
        if rank == 0:
            pairs = wait_for_bandwidth(where, reports, nodes, timeout + bandwidth_seconds)
            shared += [
                Check(
                    "bandwidth",
                    "fail",
                    f"rank {p['from_rank']} -> rank {p['to_rank']}: {p['error']}",
                )
                for p in pairs
                if p["error"]
            ]
    ok = all(r.get("ok") for r in reports.values()) and not any(c.status == "fail" for c in shared)
    ok = ok and not (pair and pair["error"])
    hosts = {r: rep["host"] for r, rep in reports.items()}
    if rank == 0:
        text = render_table(reports, shared)
        if pairs:
            text += render_bandwidth(pairs, bandwidth_seconds or 0.0)
        text += "all nodes passed\n" if ok else "FAILED\n"
        return AllocationResult(ok, text, pairs, hosts)
    return AllocationResult(ok, render_node_line(facts, checks, pair), [], hosts)


def render_node_line(facts: dict, checks: list[Check], pair: dict | None) -> str:
    """A node other than 0: one line, ``ok`` or its failures, and the rate it sent at."""
    mine = [f"{c.name}: {c.detail}" for c in checks if c.status == "fail"]
    if pair and pair["error"]:
        mine.append(f"bandwidth to rank {pair['to_rank']}: {pair['error']}")
    text = f"zerofit doctor --allocation: {facts['host']} (rank {facts['node_rank']}): " + (
        "; ".join(mine) if mine else "ok"
    )
    if pair and not pair["error"]:
        text += f"; sent {pair['gbps']:.3g} Gbit/s to rank {pair['to_rank']}"
    return text + "\n"


# --- bandwidth around the ring --------------------------------------------------------------------
def launch_address(facts: dict) -> tuple[str | None, str | None]:
    """(address, interface) the job's traffic uses: the first interface NCCL_SOCKET_IFNAME
    selects (prefix match, ``=`` for exact, as NCCL reads it), else the one that routes to the
    main node."""
    chosen = facts.get("nccl_socket_ifname") or ""
    if chosen and not chosen.startswith("^"):  # an exclusion list leaves the choice to NCCL
        exact = chosen.startswith("=")
        wanted = [w for w in chosen.lstrip("=").split(",") if w]
        for iface in facts["interfaces"]:
            name = iface["name"]
            matches = any(name == w if exact else name.startswith(w) for w in wanted)
            if matches and iface["addresses"]:
                return iface["addresses"][0], name
    return facts["route_source"], route_interface(facts)


def start_receiver(
    facts: dict, token: str, timeout: float
) -> tuple[BandwidthServer | None, dict | None, Check | None]:
    """Listen for the previous node's transfer on the launch's address (``launch_address``)."""
    addr, interface = launch_address(facts)
    if not addr:
        return None, None, Check(
            "bandwidth",
            "fail",
            f"no local address routes to the main address {facts['main_addr']}",
            "pass the main node's address with --main-addr",
        )
    try:
        receiver = BandwidthServer(addr, token, timeout=min(IO_TIMEOUT, timeout)).start(1)
    except BandwidthError as exc:
        return None, None, Check("bandwidth", "fail", str(exc))
    return receiver, {"addr": addr, "port": receiver.port, "interface": interface}, None


def measure_ring_step(
    facts: dict, reports: dict[int, dict], nodes: int, token: str, seconds: float, timeout: float
) -> dict:
    """This node's pair of the ring: stream to the next node, return the pair's result."""
    rank = facts["node_rank"]
    target = (rank + 1) % nodes
    source, interface = launch_address(facts)
    pair = {
        "from_rank": rank,
        "to_rank": target,
        "from_host": facts["host"],
        "to_host": reports.get(target, {}).get("host"),
        "from_addr": source,
        "from_interface": interface,
        "to_addr": None,
        "gbps": None,
        "nbytes": None,
        "seconds": None,
        "error": None,
    }
    endpoint = reports.get(target, {}).get("bandwidth_endpoint")
    if not endpoint:
        missing = "sent no report" if target not in reports else "has no receiver"
        pair["error"] = f"rank {target} {missing}: nothing to measure"
        return pair
    pair["to_addr"] = endpoint["addr"]
    try:
        transfer = measure_to(
            endpoint["addr"],
            int(endpoint["port"]),
            token,
            Limits(seconds=seconds, timeout=min(IO_TIMEOUT, timeout)),
            source=source,
        )
    except BandwidthError as exc:
        pair["error"] = str(exc)
        return pair
    pair.update(gbps=transfer.gbps, nbytes=transfer.nbytes, seconds=transfer.seconds)
    return pair


def write_bandwidth(directory: Path, rank: int, endpoint: dict | None, pair: dict) -> Path:
    """bandwidth-RANK.json: this node's pair, beside the receiver it published (so node 0 can
    tell this run's result from a previous run's), written atomically."""
    path, tmp = directory / f"bandwidth-{rank}.json", directory / f".bandwidth-{rank}.{os.getpid()}"
    tmp.write_text(json.dumps({"endpoint": endpoint, "pair": pair}, indent=1))
    os.replace(tmp, path)
    return path


def wait_for_bandwidth(
    directory: Path, reports: dict[int, dict], nodes: int, timeout: float
) -> list[dict]:
    """Every node's pair, in rank order; a pair that did not arrive within ``timeout`` s is an
    error naming its node."""
    deadline, found = time.monotonic() + timeout, {}
    expected = [r for r in range(nodes) if r in reports]
    while True:
        for rank in expected:
            path = directory / f"bandwidth-{rank}.json"
            if rank in found or not path.exists():
                continue
            try:
                data = json.loads(path.read_text())
            except ValueError:
                continue  # being replaced right now: read it next round
            if data.get("endpoint") == reports[rank].get("bandwidth_endpoint"):
                found[rank] = data["pair"]
        if len(found) == len(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    pairs = []
    for rank in range(nodes):
        if rank in found:
            pairs.append(found[rank])
        else:
            why = "sent no report" if rank not in reports else f"sent no result in {timeout:g} s"
            pairs.append(
                {"from_rank": rank, "to_rank": (rank + 1) % nodes, "gbps": None, "error": why}
            )
    return pairs


def render_bandwidth(pairs: list[dict], seconds: float) -> str:
    """Node 0's bandwidth table: one line per ring pair, then the slowest."""
    lines = [f"bandwidth (TCP, a ring of {len(pairs)} pairs at once, up to {seconds:g} s each):"]
    for p in pairs:
        route = f"rank {p['from_rank']} -> rank {p['to_rank']}"
        if p["error"]:
            lines.append(f"  {route:<20} failed: {p['error']}")
            continue
        lines.append(
            f"  {route:<20} {p['from_addr']} -> {p['to_addr']}"
            + (f" ({p['from_interface']})" if p.get("from_interface") else "")
            + f"  {p['gbps']:.3g} Gbit/s "
            f"({p['nbytes'] / 1e6:.1f} MB in {p['seconds']:.2f} s)"
        )
    if any(p["gbps"] is not None for p in pairs):
        slow = slowest_pair(pairs)
        lines.append(
            f"  slowest: rank {slow['from_rank']} -> rank {slow['to_rank']} at "
            f"{slow['gbps']:.3g} Gbit/s (what a ring collective waits on)"
        )
    return "\n".join(lines) + "\n"


def build_cluster_facts(pairs: list[dict], hosts: dict[int, str], seconds: float) -> ClusterFacts:
    """The facts file's content: ``inter_node_gbps`` is the slowest ring pair, every pair and
    how they were measured go under ``measured``. Every pair must have been measured."""
    failed = [p for p in pairs if p["gbps"] is None]
    if failed or not pairs:
        raise ValueError(f"{len(failed)} of {len(pairs)} pairs were not measured")
    slow = slowest_pair(pairs)
    addrs = {p["from_rank"]: p.get("from_addr") for p in pairs}
    keys = ("from_rank", "to_rank", "from_host", "to_host", "from_addr", "to_addr")
    keys += ("from_interface",)
    return ClusterFacts(
        inter_node_gbps=round(slow["gbps"], 4),
        intra_node_gbps=None,  # the GPUs' own links: the doctor times the network only
        nodes=tuple(
            {"rank": rank, "host": hosts.get(rank), "addr": addrs.get(rank)}
            for rank in sorted(addrs)
        ),
        measured={
            "method": "timed TCP transfer (zerofit doctor --measure-bandwidth)",
            "topology": "ring: rank i sends to rank i+1, all pairs at once",
            "streams_per_pair": STREAMS,
            "seconds_per_pair": seconds,
            "max_bytes_per_pair": MAX_BYTES,
            "pairs": [
                {
                    **{key: p.get(key) for key in keys},
                    "gbps": round(p["gbps"], 4),
                    "bytes": p["nbytes"],
                    "seconds": round(p["seconds"], 4),
                }
                for p in pairs
            ],
            "slowest": {
                "from_rank": slow["from_rank"],
                "to_rank": slow["to_rank"],
                "gbps": round(slow["gbps"], 4),
            },
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    )
