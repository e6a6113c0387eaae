"""zerofit.doctor.bandwidth and `zerofit doctor --measure-bandwidth --facts-out`: the rate
arithmetic, the slowest pair and the facts file (pure); the timed transfer on loopback and its
one-line errors on a peer that is absent, silent or gone; and the real thing between two network
namespaces joined by a veth pair shaped to 200 Mbit/s with tc (root only).

Run: .venv/bin/python -m pytest tests/doctor/test_bandwidth.py -q   (~26 s on a busy 2-core
machine, 10 s of it the namespace test, which skips without root)
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from zerofit.cli.main import main
from zerofit.cluster_facts import load_cluster_facts, write_cluster_facts
from zerofit.doctor.allocation import (
    build_cluster_facts,
    check_allocation,
    launch_address,
    render_bandwidth,
    wait_for_bandwidth,
)
from zerofit.doctor.bandwidth import (
    HELLO_BYTES,
    BandwidthError,
    BandwidthServer,
    Limits,
    Transfer,
    measure_to,
    rate_gbps,
    slowest_pair,
)
from zerofit.doctor.checks import VERSION_KEYS, fingerprint

LAUNCH_TESTS = Path(__file__).resolve().parents[1] / "launch"
SHAPED_MBIT = 200
# tbf meters whole frames; the receiver counts TCP payload: 1448 bytes (MTU 1500 less 20 of IPv4
# and 32 of TCP with timestamps) per 1514-byte frame (14 of Ethernet), ~4 % below the rate
PAYLOAD_PER_FRAME = 1448 / 1514


def pair(src: int, dst: int, gbps: float | None, error: str | None = None) -> dict:
    return {
        "from_rank": src,
        "to_rank": dst,
        "from_host": f"node-{src}",
        "to_host": f"node-{dst}",
        "from_addr": f"10.0.0.{src + 1}",
        "to_addr": f"10.0.0.{dst + 1}",
        "gbps": gbps,
        "nbytes": None if gbps is None else int(gbps * 1e9 / 8 * 2),
        "seconds": None if gbps is None else 2.0,
        "error": error,
    }


# --- pure ---------------------------------------------------------------------------------------
def test_rate_is_decimal_gigabits_per_second() -> None:
    assert rate_gbps(25_000_000, 1.0) == pytest.approx(0.2)  # 200 Mbit/s, as tc's "200mbit"
    assert Transfer(50_000_000, 2.0).gbps == pytest.approx(0.2)
    assert rate_gbps(12_500_000_000, 1.0) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="positive duration"):
        rate_gbps(1, 0.0)


def test_slowest_pair_skips_the_unmeasured() -> None:
    pairs = [pair(0, 1, 9.4), pair(1, 2, None, "nothing listens"), pair(2, 0, 0.19)]
    assert slowest_pair(pairs)["from_rank"] == 2
    with pytest.raises(ValueError):
        slowest_pair([pair(0, 1, None, "x")])


def test_facts_hold_the_slowest_pair_and_every_pair_and_read_back(tmp_path: Path) -> None:
    pairs = [pair(0, 1, 9.41), pair(1, 2, 0.196), pair(2, 0, 9.38)]
    facts = build_cluster_facts(pairs, {0: "node-0", 1: "node-1", 2: "node-2"}, 2.0)
    assert facts.inter_node_gbps == 0.196 and facts.intra_node_gbps is None
    assert [n["host"] for n in facts.nodes] == ["node-0", "node-1", "node-2"]
    assert [p["gbps"] for p in facts.measured["pairs"]] == [9.41, 0.196, 9.38]
    assert facts.measured["slowest"] == {"from_rank": 1, "to_rank": 2, "gbps": 0.196}
    path = write_cluster_facts(tmp_path / "cluster.json", facts)
    assert load_cluster_facts(path) == facts
    assert json.loads(path.read_text())["inter_node_gbps"] == 0.196
    with pytest.raises(ValueError, match="1 of 2 pairs were not measured"):
        build_cluster_facts([pair(0, 1, 9.4), pair(1, 0, None, "gone")], {}, 2.0)


def test_table_names_each_pair_and_the_slowest() -> None:
    text = render_bandwidth([pair(0, 1, 0.196), pair(1, 0, None, "nothing listens on x")], 2.0)
    assert "rank 0 -> rank 1" in text and "0.196 Gbit/s" in text
    assert "failed: nothing listens on x" in text
    assert "slowest: rank 0 -> rank 1 at 0.196 Gbit/s" in text


# --- the transfer on loopback -------------------------------------------------------------------
def test_transfer_on_loopback_is_timed_by_the_receiver() -> None:
    server = BandwidthServer("127.0.0.1", "tok").start(1)
    started = time.monotonic()
    transfer = measure_to("127.0.0.1", server.port, "tok", Limits(0.3, streams=2, timeout=5))
    assert time.monotonic() - started < 5
    received = server.wait(5)
    assert len(received) == 1 and received[0]["error"] is None
    assert received[0]["nbytes"] == transfer.nbytes > 0
    assert 0.05 < transfer.seconds < 2 and transfer.gbps > 0.1


def test_byte_budget_ends_the_transfer_before_the_time() -> None:
    server = BandwidthServer("127.0.0.1", "tok").start(1)
    limits = Limits(seconds=30, max_bytes=8 << 20, streams=2, timeout=5)
    transfer = measure_to("127.0.0.1", server.port, "tok", limits)
    server.wait(5)
    assert transfer.nbytes == 8 << 20 and transfer.seconds < 5


def test_wrong_token_and_nobody_listening_are_one_line_errors() -> None:
    server = BandwidthServer("127.0.0.1", "right").start(1)
    with pytest.raises(BandwidthError, match="different --token") as wrong:
        measure_to("127.0.0.1", server.port, "wrong", Limits(0.2, timeout=5))
    server.close()
    with pytest.raises(BandwidthError, match="nothing listens on 127.0.0.1") as nobody:
        measure_to("127.0.0.1", server.port, "right", Limits(0.2, timeout=5))
    for error in (wrong, nobody):
        assert "\n" not in str(error.value) and "(fix: " in str(error.value)


def test_silent_peer_ends_within_the_timeout() -> None:
    """A port whose owner accepts and never answers: the sender gives up after its timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        started = time.monotonic()
        with pytest.raises(BandwidthError, match="never answered") as error:
            measure_to("127.0.0.1", silent.getsockname()[1], "tok", Limits(0.2, timeout=1))
        assert time.monotonic() - started < 4
    assert "\n" not in str(error.value)


