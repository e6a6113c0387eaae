"""`zerofit doctor`: gather this node's facts, check them (pure), render pass / warn / fail lines.

Run on every node before a multi-node job; ``--json`` on one node and ``--compare`` on another
shows version drift, the usual cause of hangs that no error message explains.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from zerofit.errors import ZerofitError

VERSION_KEYS = ("python", "torch", "cuda", "nccl", "deepspeed", "accelerate", "transformers")
# A mismatch here breaks or hangs collectives; the others only change behaviour.
CRITICAL_VERSIONS = ("torch", "cuda", "nccl", "deepspeed")
LOW_DISK_GIB = 20.0


@dataclass(frozen=True)
class Check:
    """One line of the report: ``status`` is pass, warn or fail; ``fix`` says what to do."""

    name: str
    status: str
    detail: str
    fix: str = ""


def fingerprint(versions: dict[str, str | None]) -> str:
    """Short hash of the version tuple: equal on two nodes means the same stack."""
    text = ";".join(f"{k}={versions.get(k) or '-'}" for k in VERSION_KEYS)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def validate_config(cfg: dict) -> dict:
    """The accelerate.yaml keys the doctor reads, type-checked: a one-line error, no crash."""
    for key, low in (("num_machines", 1), ("num_processes", 1), ("machine_rank", 0)):
        value = cfg.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < low
        ):
            raise ZerofitError(
                key,
                f"{value!r} in accelerate.yaml must be a whole number >= {low}",
                f"fix {key}, or regenerate the file with `zerofit config`",
            )
    port = cfg.get("main_process_port")
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
    ):
        raise ZerofitError(
            "main_process_port",
            f"{port!r} in accelerate.yaml is not a port",
            "use a port in 1-65535, e.g. 29500",
        )
    ip = cfg.get("main_process_ip")
    if ip is not None and not isinstance(ip, str):
        raise ZerofitError(
            "main_process_ip",
            f"{ip!r} in accelerate.yaml is not an address",
            "use node 0's IP address or hostname",
        )
    return cfg


def gather_disk(checkpoint_dir: str, need_gib: float | None) -> dict[str, Any]:
    """Free space where checkpoints go, and whether the directory exists and is writable here."""
    path = Path(checkpoint_dir).resolve()
    exists, is_dir = path.exists(), path.is_dir()
    probe = path
    while not probe.exists():  # measure the disk it would land on
        probe = probe.parent
    return {
        "path": checkpoint_dir,
        "exists": exists,
        "is_dir": is_dir,
        "writable": is_dir and os.access(path, os.W_OK | os.X_OK),
        "free_gib": round(shutil.disk_usage(probe).free / 2**30, 1),
        "need_gib": need_gib,
    }


# --- gather (I/O) ---------------------------------------------------------------------------------
def gather_versions() -> dict[str, str | None]:
    """Python and library versions; torch is imported for its CUDA / NCCL build info."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("deepspeed", "accelerate", "transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        import torch

        versions["torch"], versions["cuda"] = torch.__version__, torch.version.cuda
        try:
            nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
            versions["nccl"] = (
                ".".join(map(str, nccl))
                if isinstance(nccl, tuple)
                else (str(nccl) if nccl else None)
            )
        except Exception:  # CPU builds have no NCCL at all
            versions["nccl"] = None
    except ImportError:
        versions.update(torch=None, cuda=None, nccl=None)
    return {k: versions.get(k) for k in VERSION_KEYS}


def gather_gpus() -> dict[str, Any]:
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return {"count": n, "names": [torch.cuda.get_device_name(i) for i in range(n)]}
    except ImportError:
        pass
    return {"count": 0, "names": []}


