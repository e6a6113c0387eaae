"""zerofit.doctor.checks checks (pure, over hand-made facts), the real gatherers on this machine,
and the `--serve` / `--connect` handshake on loopback, including the message when nothing listens.

Run: .venv/bin/python -m pytest tests/doctor/test_doctor.py -q   (~6 s; `--json` imports torch once)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from zerofit.cli.main import main
from zerofit.doctor.checks import (
    check_compare,
    check_disk,
    check_gpus,
    check_infiniband,
    check_interfaces,
    check_main_addr,
    check_port,
    fingerprint,
    gather_facts,
    render_report,
    run_checks,
)
from zerofit.doctor.net import connect, list_infiniband, list_interfaces, serve

VERSIONS = {
    "python": "3.11.7",
    "torch": "2.5.1+cu124",
    "cuda": "12.4",
    "nccl": "2.21.5",
    "deepspeed": "0.16.2",
    "accelerate": "1.2.1",
    "transformers": "4.47.1",
}
ETH = {
    "name": "eth0",
    "addresses": ["10.0.0.5"],
    "state": "up",
    "loopback": False,
    "speed_mbit": 25000,
}
IB_NET = {
    "name": "ib0",
    "addresses": ["192.168.0.5"],
    "state": "up",
    "loopback": False,
    "speed_mbit": None,
}
LO = {
    "name": "lo",
    "addresses": ["127.0.0.1"],
    "state": "unknown",
    "loopback": True,
    "speed_mbit": None,
}


def facts(**kw) -> dict:
    base = {
        "host": "gpu-a17",
        "versions": VERSIONS,
        "fingerprint": fingerprint(VERSIONS),
        "gpus": {"count": 8, "names": ["NVIDIA H100 80GB HBM3"] * 8},
        "config": {"num_machines": 2, "num_processes": 16, "machine_rank": 0},
        "main_addr": "10.0.0.5",
        "main_port": 29500,
        "node_rank": 0,
        "interfaces": [LO, ETH],
        "infiniband": [],
        "nccl_socket_ifname": None,
        "nccl_ib_disable": None,
        "resolved": ["10.0.0.5"],
        "resolve_error": None,
        "route_source": "10.0.0.5",
        "is_main": True,
        "port_problem": None,
        "disk": None,
    }
    return {**base, **kw}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- pure checks ----------------------------------------------------------------------------------
def test_fingerprint_tracks_the_version_tuple() -> None:
    fp = fingerprint(VERSIONS)
    assert len(fp) == 12 and fp == fingerprint(dict(reversed(list(VERSIONS.items()))))
    assert fp != fingerprint(dict(VERSIONS, nccl="2.20.3"))


def test_compare_fails_on_critical_drift_and_warns_on_the_rest() -> None:
    other = {"host": "gpu-a18", "versions": dict(VERSIONS, nccl="2.20.3", transformers="4.46.0")}
    c = check_compare(facts(), other)
    assert c.status == "fail"
    assert (
        c.detail
        == "nccl 2.21.5 here vs 2.20.3 on gpu-a18; transformers 4.47.1 here vs 4.46.0 on gpu-a18"
    )
    assert (
        check_compare(facts(), {"versions": dict(VERSIONS, transformers="4.46.0")}).status == "warn"
    )
    assert check_compare(facts(), {"host": "b", "versions": VERSIONS}).status == "pass"


@pytest.mark.parametrize(
    "count, status, text",
    [
        (8, "pass", "8 visible (NVIDIA H100 80GB HBM3), matches the config"),
        (
            4,
            "fail",
            "4 visible, accelerate.yaml wants 8 per node (num_processes 16 over 2 node(s))",
        ),
        (10, "warn", "2 idle"),
    ],
)
def test_gpus_against_config(count: int, status: str, text: str) -> None:
    c = check_gpus(facts(gpus={"count": count, "names": ["NVIDIA H100 80GB HBM3"] * count}))
    assert c.status == status and text in c.detail


def test_gpus_against_a_preset_that_leaves_the_process_count_to_the_command_line() -> None:
    # The shipped presets have no num_processes: accelerate launch takes --num_processes. Reading
    # the absent count as 1 per node called 7 of 8 GPUs idle.
    preset = {"distributed_type": "DEEPSPEED", "num_machines": 1}
    check = check_gpus(facts(config=preset))
    assert check.status == "pass"
    assert "8 visible" in check.detail and "--num_processes" in check.detail
    no_gpu = check_gpus(facts(config=preset, gpus={"count": 0, "names": []}))
    assert no_gpu.status == "warn"


def test_gpus_without_config_or_on_cpu() -> None:
    assert check_gpus(facts(config=None, gpus={"count": 0, "names": []})).status == "warn"
    cpu_cfg = {"num_machines": 2, "num_processes": 2, "use_cpu": True}
    cpu = check_gpus(facts(config=cpu_cfg, gpus={"count": 0, "names": []}))
    assert cpu.status == "pass"


def test_disk() -> None:
    assert check_disk(facts()) is None
    low = check_disk(facts(disk={"path": "/ckpt", "free_gib": 78.4, "need_gib": 200.0}))
    assert (low.status, low.detail) == (
        "fail",
        "78.4 GiB free at /ckpt, checkpoints need 200.0 GiB",
    )
    assert (
        check_disk(facts(disk={"path": "/ckpt", "free_gib": 5.0, "need_gib": None})).status
        == "warn"
    )
    assert (
        check_disk(facts(disk={"path": "/ckpt", "free_gib": 500.0, "need_gib": 200.0})).status
        == "pass"
    )


def test_main_address() -> None:
    assert check_main_addr(facts()).status == "pass"
    bad = check_main_addr(
        facts(main_addr="gpu-x", resolved=[], resolve_error="Name or service not known")
    )
    assert bad.status == "fail" and "does not resolve" in bad.detail
    lo = check_main_addr(facts(main_addr="localhost", resolved=["127.0.0.1", "::1"]))
    assert lo.status == "fail" and "other nodes cannot reach it" in lo.detail
    single = facts(
        main_addr="127.0.0.1",
        resolved=["127.0.0.1"],
        config={"num_machines": 1, "num_processes": 8},
    )
    assert check_main_addr(single).status == "pass"


def test_port() -> None:
    assert check_port(facts()).detail == "port 29500 is free on this (main) node"
    busy = check_port(facts(port_problem="already in use"))
    assert busy.status == "fail" and "ss -ltnp 'sport = :29500'" in busy.fix
    worker = check_port(facts(is_main=False, node_rank=1))
    assert worker.status == "pass" and "--connect 10.0.0.5:29500" in worker.detail


def test_interfaces_and_nccl_variable() -> None:
    two = facts(interfaces=[LO, ETH, IB_NET], route_source="192.168.0.5")
    c = check_interfaces(two)
    assert (
        c.status == "warn" and c.fix == "export NCCL_SOCKET_IFNAME=ib0 (it routes to the main node)"
    )
    wrong = check_interfaces(facts(nccl_socket_ifname="ens5"))
    assert (wrong.status, wrong.fix) == ("fail", "export NCCL_SOCKET_IFNAME=eth0")
    assert (
        check_interfaces(facts(nccl_socket_ifname="eth")).status == "pass"
    )  # NCCL matches prefixes
    assert check_interfaces(facts(nccl_socket_ifname="=eth")).status == "fail"  # '=' means exact
    assert check_interfaces(facts()).detail == "eth0 is the only usable interface"
    report = render_report(two, run_checks(two))
    assert "  pick one for NCCL: export NCCL_SOCKET_IFNAME=ib0" in report
    assert "ib0        192.168.0.5      up  <- route to the main node" in report


def test_infiniband() -> None:
    ib = [{"name": "mlx5_0", "ports": {"1": "ACTIVE"}}]
    assert check_infiniband(facts(infiniband=ib)).detail == "mlx5_0 port 1 active"
    assert check_infiniband(facts(infiniband=ib, nccl_ib_disable="1")).status == "warn"
    assert (
        check_infiniband(facts(infiniband=[{"name": "mlx5_0", "ports": {"1": "DOWN"}}])).status
        == "warn"
    )
    assert check_infiniband(facts()).status == "warn"  # two nodes over TCP
    assert check_infiniband(facts(config=None)).status == "pass"


def test_report_lists_fix_under_failures() -> None:
    f = facts(gpus={"count": 4, "names": ["NVIDIA A100-SXM4-80GB"] * 4})
    text = render_report(f, run_checks(f))
    assert "FAIL  gpus          4 visible" in text
    assert "fix: fix CUDA_VISIBLE_DEVICES" in text
    assert text.rstrip().endswith("failed")


# --- real gatherers on this machine ---------------------------------------------------------------
def test_sysfs_readers(tmp_path: Path) -> None:
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    assert list_infiniband(str(tmp_path)) == [{"name": "mlx5_0", "ports": {"1": "ACTIVE"}}]
    assert list_infiniband(str(tmp_path / "none")) == []
    lo = next(i for i in list_interfaces() if i["name"] == "lo")
    assert lo["addresses"] == ["127.0.0.1"] and lo["loopback"]


def test_gather_sees_a_busy_port_and_disk(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        port = s.getsockname()[1]
        f = gather_facts(
            main_addr="127.0.0.1",
            main_port=port,
            node_rank=0,
            checkpoint_dir=str(tmp_path / "not" / "yet"),
            need_gib=1e9,
            env={},
        )
    assert f["port_problem"] == "already in use" and f["resolved"] == ["127.0.0.1"]
    assert check_port(f).status == "fail"
    assert f["disk"]["free_gib"] > 0 and check_disk(f).status == "fail"
    assert f["versions"]["torch"] and len(f["fingerprint"]) == 12


def test_cli_json_and_compare(tmp_path: Path, capsys) -> None:
    assert main(["doctor", "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert {c["name"] for c in report["checks"]} >= {"versions", "gpus", "interfaces", "infiniband"}
    other = dict(report, host="node1", versions=dict(report["versions"], deepspeed="0.0.1"))
    (tmp_path / "node1.json").write_text(json.dumps(other))
    assert main(["doctor", "--compare", str(tmp_path / "node1.json")]) == 1
    assert "FAIL  compare       deepspeed" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{")
    assert main(["doctor", "--compare", str(tmp_path / "bad.json")]) == 2
    assert "compare: " in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("a: [")
    assert main(["doctor", "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "config: " in capsys.readouterr().err


# --- --serve / --connect --------------------------------------------------------------------------
def test_handshake_on_loopback() -> None:
    port, ready, result = free_port(), threading.Event(), {}
    t = threading.Thread(
        target=lambda: result.update(r=serve(port, "tok", 10, "127.0.0.1", ready.set))
    )
    t.start()
    assert ready.wait(5)
    ok, message = connect("127.0.0.1", port, "tok", 5)
    t.join(10)
    assert ok and message.startswith(f"reached 127.0.0.1:{port}")
    assert result["r"] == (True, f"127.0.0.1 reached port {port} and completed the handshake")


def test_wrong_token_and_nobody_listening() -> None:
    port, ready = free_port(), threading.Event()
    t = threading.Thread(target=serve, args=(port, "right", 3, "127.0.0.1", ready.set))
    t.start()
    assert ready.wait(5)
    ok, message = connect("127.0.0.1", port, "wrong", 3)
    assert not ok and "different --token" in message
    t.join(10)
    closed = free_port()
    ok, message = connect("127.0.0.1", closed, "tok", 3)
    assert not ok
    assert message == (
        f"nothing listens on 127.0.0.1:{closed} (fix: run `zerofit doctor --serve {closed}` on "
        "that node first; if it is running, a firewall rejects the port)"
    )
    assert serve(free_port(), "tok", 0.3, "127.0.0.1")[0] is False


def test_cli_serve_connect_pair() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "zerofit", "doctor"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    server = subprocess.Popen(
        cmd + ["--serve", str(port), "--timeout", "20"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert "listening on port" in server.stdout.readline()
        client = subprocess.run(
            cmd + ["--connect", f"127.0.0.1:{port}", "--timeout", "5"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert client.returncode == 0 and client.stdout.startswith(
            "PASS  reachability  reached 127.0.0.1"
        )
        assert server.wait(timeout=10) == 0
        assert "completed the handshake" in server.stdout.read()
    finally:
        if server.poll() is None:
            server.kill()
    fail = subprocess.run(
        cmd + ["--connect", f"127.0.0.1:{port}", "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert fail.returncode == 1 and fail.stderr.startswith(
        f"FAIL  reachability  nothing listens on 127.0.0.1:{port}"
    )


# --- what the doctor used to pass or crash on -----------------------------------------------------
def test_checkpoint_dir_that_does_not_exist_fails(tmp_path: Path) -> None:
    missing = gather_facts(checkpoint_dir=str(tmp_path / "ckpt-typo"), env={})
    c = check_disk(missing)
    assert (
        c.status == "fail" and c.detail == f"{tmp_path / 'ckpt-typo'} does not exist on this node"
    )
    assert "mkdir -p" in c.fix
    (tmp_path / "file").write_text("x")
    assert check_disk(gather_facts(checkpoint_dir=str(tmp_path / "file"), env={})).status == "fail"
    assert check_disk(gather_facts(checkpoint_dir=str(tmp_path), env={})).status in ("pass", "warn")


def test_rank_zero_must_own_the_main_address() -> None:
    other = facts(owns_main_addr=False, main_addr="10.0.0.9", resolved=["10.0.0.9"])
    c = check_main_addr(other)
    assert (
        c.status == "fail"
        and "this is node 0 (rank 0), but 10.0.0.9" in c.detail
        and "10.0.0.5" in c.detail
    )
    assert check_main_addr(facts(owns_main_addr=True)).status == "pass"
    assert check_main_addr(facts(owns_main_addr=False, node_rank=1, is_main=False)).status == "pass"
    real = gather_facts(
        main_addr="192.0.2.1", main_port=29500, node_rank=0, env={}
    )  # TEST-NET: never local
    assert real["owns_main_addr"] is False and check_main_addr(real).status == "fail"


@pytest.mark.parametrize(
    "key, value",
    [
        ("num_processes", "eight"),
        ("num_machines", 0),
        ("machine_rank", -1),
        ("main_process_port", "29500x"),
        ("num_processes", True),
    ],
)
def test_bad_config_values_are_one_line_errors(tmp_path: Path, capsys, key, value) -> None:
    import yaml

    cfg = {
        "num_machines": 2,
        "num_processes": 16,
        "machine_rank": 0,
        "main_process_ip": "127.0.0.1",
        "main_process_port": 29500,
    }
    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump(dict(cfg, **{key: value})))
    assert main(["doctor", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zerofit: error: {key}:") and len(err.strip().splitlines()) == 1


def test_allocation_mode_two_nodes_on_loopback(tmp_path: Path) -> None:
    """`--allocation`: both "nodes" report, node 0 serves the port, the other connects."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "zerofit",
        "doctor",
        "--allocation",
        str(tmp_path / "rep"),
        "--main-addr",
        "127.0.0.1",
        "--main-port",
        str(port),
        "--nodes",
        "2",
        "--timeout",
        "60",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    node0 = subprocess.Popen(
        cmd + ["--node-rank", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        node1 = subprocess.run(
            cmd + ["--node-rank", "1"], capture_output=True, text=True, timeout=120, env=env
        )
        out0, err0 = node0.communicate(timeout=120)
    finally:
        if node0.poll() is None:
            node0.kill()
    assert node1.returncode == 0 and "(rank 1): ok" in node1.stdout, node1.stderr
    assert node0.returncode == 0, err0
    assert "2 node report(s)" in out0 and "all nodes passed" in out0 and "reachability" not in out0
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["node-0.json", "node-1.json"]
    reached = json.loads((tmp_path / "rep" / "node-0.json").read_text())["checks"]
    assert any(c["name"] == "reachability" and c["status"] == "pass" for c in reached)


def test_allocation_mode_names_a_node_that_never_reports(tmp_path: Path, capsys) -> None:
    assert (
        main(
            [
                "doctor",
                "--allocation",
                str(tmp_path),
                "--main-addr",
                "127.0.0.1",
                "--main-port",
                str(free_port()),
                "--nodes",
                "2",
                "--node-rank",
                "0",
                "--timeout",
                "2",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "no node connected to port" in err and "no report from node rank(s) 1 within 2 s" in err
    assert main(["doctor", "--allocation", str(tmp_path), "--nodes", "2"]) == 2 or os.environ.get(
        "SLURM_NODEID"
    )


def test_facts_out_never_replaces_a_file_without_force(tmp_path: Path, capsys) -> None:
    """`doctor --facts-out FILE` refuses an existing FILE before any node measures, in one line
    naming --force; with --force the same flags pass on to the next check."""
    existing = tmp_path / "cluster.json"
    existing.write_text("{}")
    argv = ["doctor", "--allocation", str(tmp_path / "reports"), "--facts-out", str(existing)]
    argv += ["--nodes", "1", "--node-rank", "0", "--main-addr", "127.0.0.1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"zerofit: error: facts-out: {existing} already exists "
        "(fix: pass --force to overwrite, or choose another --facts-out file)"
    )
    assert main([*argv, "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zerofit: error: measure-bandwidth: needs two or more nodes")
    assert existing.read_text() == "{}"