def test_peer_that_dies_mid_transfer_is_a_one_line_error() -> None:
    """A receiver that answers the hello, then closes: the sender reports the broken transfer."""
    with socket.socket() as dying:
        dying.bind(("127.0.0.1", 0))
        dying.listen(16)

        def answer_then_close() -> None:
            dying.settimeout(5)
            for _ in range(4):  # the sender's streams
                conn, _ = dying.accept()
                conn.recv(HELLO_BYTES)
                conn.sendall(b"OK\n")
                time.sleep(0.05)
                conn.close()

        peer = threading.Thread(target=answer_then_close, daemon=True)
        peer.start()
        started = time.monotonic()
        with pytest.raises(BandwidthError) as error:
            measure_to("127.0.0.1", dying.getsockname()[1], "tok", Limits(1.0, timeout=2))
        peer.join(5)
    assert time.monotonic() - started < 8
    assert "127.0.0.1" in str(error.value) and "\n" not in str(error.value)


# --- the ring ------------------------------------------------------------------------------------
def node_facts(rank: int, port: int) -> dict:
    """A node's facts as gather_facts returns them, for "nodes" that are threads on loopback."""
    versions = dict.fromkeys(VERSION_KEYS, "1.0")
    return {
        "host": f"node-{rank}",
        "versions": versions,
        "fingerprint": fingerprint(versions),
        "gpus": {"count": 0, "names": []},
        "config": None,
        "main_addr": "127.0.0.1",
        "main_port": port,
        "node_rank": rank,
        "interfaces": [],
        "infiniband": [],
        "nccl_socket_ifname": None,
        "nccl_ib_disable": None,
        "resolved": ["127.0.0.1"],
        "resolve_error": None,
        "route_source": "127.0.0.1",
        "is_main": rank == 0,
        "port_problem": None,
        "disk": None,
        "owns_main_addr": True,
    }


def test_the_launch_address_follows_nccl_socket_ifname_else_the_route() -> None:
    eth = {"name": "eth0", "addresses": ["10.0.0.5"], "state": "up", "loopback": False}
    ib = {"name": "ib0", "addresses": ["192.168.0.5"], "state": "up", "loopback": False}
    base = {**node_facts(1, 29500), "interfaces": [eth, ib], "route_source": "10.0.0.5"}
    assert launch_address(base) == ("10.0.0.5", "eth0")
    assert launch_address({**base, "nccl_socket_ifname": "ib"}) == ("192.168.0.5", "ib0")
    assert launch_address({**base, "nccl_socket_ifname": "=ib"}) == ("10.0.0.5", "eth0")
    assert launch_address({**base, "nccl_socket_ifname": "^ib"}) == ("10.0.0.5", "eth0")


