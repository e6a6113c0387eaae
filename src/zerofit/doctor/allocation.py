"""`zerofit doctor --allocation DIR`: the doctor on every node of a job at once, compared.

Started once per node (e.g. one `srun` step inside a Slurm job). Each node checks itself, proves
the main address and port reachable (node 0 listens on the main port, every other node completes
the handshake with it), writes its report to DIR (shared storage, as a job's working directory
is), waits for every other node's report and compares them. Every node reaches the same verdict;
node 0 prints the table. Every wait is bounded by the timeout.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from zerofit.doctor.checks import Check, build_report, check_compare, run_checks
from zerofit.doctor.net import connect_until, serve


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


def run_allocation(
    facts: dict, directory: str, nodes: int, token: str, timeout: float
) -> tuple[bool, str]:
    """Check this node, prove reachability, publish the report, compare all; (ok, text to print)."""
    checks = run_checks(facts) + [check_reachability(facts, nodes, token, timeout)]
    rank, where = facts["node_rank"], Path(directory)
    write_report(where, rank, build_report(facts, checks))
    reports = wait_for_reports(where, nodes, timeout)
    shared = compare_reports(reports, nodes, timeout)
    ok = all(r.get("ok") for r in reports.values()) and not any(c.status == "fail" for c in shared)
    if rank == 0:
        return ok, render_table(reports, shared) + ("all nodes passed\n" if ok else "FAILED\n")
    mine = [c for c in checks if c.status == "fail"]
    text = f"zerofit doctor --allocation: {facts['host']} (rank {rank}): " + (
        "ok" if not mine else "; ".join(f"{c.name}: {c.detail}" for c in mine)
    )
    return ok, text + "\n"
