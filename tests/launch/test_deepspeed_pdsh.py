"""The hostfile + launch.sh of `zerofit launch --style deepspeed`, run for real: DeepSpeed's own
launcher reaches both "hosts" (network namespaces, each with an sshd accepting a test key; see
real_cluster.ssh_hosts) over pdsh + ssh and trains a few steps with world size 2.

Also proven on the way: arguments reach every rank verbatim, with nothing executed by the remote
shell pdsh hands them to; the variables the ranks need (GLOO_SOCKET_IFNAME, the accelerate/
DeepSpeed settings) arrive through .deepspeed_env; launch.sh works when started from another
directory.

Run: .venv/bin/python -m pytest tests/launch/test_deepspeed_pdsh.py -q   (root; ~1 min)
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import two_node_config_argv
from real_cluster import in_ns

from zerofit.cli.main import main

pytestmark = pytest.mark.distributed
pytest_plugins = ["real_cluster"]  # its fixtures: the cluster, ssh hosts, tool PATH
REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "tests" / "scripts" / "multinode_train.py"
RUN_LIMIT = 300


def test_deepspeed_launcher_over_pdsh_trains_on_two_hosts(
    ssh_hosts, tmp_path, monkeypatch, tool_path
) -> None:
    (addr0, addr1), ns0 = ssh_hosts.hosts.addrs, ssh_hosts.hosts.names[0]
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    assert main(two_node_config_argv(29544, "--micro-batch", "2", "--global-batch", "4")) == 0
    pwned = tmp_path / "pwned"
    hostile = f"arg $(touch {pwned})"
    notes = [hostile, "it's", f"`touch {pwned}`", 'say "hi" \\ $HOME', "tab\there"]
    argv = [
        "launch",
        "--style",
        "deepspeed",
        "--config",
        "cfg/accelerate.yaml",
        "--hosts",
        f"{addr0},{addr1}",
        "--main-addr",
        addr0,
        "--ifname",
        "zfeth0",
        "--out",
        "ds",
        "--",
        str(TRAIN),
        "--steps",
        "3",
    ]
    for note in notes:
        argv += ["--note", note]
    assert main(argv) == 0
    env_file = (project / "ds" / ".deepspeed_env").read_text()
    # `zerofit config` names its JSON by absolute path (accelerate opens it relative to each
    # worker's working directory); launch carries it into .deepspeed_env as written
    ds_json = (project / "cfg" / "ds_config.json").resolve()
    assert (
        "GLOO_SOCKET_IFNAME=zfeth0\n" in env_file
        and f"ACCELERATE_DEEPSPEED_CONFIG_FILE={ds_json}\n" in env_file
    )
    # The ranks load DeepSpeed's shm comm op as every other launch of the suite does: from the
    # venv's TORCH_EXTENSIONS_DIR, built by the same ninja (another ninja rebuilds it, ~1 min).
    # pdsh's login shell has neither, so they go into .deepspeed_env, where a user puts theirs.
    with open(project / "ds" / ".deepspeed_env", "a") as extra:
        if os.environ.get("TORCH_EXTENSIONS_DIR"):
            extra.write(f"TORCH_EXTENSIONS_DIR={os.environ['TORCH_EXTENSIONS_DIR']}\n")
        extra.write(f"PATH={tool_path}\n")

    elsewhere = tmp_path / "elsewhere"  # launch.sh finds its hostfile and the project from anywhere
    elsewhere.mkdir()
    env = dict(os.environ, PATH=f"{ssh_hosts.bin_dir}:{tool_path}", PYTHONWARNINGS="ignore")
    env.pop("GLOO_SOCKET_IFNAME", None)
    started = time.monotonic()
    with open(tmp_path / "ds.log", "wb") as log:
        proc = subprocess.Popen(
            in_ns(ns0, ["bash", str(project / "ds" / "launch.sh")]),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=elsewhere,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=RUN_LIMIT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
    text = (tmp_path / "ds.log").read_text(errors="replace")
    print(f"deepspeed pdsh: 2 hosts x 1 process, 3 steps in {time.monotonic() - started:.1f} s")
    assert code == 0, text[-4000:]
    # pdsh prefixes every line with the host it came from: both hosts trained
    for host, rank in ((addr0, 0), (addr1, 1)):
        assert f"{host}: rank {rank}/2 step 2 loss" in text, text[-4000:]
        assert f"{host}: multinode_train: rank {rank} notes {notes!r}" in text, text[-4000:]
    assert "multinode_train: done, 3 steps, world size 2" in text
    assert "zero_stage 2" in text
    assert not pwned.exists(), "an argument was executed by a remote shell"
