"""Two "nodes" on one machine: the node0.sh / node1.sh that `zerofit launch` writes, run side by
side.

Each node is one CPU process (gloo) training a tiny Qwen2 with DeepSpeed ZeRO-2 for a few real
steps, rendezvousing over 127.0.0.1 on a free port. Also: a node killed mid-run makes the other
exit non-zero with a clear message instead of hanging, and a node that never joins makes the main
node give up after the configured rendezvous timeout.

Run: .venv/bin/python -m pytest tests/launch/test_multinode.py -q
(serial; ~15-25 s per run when warm)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GRPO_TWO_NODE_FLAGS, two_node_config_argv

from zerofit.cli.main import main

pytestmark = pytest.mark.distributed
REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "tests" / "scripts" / "multinode_train.py"
GRPO = REPO / "recipes" / "grpo.py"
RUN_LIMIT = 240  # s: a generous bound for a warm ~20 s run on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch) -> Path:
    """`zerofit config` output for 2 nodes x 1 GPU, ZeRO-2, micro batch 2 (the script's), free port.

    `zerofit config --out cfg` writes the DeepSpeed JSON path into accelerate.yaml absolutely; the
    nodes run from tmp_path like a user launching from their project directory.
    """
    monkeypatch.chdir(tmp_path)
    argv = two_node_config_argv(free_port(), "--micro-batch", "2", "--global-batch", "4")
    assert main(argv) == 0
    assert (
        json.loads((tmp_path / "cfg" / "ds_config.json").read_text())["zero_optimization"]["stage"]
        == 2
    )
    return tmp_path


def render(cluster: Path, style: str, *train_args: str, timeout: int = 60) -> Path:
    out = cluster / style
    argv = [
        "launch",
        "--config",
        "cfg/accelerate.yaml",
        "--style",
        style,
        "--out",
        str(out),
        "--timeout",
        str(timeout),
        "--python",
        sys.executable,
        "--",
        str(TRAIN),
        *train_args,
    ]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> str:
    """PATH with the venv's launchers but NOT its pip `ninja`: torch JIT-builds DeepSpeed's shm op
    with whichever ninja is first on PATH, and the venv's (1.13) and the system's (1.11) record
    different command hashes, so alternating them rebuilds the op (~50 s) on every switch."""
    bin_dir = tmp_path_factory.mktemp("bin")
    names = ["accelerate", "torchrun"]  # env style gets --python sys.executable
    if (
        shutil.which("ninja") is None
    ):  # no ninja elsewhere: the venv's is the only one, so no switching
        names.append("ninja")
    for name in names:
        (bin_dir / name).symlink_to(Path(sys.executable).parent / name)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def node_env(tools: str, **extra: str) -> dict:
    return dict(os.environ, PATH=tools, DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore", **extra)


def start(script: Path, log: Path, tools: str) -> subprocess.Popen:
    env = node_env(tools)
    with open(log, "wb") as fh:  # own session: the test can stop the node's whole process tree
        return subprocess.Popen(
            ["bash", str(script)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=script.parent.parent,
            start_new_session=True,
        )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``; torchrun starts its workers in sessions of their own."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL a node's whole process tree at once, as if the machine died."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop(proc: subprocess.Popen) -> None:
    kill_node(proc)
    proc.wait()


def wait_for(proc: subprocess.Popen, limit: float) -> int | None:
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.parametrize("style", ["accelerate", "torchrun", "env"])
def test_two_nodes_train_and_exit_zero(cluster: Path, style: str, tools: str) -> None:
    out = render(cluster, style, "--steps", "3", "--expect-world-size", "2")
    started = time.monotonic()
    nodes = [start(out / f"node{r}.sh", cluster / f"{style}{r}.log", tools) for r in (0, 1)]
    try:
        codes = [wait_for(p, RUN_LIMIT) for p in nodes]
    finally:
        for p in nodes:
            stop(p)
    logs = [(cluster / f"{style}{r}.log").read_text() for r in (0, 1)]
    print(f"{style}: 2 nodes x 1 process, 3 steps in {time.monotonic() - started:.1f} s")
    assert codes == [0, 0], logs
    # c10d may hand out ranks in either order; both ranks ran all 3 steps, on ZeRO-2
    both = logs[0] + logs[1]
    for rank in (0, 1):
        assert f"rank {rank}/2 step 2 loss" in both
    assert "zero_stage 2" in both
    assert "multinode_train: done, 3 steps, world size 2" in both
    # loss is all-reduced, so both ranks print the same value at each step
    losses = sorted(
        line.split(" loss ")[1] for line in both.splitlines() if " step 2 loss " in line
    )
    assert len(losses) == 2 and losses[0] == losses[1]


def test_grpo_recipe_on_two_nodes(tmp_path: Path, monkeypatch, tools: str) -> None:
    """The GRPO recipe (tiny built-in model, toy task) through `zerofit config` and `launch`."""
    monkeypatch.chdir(tmp_path)
    assert main(two_node_config_argv(free_port(), *GRPO_TWO_NODE_FLAGS, gpu="L4")) == 0
    assert (
        main(
            [
                "launch",
                "--config",
                "cfg/accelerate.yaml",
                "--out",
                "launch",
                "--",
                str(GRPO),
                "--max-steps",
                "2",
                "--save-every",
                "0",
                "--output-dir",
                "run",
            ]
        )
        == 0
    )
    nodes = [
        start(tmp_path / "launch" / f"node{r}.sh", tmp_path / f"grpo{r}.log", tools) for r in (0, 1)
    ]
    try:
        codes = [wait_for(p, RUN_LIMIT) for p in nodes]
    finally:
        for p in nodes:
            stop(p)
    logs = [(tmp_path / f"grpo{r}.log").read_text() for r in (0, 1)]
    assert codes == [0, 0], [log[-3000:] for log in logs]
    assert "grpo: 2 process(es), ZeRO stage 2, 2 prompts x 8 generations per step" in logs[0]
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]


def test_node_killed_mid_run_fails_fast_with_message(cluster: Path, tools: str) -> None:
    out = render(
        cluster,
        "accelerate",
        "--steps",
        "200",
        "--step-sleep",
        "0.5",
        "--timeout",
        "30",
        timeout=60,
    )
    logs = [cluster / "fault0.log", cluster / "fault1.log"]
    nodes = [start(out / f"node{r}.sh", logs[r], tools) for r in (0, 1)]
    try:
        deadline = time.monotonic() + RUN_LIMIT
        while "step 1 loss" not in logs[1].read_text() and time.monotonic() < deadline:
            assert nodes[0].poll() is None and nodes[1].poll() is None, logs[0].read_text()
            time.sleep(0.2)
        assert "step 1 loss" in logs[1].read_text(), "node 1 never got mid-run"
        kill_node(nodes[1])
        killed = time.monotonic()
        code = wait_for(nodes[0], 60)
        took = time.monotonic() - killed
    finally:
        for p in nodes:
            stop(p)
    text = logs[0].read_text()
    print(f"fault: node 0 exited {code} {took:.1f} s after node 1 was killed")
    assert code is not None, "node 0 hung after its peer died"
    assert code != 0
    assert took < 45  # the collective timeout is 30 s; a dead TCP peer is usually seen at once
    assert "zerofit: node 0 failed with exit status" in text
    assert "multinode_train: rank 0 lost its peers" in text
    assert "step 199" not in text


def test_node_that_never_joins_times_out(cluster: Path, tools: str) -> None:
    out = render(cluster, "torchrun", "--steps", "3", timeout=3)
    started = time.monotonic()
    node0 = start(out / "node0.sh", cluster / "alone.log", tools)
    try:
        code = wait_for(node0, 120)
    finally:
        stop(node0)
    took = time.monotonic() - started
    print(f"rendezvous timeout: node 0 alone gave up after {took:.1f} s (join_timeout 3 s)")
    assert code not in (None, 0)
    assert took < 90
    text = (cluster / "alone.log").read_text()
    assert "RendezvousTimeoutError" in text and "zerofit: node 0 failed with exit status" in text


# --- two network namespaces joined by a veth pair: separate addresses, a real (virtual) link ------
def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def netns():
    """Namespaces A (10.77.0.1) and B (10.77.0.2) over veth; created here, always removed."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"zf{os.getpid() % 100000}"
    names = (f"{tag}a", f"{tag}b")
    if _ip("netns", "add", names[0]).returncode != 0:
        pytest.skip("`ip netns add` is not permitted here")
    try:
        steps = [
            ("netns", "add", names[1]),
            ("link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb"),
            ("link", "set", f"{tag}va", "netns", names[0]),
            ("link", "set", f"{tag}vb", "netns", names[1]),
        ]
        for ns, dev, addr in (
            (names[0], f"{tag}va", "10.77.0.1/24"),
            (names[1], f"{tag}vb", "10.77.0.2/24"),
        ):
            steps += [
                ("-n", ns, "addr", "add", addr, "dev", dev),
                ("-n", ns, "link", "set", dev, "up"),
                ("-n", ns, "link", "set", "lo", "up"),
            ]
        for step in steps:
            res = _ip(*step)
            if res.returncode != 0:
                pytest.skip(f"ip {' '.join(step)}: {res.stderr.strip()}")
        yield [(names[0], f"{tag}va", "10.77.0.1"), (names[1], f"{tag}vb", "10.77.0.2")]
    finally:
        for ns in names:
            _ip("netns", "del", ns)


def in_ns(ns: str, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


def test_doctor_serve_connect_across_namespaces(netns) -> None:
    (ns_a, _, addr_a), (ns_b, _, _) = netns
    port = free_port()
    doctor = [sys.executable, "-m", "zerofit", "doctor"]
    server = subprocess.Popen(
        in_ns(ns_a, doctor + ["--serve", str(port), "--timeout", "30"]),
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        assert "listening on port" in server.stdout.readline()
        ok = subprocess.run(
            in_ns(ns_b, doctor + ["--connect", f"{addr_a}:{port}", "--timeout", "5"]),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert ok.returncode == 0, ok.stderr
        assert server.wait(timeout=10) == 0
    finally:
        if server.poll() is None:
            server.kill()
    # B's own loopback is not A's: the classic "127.0.0.1 as main address" mistake, seen from node 1
    wrong = subprocess.run(
        in_ns(ns_b, doctor + ["--connect", f"127.0.0.1:{port}", "--timeout", "5"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert wrong.returncode == 1 and "nothing listens on 127.0.0.1" in wrong.stderr


def test_two_nodes_in_separate_network_namespaces(cluster: Path, netns, tools: str) -> None:
    (ns_a, dev_a, addr_a), (ns_b, dev_b, _) = netns
    out = cluster / "netns"
    assert (
        main(
            [
                "launch",
                "--config",
                "cfg/accelerate.yaml",
                "--main-addr",
                addr_a,
                "--out",
                str(out),
                "--",
                str(TRAIN),
                "--steps",
                "3",
            ]
        )
        == 0
    )
    nodes = []
    for rank, (ns, dev) in enumerate(((ns_a, dev_a), (ns_b, dev_b))):
        # what the commented GLOO_/NCCL_SOCKET_IFNAME lines are for: each node names its interface
        env = node_env(tools, GLOO_SOCKET_IFNAME=dev)
        with open(cluster / f"ns{rank}.log", "wb") as fh:
            nodes.append(
                subprocess.Popen(
                    in_ns(ns, ["bash", str(out / f"node{rank}.sh")]),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=cluster,
                    start_new_session=True,
                )
            )
    try:
        codes = [wait_for(p, RUN_LIMIT) for p in nodes]
    finally:
        for p in nodes:
            stop(p)
    logs = [(cluster / f"ns{r}.log").read_text() for r in (0, 1)]
    assert codes == [0, 0], logs
    assert (
        "rank 1/2 step 2 loss" in logs[1]
        and "multinode_train: done, 3 steps, world size 2" in logs[0]
    )
