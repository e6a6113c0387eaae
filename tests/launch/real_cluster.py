"""Real cluster engines on this machine, for tests/launch (imported by the test files; not a
conftest, whose module name other test folders import): two network namespaces joined by a veth
pair, a Slurm 22.05 cluster (one munged, slurmctld + one slurmd per namespace) and one sshd per
namespace for DeepSpeed's pdsh launcher.

Everything is created by the fixture and removed by it, also on failure: daemons by pid, every
process left inside the namespaces (job steps, ranks) by pid from `ip netns pids`, then the
namespaces and the files. Traffic stays on the veth pair. Every wait is bounded.

The packages come from `make cluster-deps` (root + apt); without them, or without root, the tests
skip and say why.

The test files import its helpers, then name it in `pytest_plugins` for its fixtures; pytest
would warn that it cannot rewrite the asserts of a module imported first, so it opts out:
PYTEST_DONT_REWRITE (as before: pytest rewrites only test modules and conftests).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

IFACE = "zfeth0"  # the same interface name in both namespaces, as eth0 on real nodes
SLURM_BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "squeue",
    "nsenter",
)
SSH_BINARIES = ("sshd", "ssh", "ssh-keygen", "pdsh", "nsenter")


def need_root_and(binaries: tuple[str, ...], what: str) -> None:
    """Skip with the reason when this machine cannot host the real engine."""
    if os.geteuid() != 0:
        pytest.skip(f"{what} needs root (network namespaces, daemons)")
    missing = [b for b in binaries if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        pytest.skip(
            f"{what}: {', '.join(missing)} not installed; run `make cluster-deps` as root (apt-get)"
        )


def run(cmd: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def in_ns(ns: str, cmd: list[str]) -> list[str]:
    """Run in namespace ``ns`` with nsenter (`ip netns exec` remounts /sys: slurmd fails)."""
    return ["nsenter", f"--net=/run/netns/{ns}", *cmd]


def wait_until(what: str, predicate, limit: float, every: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; fail after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")
        time.sleep(every)


def ns_pids(ns: str) -> list[int]:
    res = run(["ip", "netns", "pids", ns])
    return [int(p) for p in res.stdout.split()] if res.returncode == 0 else []


def kill_pids(pids, sig=signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class Hosts:
    """Two "nodes": namespace names and addresses, both with interface IFACE."""

    names: tuple[str, str]
    addrs: tuple[str, str]


@contextlib.contextmanager
def namespace_pair(tag: str, subnet: str):
    """Namespaces ``tag``a / ``tag``b at ``subnet``.1 / .2 over veth; always removed, with
    whatever still runs inside them."""
    names = (f"{tag}a", f"{tag}b")
    created = []
    try:
        for ns in names:
            res = run(["ip", "netns", "add", ns])
            if res.returncode != 0:
                pytest.skip(f"`ip netns add` is not permitted here: {res.stderr.strip()}")
            created.append(ns)
        steps = [["link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb"]]
        for ns, dev, host in ((names[0], f"{tag}va", 1), (names[1], f"{tag}vb", 2)):
            steps += [
                ["link", "set", dev, "netns", ns],
                ["-n", ns, "link", "set", dev, "name", IFACE],
                ["-n", ns, "addr", "add", f"{subnet}.{host}/24", "dev", IFACE],
                ["-n", ns, "link", "set", IFACE, "up"],
                ["-n", ns, "link", "set", "lo", "up"],
            ]
        for step in steps:
            res = run(["ip", *step])
            if res.returncode != 0:
                pytest.skip(f"ip {' '.join(step)}: {res.stderr.strip()}")
        yield Hosts(names, (f"{subnet}.1", f"{subnet}.2"))
    finally:
        for ns in created:  # whatever still runs inside (job steps, ranks, sshd children)
            kill_pids(ns_pids(ns))
        for ns in created:
            run(["ip", "netns", "del", ns])


def stop_daemons(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each daemon by pid, SIGKILL what is left after 10 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


# --- Slurm ---------------------------------------------------------------------------------
SLURM_CONF = """\
ClusterName=zerofit
SlurmctldHost={host}({addr0})
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s);
# 5 s is the least Slurm takes (src/common/slurm_cred.c refuses a smaller value): the credentials
# it bounds are used within a second here (one host, no prolog)
AuthInfo=socket={munge_socket},cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# a pending job whose begin time passed (a requeued job, cred_expire after its requeue) starts at
# the next scheduling pass: every second here, not every 30 s (backfill) / 60 s (main loop)
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
MinJobAge=300
JobRequeue=1
GresTypes=gpu
# the nodes stand for GPU nodes: 16 cores and one "GPU" each (config_overrides: trust this file)
SlurmdParameters=config_overrides
NodeName={node0} NodeAddr={addr0} CPUs=16 Gres=gpu:1 State=UNKNOWN
NodeName={node1} NodeAddr={addr1} CPUs=16 Gres=gpu:1 State=UNKNOWN
PartitionName=zf Nodes={node0},{node1} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running two-node cluster; every client command runs in namespace A, next to slurmctld."""

    hosts: Hosts
    root: Path
    nodes: tuple[str, str]
    env: dict = field(default_factory=dict)

    def client(
        self, *cmd: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        return run(
            in_ns(self.hosts.names[0], list(cmd)), timeout=timeout, env=env or self.env, cwd=cwd
        )

    def sbatch(self, script: Path, env: dict, cwd: Path) -> str:
        res = self.client(
            "sbatch",
            "--parsable",
            str(script),
            env=dict(env, SLURM_CONF=self.env["SLURM_CONF"]),
            cwd=cwd,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as {key: value} (empty once the job is gone)."""
        out = self.client("scontrol", "show", "job", "-o", job_id).stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def wait_state(self, job_id: str, states: tuple[str, ...], limit: float) -> dict[str, str]:
        return wait_until(
            f"job {job_id} to reach {states}",
            lambda: (j := self.job(job_id)).get("JobState") in states and j,
            limit,
            every=0.5,
        )

    def cancel_all(self) -> None:
        self.client("scancel", "--full", "--partition=zf")