def gather_facts(
    config: dict | None = None,
    main_addr: str | None = None,
    main_port: int | None = None,
    node_rank: int | None = None,
    checkpoint_dir: str | None = None,
    need_gib: float | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Everything the checks look at, as plain data (JSON-serialisable)."""
    from zerofit.doctor.net import (
        list_infiniband,
        list_interfaces,
        port_in_use,
        resolve,
        route_source,
    )

    env = dict(os.environ) if env is None else env
    cfg = config or {}
    main_addr = main_addr or cfg.get("main_process_ip")
    main_port = main_port if main_port is not None else cfg.get("main_process_port")
    if node_rank is None and "machine_rank" in cfg:
        node_rank = cfg["machine_rank"]
    interfaces = list_interfaces()
    local = {a for i in interfaces for a in i["addresses"]} | {"127.0.0.1", "::1"}
    versions = gather_versions()
    cfg_keys = (
        "num_machines",
        "num_processes",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "use_cpu",
    )
    facts: dict[str, Any] = {
        "host": socket.gethostname(),
        "versions": versions,
        "fingerprint": fingerprint(versions),
        "gpus": gather_gpus(),
        "config": {k: cfg.get(k) for k in cfg_keys} if cfg else None,
        "main_addr": main_addr,
        "main_port": main_port,
        "node_rank": node_rank,
        "interfaces": interfaces,
        "infiniband": list_infiniband(),
        "nccl_socket_ifname": env.get("NCCL_SOCKET_IFNAME"),
        "nccl_ib_disable": env.get("NCCL_IB_DISABLE"),
        "resolved": [],
        "resolve_error": None,
        "route_source": None,
        "is_main": node_rank == 0,
        "port_problem": None,
        "disk": None,
        "owns_main_addr": None,
    }
    if main_addr:
        facts["resolved"], facts["resolve_error"] = resolve(main_addr)
        facts["owns_main_addr"] = bool(set(facts["resolved"]) & local)
        facts["is_main"] = node_rank == 0 or (node_rank is None and facts["owns_main_addr"])
        facts["route_source"] = route_source(main_addr, main_port or 29500)
    if main_port and facts["is_main"]:
        facts["port_problem"] = port_in_use(int(main_port))
    if checkpoint_dir:
        facts["disk"] = gather_disk(checkpoint_dir, need_gib)
    return facts


# --- checks (pure) --------------------------------------------------------------------------------
def check_versions(facts: dict) -> Check:
    v = facts["versions"]
    line = ", ".join(f"{k} {v.get(k) or '-'}" for k in VERSION_KEYS)
    missing = [k for k in ("torch", "deepspeed", "accelerate") if not v.get(k)]
    if missing:
        return Check(
            "versions",
            "fail",
            f"{', '.join(missing)} not installed ({line})",
            f"pip install {' '.join(missing)} in this node's environment",
        )
    return Check("versions", "pass", f"{line}; fingerprint {facts['fingerprint']}")


def check_compare(facts: dict, other: dict) -> Check:
    mine, theirs = facts["versions"], other.get("versions") or {}
    diffs = [k for k in VERSION_KEYS if (mine.get(k) or None) != (theirs.get(k) or None)]
    host = other.get("host", "the other node")
    if not diffs:
        return Check(
            "compare", "pass", f"same stack as {host} (fingerprint {facts['fingerprint']})"
        )
    listed = "; ".join(
        f"{k} {mine.get(k) or '-'} here vs {theirs.get(k) or '-'} on {host}" for k in diffs
    )
    bad = [k for k in diffs if k in CRITICAL_VERSIONS]
    return Check(
        "compare",
        "fail" if bad else "warn",
        listed,
        "install the same versions on every node (one container image or lock file)",
    )


def config_leaves_process_count(config: dict) -> bool:
    """True where the accelerate YAML leaves num_processes to ``--num_processes``.

    accelerate's loader (commands/config/config_args.py, ``load_config_from_file``) reads an absent
    num_processes as 1 only for distributed_type NO; otherwise it stays ClusterConfig's -1, which
    ``accelerate launch`` (commands/launch.py, ``_validate_launch_command``) takes from the command
    line, as the shipped presets do.
    """
    distributed = config.get("distributed_type", "NO") != "NO"
    return config.get("num_processes", -1 if distributed else 1) in (-1, None)


def check_gpus(facts: dict) -> Check:
    """The node's visible GPUs against the processes per node the accelerate YAML starts."""
    count, cfg = facts["gpus"]["count"], facts["config"]
    names = ", ".join(sorted(set(facts["gpus"]["names"]))) or "none"
    if not cfg or config_leaves_process_count(cfg):
        if count == 0:
            return Check(
                "gpus",
                "warn",
                "no CUDA GPU visible: training would run on CPU",
                "check `nvidia-smi` and CUDA_VISIBLE_DEVICES",
            )
        if cfg:
            return Check(
                "gpus",
                "pass",
                f"{count} visible ({names}); accelerate.yaml leaves the process count to "
                "`accelerate launch --num_processes`",
            )
        return Check("gpus", "pass", f"{count} visible ({names})")
    if cfg.get("use_cpu"):
        return Check("gpus", "pass", f"CPU run (use_cpu: true); {count} GPU(s) visible")
    machines, total = cfg.get("num_machines") or 1, cfg.get("num_processes")
    per_node = total // machines
    where = (
        f"accelerate.yaml wants {per_node} per node (num_processes {total} over {machines} node(s))"
    )
    if count < per_node:
        return Check(
            "gpus",
            "fail",
            f"{count} visible, {where}",
            "fix CUDA_VISIBLE_DEVICES / the allocation, or regenerate with --gpus-per-node "
            f"{max(count, 1)}",
        )
    if count > per_node:
        return Check(
            "gpus",
            "warn",
            f"{count} visible ({names}), {where}: {count - per_node} idle",
            "regenerate the config with --gpus-per-node to use them all",
        )
    return Check("gpus", "pass", f"{count} visible ({names}), matches the config")


def check_disk(facts: dict) -> Check | None:
    disk = facts["disk"]
    if disk is None:
        return None
    free, need = disk["free_gib"], disk["need_gib"]
    if disk.get("exists") is False:  # a typo, or the shared filesystem is not mounted on this node
        return Check(
            "disk",
            "fail",
            f"{disk['path']} does not exist on this node",
            f"create it (mkdir -p {disk['path']}) or fix the path; on a cluster it must be on "
            "storage every node mounts",
        )
    if disk.get("is_dir") is False:
        return Check(
            "disk",
            "fail",
            f"{disk['path']} is not a directory",
            "point --checkpoint-dir at a directory",
        )
    if disk.get("writable") is False:
        return Check(
            "disk",
            "fail",
            f"{disk['path']} is not writable here",
            "fix its permissions, or choose a directory this user can write",
        )
    if need is not None and free < need:
        return Check(
            "disk",
            "fail",
            f"{free} GiB free at {disk['path']}, checkpoints need {need} GiB",
            "point --checkpoint-dir at a larger disk or keep fewer checkpoints",
        )
    if need is None and free < LOW_DISK_GIB:
        return Check(
            "disk",
            "warn",
            f"only {free} GiB free at {disk['path']}",
            "a checkpoint with optimizer states is ~16 bytes per parameter; "
            "pass --need-gib to check",
        )
    return Check("disk", "pass", f"{free} GiB free at {disk['path']}")


def check_main_addr(facts: dict) -> Check | None:
    addr = facts["main_addr"]
    if not addr:
        return None
    if facts["resolve_error"]:
        return Check(
            "main address",
            "fail",
            f"{addr} does not resolve ({facts['resolve_error']})",
            "use node 0's IP address, or fix DNS / /etc/hosts on this node",
        )
    machines = (facts["config"] or {}).get("num_machines") or 1
    loopback = all(a.startswith("127.") or a == "::1" for a in facts["resolved"])
    if machines > 1 and loopback:
        return Check(
            "main address",
            "fail",
            f"{addr} is this machine's loopback: other nodes cannot reach it",
            "set main_process_ip / --main-addr to node 0's address on the network the nodes share",
        )
    if facts.get("node_rank") == 0 and facts.get("owns_main_addr") is False:
        mine = sorted(
            {a for i in facts["interfaces"] for a in i["addresses"] if not a.startswith("127.")}
        )
        return Check(
            "main address",
            "fail",
            f"this is node 0 (rank 0), but {addr} ({', '.join(facts['resolved'])})"
            f" is not one of its addresses ({', '.join(mine) or 'none'}): the others would "
            "wait for "
            "a main process that is not there",
            "run rank 0 on the machine that owns "
            f"{addr}, or set main_process_ip / --main-addr to this node's address",
        )
    return Check("main address", "pass", f"{addr} resolves to {', '.join(facts['resolved'])}")


def check_port(facts: dict) -> Check | None:
    port = facts["main_port"]
    if not port:
        return None
    if not facts["is_main"]:
        return Check(
            "main port",
            "pass",
            f"not the main node; prove {facts['main_addr']}:{port} is reachable with "
            f"`zerofit doctor --serve {port}` there and "
            f"`--connect {facts['main_addr']}:{port}` here",
        )
    if facts["port_problem"]:
        return Check(
            "main port",
            "fail",
            f"port {port} on this (main) node: {facts['port_problem']}",
            f"pick another main_process_port, or stop what holds it (`ss -ltnp 'sport = :{port}'`)",
        )
    return Check("main port", "pass", f"port {port} is free on this (main) node")


def route_interface(facts: dict) -> str | None:
    """The interface holding the address this node uses to reach the main node."""
    src = facts["route_source"]
    return next((i["name"] for i in facts["interfaces"] if src and src in i["addresses"]), None)


def check_interfaces(facts: dict) -> Check:
    up = [
        i
        for i in facts["interfaces"]
        if not i["loopback"] and i["addresses"] and i["state"] in ("up", "unknown")
    ]
    chosen, names = facts["nccl_socket_ifname"], [i["name"] for i in facts["interfaces"]]
    route = route_interface(facts)
    if chosen:
        wanted = [w.lstrip("=") for w in chosen.lstrip("^").split(",") if w]
        exact = chosen.startswith("=") or chosen.startswith("^=")
        hits = [n for n in names for w in wanted if (n == w if exact else n.startswith(w))]
        if not chosen.startswith("^") and not hits:
            return Check(
                "interfaces",
                "fail",
                f"NCCL_SOCKET_IFNAME={chosen} matches none of {', '.join(names)}",
                f"export NCCL_SOCKET_IFNAME={route or (up[0]['name'] if up else 'eth0')}",
            )
        return Check(
            "interfaces",
            "pass",
            f"NCCL_SOCKET_IFNAME={chosen} matches {', '.join(hits) or 'by exclusion'}",
        )
    if not up:
        return Check(
            "interfaces",
            "warn",
            "no non-loopback interface is up",
            "single-machine only: other nodes cannot reach this one",
        )
    names_up = [i["name"] for i in up]
    pick = route if route in names_up else names_up[0]
    if len(up) > 1:
        return Check(
            "interfaces",
            "warn",
            f"{len(up)} usable interfaces ({', '.join(names_up)}) and "
            "NCCL_SOCKET_IFNAME unset: NCCL may pick one the other nodes cannot reach",
            f"export NCCL_SOCKET_IFNAME={pick}"
            + (" (it routes to the main node)" if pick == route else ""),
        )
    return Check("interfaces", "pass", f"{pick} is the only usable interface")


def check_infiniband(facts: dict) -> Check:
    devices, machines = facts["infiniband"], (facts["config"] or {}).get("num_machines") or 1
    active = [
        f"{d['name']} port {p}"
        for d in devices
        for p, s in d["ports"].items()
        if s.upper() == "ACTIVE"
    ]
    if active and facts["nccl_ib_disable"] == "1":
        return Check(
            "infiniband",
            "warn",
            f"{', '.join(active)} active but NCCL_IB_DISABLE=1",
            "unset NCCL_IB_DISABLE so NCCL uses InfiniBand",
        )
    if active:
        return Check("infiniband", "pass", f"{', '.join(active)} active")
    if devices:
        return Check(
            "infiniband",
            "warn",
            f"{', '.join(d['name'] for d in devices)} present, no port ACTIVE",
            "check the cable / subnet manager (`ibstat`); NCCL falls back to TCP",
        )
    if machines > 1:
        return Check(
            "infiniband",
            "warn",
            "no InfiniBand device: NCCL talks TCP between nodes",
            "expected on Ethernet clusters; large models train much slower across nodes",
        )
    return Check("infiniband", "pass", "none (not needed on one node)")


def run_checks(facts: dict, other: dict | None = None) -> list[Check]:
    """Every applicable check, in report order."""
    checks = [
        check_versions(facts),
        check_compare(facts, other) if other else None,
        check_gpus(facts),
        check_disk(facts),
        check_main_addr(facts),
        check_port(facts),
        check_interfaces(facts),
        check_infiniband(facts),
    ]
    return [c for c in checks if c is not None]


# --- render ---------------------------------------------------------------------------------------
def render_report(facts: dict, checks: list[Check]) -> str:
    """Human report: one line per check (fix underneath), then the interfaces and the NCCL line."""
    lines = [f"zerofit doctor on {facts['host']} (fingerprint {facts['fingerprint']})"]
    for c in checks:
        lines.append(f"{c.status.upper():<5} {c.name:<13} {c.detail}")
        if c.fix and c.status != "pass":
            lines.append(f"{'':19}fix: {c.fix}")
    route = route_interface(facts)
    lines.append("interfaces:")
    for i in facts["interfaces"]:
        mark = "  <- route to the main node" if i["name"] == route else ""
        lines.append(f"  {i['name']:<10} {', '.join(i['addresses']) or '-':<16} {i['state']}{mark}")
    usable = [i["name"] for i in facts["interfaces"] if not i["loopback"] and i["addresses"]]
    pick = route if route in usable else (usable[0] if usable else None)
    if pick:
        lines.append(f"  pick one for NCCL: export NCCL_SOCKET_IFNAME={pick}")
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "warn", "fail")}
    lines.append(f"{counts['pass']} passed, {counts['warn']} warning(s), {counts['fail']} failed")
    return "\n".join(lines) + "\n"


def build_report(facts: dict, checks: list[Check]) -> dict:
    """The ``--json`` document; another node's ``--compare`` reads its ``versions``."""
    return {
        "host": facts["host"],
        "fingerprint": facts["fingerprint"],
        "versions": facts["versions"],
        "ok": not any(c.status == "fail" for c in checks),
        "checks": [asdict(c) for c in checks],
        "facts": facts,
    }