def test_three_nodes_measure_a_ring_of_three_pairs(tmp_path: Path) -> None:
    """Three nodes (threads): rank 0 -> 1, 1 -> 2, 2 -> 0, each over its own receiver, gathered by
    node 0 through the shared folder; the facts name the slowest of the three."""
    port, results = find_port(), {}

    def node(rank: int) -> None:
        results[rank] = check_allocation(
            node_facts(rank, port), str(tmp_path), 3, "tok", 20, bandwidth_seconds=0.3
        )

    threads = [threading.Thread(target=node, args=(rank,), daemon=True) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == [0, 1, 2], "a node did not finish within 60 s"
    pairs = results[0].pairs
    assert [(p["from_rank"], p["to_rank"]) for p in pairs] == [(0, 1), (1, 2), (2, 0)]
    assert all(p["error"] is None and p["gbps"] > 0 for p in pairs), pairs
    assert "(rank 1): ok; sent" in results[1].text and results[1].pairs == []
    facts = build_cluster_facts(pairs, results[0].hosts, 0.3)
    assert facts.inter_node_gbps == round(min(p["gbps"] for p in pairs), 4)
    assert [n["host"] for n in facts.nodes] == ["node-0", "node-1", "node-2"]


def test_a_previous_runs_result_is_not_taken_for_this_one(tmp_path: Path) -> None:
    """bandwidth-RANK.json counts only beside the receiver this run's report published."""
    now = {"addr": "10.0.0.1", "port": 40001}
    reports = {0: {"host": "node-0", "bandwidth_endpoint": now}}
    stale = {"endpoint": {"addr": "10.0.0.1", "port": 39999}, "pair": pair(0, 1, 94.0)}
    (tmp_path / "bandwidth-0.json").write_text(json.dumps(stale))
    started = time.monotonic()
    found = wait_for_bandwidth(tmp_path, reports, 2, timeout=0.5)
    assert time.monotonic() - started < 3
    assert [p["error"] for p in found] == ["sent no result in 0.5 s", "sent no report"]
    fresh = {"endpoint": now, "pair": pair(0, 1, 0.19)}
    (tmp_path / "bandwidth-0.json").write_text(json.dumps(fresh))
    assert wait_for_bandwidth(tmp_path, reports, 2, timeout=0.5)[0]["gbps"] == 0.19


# --- the CLI --------------------------------------------------------------------------------------
def test_flags_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    existing = tmp_path / "cluster.json"
    existing.write_text("{}")
    refused = [
        (["doctor", "--measure-bandwidth"], "measure-bandwidth: "),
        (["doctor", "--serve", "29500", "--measure-bandwidth"], "measure-bandwidth: "),
        (
            ["doctor", "--allocation", str(tmp_path), "--facts-out", str(existing)],
            "facts-out: ",
        ),
        (
            ["doctor", "--allocation", str(tmp_path), "--measure-bandwidth"]
            + ["--bandwidth-seconds", "0"],
            "bandwidth-seconds: ",
        ),
        (
            ["doctor", "--allocation", str(tmp_path), "--measure-bandwidth"]
            + ["--nodes", "1", "--node-rank", "0", "--main-addr", "127.0.0.1"],
            "measure-bandwidth: needs two or more nodes",
        ),
    ]
    for argv, start in refused:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"zerofit: error: {start}") and len(err.strip().splitlines()) == 1
    assert existing.read_text() == "{}"  # without --force the file is never touched


def test_a_node_that_never_comes_writes_no_facts(tmp_path: Path, capsys) -> None:
    """Node 0 alone: its pair has no peer, the run fails within the timeout, and no file."""
    facts_out = tmp_path / "cluster.json"
    argv = ["doctor", "--allocation", str(tmp_path / "rep"), "--main-addr", "127.0.0.1"]
    argv += ["--main-port", str(find_port()), "--nodes", "2", "--node-rank", "0"]
    argv += ["--timeout", "1", "--measure-bandwidth", "--facts-out", str(facts_out)]
    started = time.monotonic()
    assert main(argv) == 1
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert "bandwidth: rank 0 -> rank 1: rank 1 sent no report" in err
    assert f"{facts_out} not written: 2 of 2 pairs were not measured" in err
    assert not facts_out.exists()