def start_munged(root: Path) -> tuple[subprocess.Popen, Path]:
    (root / "munge").mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = root / "munge" / "munge.socket"
    proc = subprocess.Popen(
        [
            "munged",
            "-F",
            "--force",
            f"--key-file={key}",
            f"--socket={sock}",
            f"--pid-file={root / 'munge' / 'munged.pid'}",
            f"--log-file={root / 'munge' / 'log'}",
            f"--seed-file={root / 'munge' / 'seed'}",
            "--num-threads=2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_until("munged's socket", lambda: sock.exists() or proc.poll() is not None, 20)
    if proc.poll() is not None:
        pytest.fail(f"munged exited: {proc.stderr.read().decode()[-500:]}")
    return proc, sock


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A real Slurm cluster of two nodes (zfn0 in namespace A, zfn1 in B); removed afterwards."""
    need_root_and(SLURM_BINARIES, "the Slurm cluster")
    root = tmp_path_factory.mktemp("slurm")
    tag = f"zs{os.getpid() % 100000}"
    daemons: list[subprocess.Popen] = []
    with namespace_pair(tag, "10.78.0") as hosts:
        try:
            munged, sock = start_munged(root)
            daemons.append(munged)
            nodes = ("zfn0", "zfn1")
            host = run(["hostname", "-s"]).stdout.strip()
            conf = root / "slurm.conf"
            conf.write_text(
                SLURM_CONF.format(
                    host=host,
                    addr0=hosts.addrs[0],
                    addr1=hosts.addrs[1],
                    root=root,
                    munge_socket=sock,
                    node0=nodes[0],
                    node1=nodes[1],
                )
            )
            # one stand-in "GPU" device per node: `--gres=gpu:N` in job.sbatch is accepted as is
            (root / "gres.conf").write_text("Name=gpu File=/dev/null\n")
            for sub in ("state", f"spool-{nodes[0]}", f"spool-{nodes[1]}"):
                (root / sub).mkdir()
            env = dict(os.environ, SLURM_CONF=str(conf))
            logs = root / "daemons.log"
            with open(logs, "ab") as fh:
                daemons.append(
                    subprocess.Popen(
                        in_ns(hosts.names[0], ["slurmctld", "-D", "-i", "-f", str(conf)]),
                        stdout=fh,
                        stderr=fh,
                        env=env,
                    )
                )
                for ns, node in zip(hosts.names, nodes, strict=True):
                    daemons.append(
                        subprocess.Popen(
                            in_ns(ns, ["slurmd", "-D", "-f", str(conf), "-N", node]),
                            stdout=fh,
                            stderr=fh,
                            env=env,
                        )
                    )
            cluster = SlurmCluster(hosts, root, nodes, env)

            def idle() -> bool:
                for p in daemons:
                    if p.poll() is not None:
                        pytest.fail(f"a Slurm daemon exited: {logs.read_text()[-1500:]}")
                out = cluster.client("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
                return out.count("idle") == 2

            wait_until("both slurmd nodes idle", idle, 60, every=0.5)
            yield cluster
            cluster.cancel_all()
            with contextlib.suppress(AssertionError):
                wait_until(
                    "jobs to end", lambda: not cluster.client("squeue", "-h").stdout.strip(), 20
                )
        finally:
            stop_daemons(list(reversed(daemons[1:])))
            for ns in hosts.names:  # slurmstepd and job tasks left behind after their slurmd
                kill_pids(ns_pids(ns))
            stop_daemons(daemons[:1])  # munged last: slurmstepd talks to it while ending
    shutil.rmtree(root, ignore_errors=True)


# --- sshd per namespace, for pdsh ---------------------------------------------------------
SSHD_CONF = """\
Port {port}
ListenAddress {addr}
HostKey {host_key}
PidFile {root}/sshd-{addr}.pid
AuthorizedKeysFile {root}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
"""
SSH_PORT = 16822


SSH_CLIENT_CONF = """\
IdentityFile {key}
Port {port}
User root
BatchMode yes
StrictHostKeyChecking no
UserKnownHostsFile /dev/null
LogLevel ERROR
ConnectTimeout 10
"""


@dataclass
class SshHosts:
    """The sshd pair plus a bin/ directory whose `ssh` uses the test's client config (as a user's
    ~/.ssh/config would; root's own ~/.ssh is never touched). DeepSpeed's ssh check and pdsh both
    run `ssh` from PATH."""

    hosts: Hosts
    root: Path
    key: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def ssh_args(self) -> str:
        return f"-F {self.root / 'ssh_config'}"


def sshd_answers(daemons: list, ssh, ns: str, addr: str) -> bool:
    """True once ``addr``'s sshd takes a login from namespace ``ns``; fails if an sshd exited."""
    for p in daemons:
        if p.poll() is not None:
            pytest.fail(f"sshd exited: {p.stderr.read().decode()[-800:]}")
    cmd = ["ssh", *ssh.ssh_args.split(), f"root@{addr}", "true"]
    return run(in_ns(ns, cmd), timeout=20).returncode == 0


@pytest.fixture
def ssh_hosts(tmp_path_factory):
    """sshd in each of two namespaces, accepting a key made for the test only."""
    need_root_and(SSH_BINARIES, "DeepSpeed's pdsh launcher")
    root = tmp_path_factory.mktemp("ssh")
    root.chmod(0o700)
    key = root / "id_test"
    assert run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)]).returncode == 0
    assert (
        run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key")]
        ).returncode
        == 0
    )
    shutil.copy(f"{key}.pub", root / "authorized_keys")
    privsep = Path("/run/sshd")  # sshd's privilege-separation directory; made only if missing
    made_privsep = not privsep.exists()
    privsep.mkdir(mode=0o755, exist_ok=True)
    tag = f"zd{os.getpid() % 100000}"
    daemons: list[subprocess.Popen] = []
    try:
        with namespace_pair(tag, "10.79.0") as hosts:
            try:
                sshd = shutil.which("sshd") or "/usr/sbin/sshd"
                for ns, addr in zip(hosts.names, hosts.addrs, strict=True):
                    conf = root / f"sshd-{addr}.conf"
                    conf.write_text(
                        SSHD_CONF.format(
                            port=SSH_PORT, addr=addr, host_key=root / "host_key", root=root
                        )
                    )
                    daemons.append(
                        subprocess.Popen(
                            in_ns(ns, [sshd, "-D", "-e", "-f", str(conf)]),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                        )
                    )
                ssh = SshHosts(hosts, root, key)
                (root / "ssh_config").write_text(SSH_CLIENT_CONF.format(key=key, port=SSH_PORT))
                ssh.bin_dir.mkdir()
                real_ssh = shutil.which("ssh")
                (ssh.bin_dir / "ssh").write_text(
                    f'#!/bin/sh\nexec {real_ssh} -F {root / "ssh_config"} "$@"\n'
                )
                (ssh.bin_dir / "ssh").chmod(0o755)
                for addr in hosts.addrs:  # each sshd answers before the test starts
                    wait_until(
                        f"sshd on {addr}",
                        functools.partial(sshd_answers, daemons, ssh, hosts.names[0], addr),
                        30,
                        every=0.5,
                    )
                yield ssh
            finally:
                stop_daemons(daemons)
    finally:
        if made_privsep:
            shutil.rmtree(privsep, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tool_path(tmp_path_factory) -> str:
    """PATH with the venv's launchers but not its pip `ninja` (see test_multinode.tools): torch
    JIT-builds
    DeepSpeed's shm op with whichever ninja is first on PATH, and switching rebuilds it (~50 s)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    names = ["accelerate", "torchrun", "deepspeed"]
    if shutil.which("ninja") is None:
        names.append("ninja")
    for name in names:
        (bin_dir / name).symlink_to(Path(sys.executable).parent / name)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