def find_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_two_nodes(
    directory: Path, main_addr: str, facts_out: Path, seconds: float, wrap=lambda rank, cmd: cmd
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """`zerofit doctor --allocation --measure-bandwidth` as node 0 and node 1 at once (each
    imports torch for its versions: seconds on a busy machine)."""
    port = find_port()
    cmd = [sys.executable, "-m", "zerofit", "doctor", "--allocation", str(directory)]
    cmd += ["--main-addr", main_addr, "--main-port", str(port), "--nodes", "2"]
    cmd += ["--timeout", "20", "--measure-bandwidth", "--bandwidth-seconds", str(seconds)]
    cmd += ["--facts-out", str(facts_out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    node0 = subprocess.Popen(
        wrap(0, cmd + ["--node-rank", "0"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        node1 = subprocess.run(
            wrap(1, cmd + ["--node-rank", "1"]),
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        out0, err0 = node0.communicate(timeout=60)
    finally:
        if node0.poll() is None:
            node0.kill()
            node0.wait(10)
    return subprocess.CompletedProcess(node0.args, node0.returncode, out0, err0), node1


def test_allocation_on_loopback_writes_facts_that_read_back(tmp_path: Path, capsys) -> None:
    """The CLI as node 0 and node 1 (two threads of this process: no second torch import)."""
    facts_out = tmp_path / "cluster.json"
    argv = ["doctor", "--allocation", str(tmp_path / "rep"), "--main-addr", "127.0.0.1"]
    argv += ["--main-port", str(find_port()), "--nodes", "2", "--timeout", "20"]
    argv += ["--measure-bandwidth", "--bandwidth-seconds", "0.3", "--facts-out", str(facts_out)]
    codes = {}

    def node(rank: int) -> None:
        codes[rank] = main(argv + ["--node-rank", str(rank)])

    threads = [threading.Thread(target=node, args=(rank,), daemon=True) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    out, err = capsys.readouterr()
    assert codes == {0: 0, 1: 0}, err
    assert "slowest: rank" in out and f"wrote {facts_out}" in out
    assert "(rank 1): ok; sent" in out
    facts = load_cluster_facts(facts_out)
    measured = [p["gbps"] for p in facts.measured["pairs"]]
    assert len(measured) == 2 and facts.inter_node_gbps == min(measured) > 0


# --- two namespaces over a veth pair shaped to 200 Mbit/s ---------------------------------------
def load_real_cluster():
    """tests/launch/real_cluster.py (not a package): its namespace helpers, imported once."""
    if "real_cluster" in sys.modules:
        return sys.modules["real_cluster"]
    spec = importlib.util.spec_from_file_location("real_cluster", LAUNCH_TESTS / "real_cluster.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_cluster"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.exclusive  # a rate within 15 %: nothing else may compete for the CPU
def test_shaped_link_between_namespaces_measures_its_rate(tmp_path: Path) -> None:
    """Node 0 and node 1 in their own network namespaces; tc's token bucket limits each side's
    sending to 200 Mbit/s. The ring measures both directions at once, so each carries the other's
    ACKs too, as in a ring all-reduce. (Shaping one side only would starve the other direction:
    its ACKs queue behind 50 ms of the shaped side's data.)"""
    cluster = load_real_cluster()
    cluster.need_root_and(("ip", "tc", "nsenter"), "the shaped-link bandwidth test")
    with cluster.namespace_pair(f"zfbw{os.getpid() % 10000}", "10.83.0") as hosts:
        for namespace in hosts.names:
            shape = cluster.run(
                ["tc", "-n", namespace, "qdisc", "add", "dev", cluster.IFACE, "root", "tbf"]
                + ["rate", f"{SHAPED_MBIT}mbit", "burst", "64kb", "latency", "50ms"]
            )
            if shape.returncode != 0:
                pytest.skip(f"tc cannot shape the veth here: {shape.stderr.strip()}")
        facts_out = tmp_path / "cluster.json"
        node0, node1 = run_two_nodes(
            tmp_path / "rep",
            hosts.addrs[0],
            facts_out,
            seconds=1.0,  # TCP under a 50 ms tbf queue needs a second to average out
            wrap=lambda rank, cmd: cluster.in_ns(hosts.names[rank], cmd),
        )
    assert node0.returncode == 0 and node1.returncode == 0, node0.stderr + node1.stderr
    print(node0.stdout)  # the table, under -s
    facts = load_cluster_facts(facts_out)
    there, back = facts.measured["pairs"]
    assert (there["from_addr"], there["to_addr"]) == hosts.addrs  # the launch's network
    assert (back["from_addr"], back["to_addr"]) == hosts.addrs[::-1]
    assert there["from_interface"] == back["from_interface"] == cluster.IFACE
    for measured in (there, back):
        payload_gbps = SHAPED_MBIT / 1000 * PAYLOAD_PER_FRAME
        assert measured["gbps"] == pytest.approx(payload_gbps, rel=0.15)
    assert facts.inter_node_gbps == min(there["gbps"], back["gbps"])
