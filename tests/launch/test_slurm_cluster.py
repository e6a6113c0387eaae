"""The `job.sbatch` of `zerofit launch --style slurm` on a real Slurm 22.05 cluster of two "nodes"
(network namespaces; see conftest.slurm_cluster), submitted with sbatch, unedited except the
partition line.

- GRPO (recipes/grpo.py, tiny built-in model) trains on both nodes with world size 2 after
  `zerofit doctor --allocation` passed on both; preempted mid-run (the USR1 that `--signal`
  sends before the time limit) the job requeues itself and continues from its latest checkpoint.
- A real time limit: Slurm itself signals the job, which requeues and restarts with
  `--resume-from latest`.
- A node whose training process dies fails the job, naming the node, instead of hanging.

Run: .venv/bin/python -m pytest tests/launch/test_slurm_cluster.py -q   (root; ~2-4 min)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import GRPO_TWO_NODE_FLAGS, two_node_config_argv
from real_cluster import kill_pids, ns_pids, wait_until

from zerofit.cli.main import main

pytestmark = [pytest.mark.distributed, pytest.mark.light]
pytest_plugins = ["real_cluster"]  # its fixtures: the cluster, ssh hosts, tool PATH
REPO = Path(__file__).resolve().parents[2]
GRPO = REPO / "recipes" / "grpo.py"
TRAIN = REPO / "tests" / "scripts" / "multinode_train.py"
PROBE = REPO / "tests" / "scripts" / "resume_probe.py"
JOB_LIMIT = 300  # s: bound on one job attempt on a busy 2-core machine (a warm one takes ~30-60 s)


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A project directory with `zerofit config` output for 2 nodes x 1 GPU (ZeRO-2, GRPO sizes).

    The cluster has no real GPUs, so accelerate.yaml gets `use_cpu: true`: the doctor then checks a
    CPU run instead of failing on "0 GPUs visible, 1 wanted" (what it should say otherwise).
    """
    monkeypatch.chdir(tmp_path)
    assert main(two_node_config_argv(29533, *GRPO_TWO_NODE_FLAGS, gpu="L4")) == 0
    cfg = tmp_path / "cfg" / "accelerate.yaml"
    data = yaml.safe_load(cfg.read_text())
    cfg.write_text(yaml.safe_dump(dict(data, use_cpu=True)))
    return tmp_path


def render_job(project: Path, tool_path: str, *flags: str, script: list[str]) -> Path:
    """`zerofit launch --style slurm` into project/job; the partition line is the one edit."""
    argv = [
        "launch",
        "--style",
        "slurm",
        "--config",
        "cfg/accelerate.yaml",
        "--out",
        "job",
        "--python",
        sys.executable,
        "--ifname",
        "zfeth0",
        "--setup",
        f"export PATH={tool_path}",
        "--timeout",
        "120",
        *flags,
        "--",
        *script,
    ]
    assert main(argv) == 0
    job = project / "job" / "job.sbatch"
    text = job.read_text()
    assert "##SBATCH --partition=gpu" in text
    job.write_text(text.replace("##SBATCH --partition=gpu", "#SBATCH --partition=zf"))
    return job


def submit(cluster, job: Path, project: Path) -> str:
    """sbatch from another directory, with a PATH that lacks the launchers (--setup adds them)."""
    elsewhere = project / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = dict(
        os.environ, PATH="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", PYTHONWARNINGS="ignore"
    )
    return cluster.sbatch(job, env, cwd=elsewhere)


def job_output(project: Path, job_id: str) -> str:
    out = project / f"zerofit-{job_id}.out"
    return out.read_text(errors="replace") if out.exists() else ""


def node_logs(project: Path, job_id: str) -> list[str]:
    return [
        (
            (project / "logs" / f"zerofit-{job_id}-node{n}.log").read_text(errors="replace")
            if (project / "logs" / f"zerofit-{job_id}-node{n}.log").exists()
            else ""
        )
        for n in (0, 1)
    ]


def explain(project: Path, job_id: str, cluster=None) -> str:
    logs = node_logs(project, job_id)
    text = (
        f"job output:\n{job_output(project, job_id)[-3000:]}\nnode0:\n{logs[0][-2000:]}\n"
        f"node1:\n{logs[1][-2000:]}"
    )
    if cluster is not None:
        ctld = (cluster.root / "slurmctld.log").read_text(errors="replace").splitlines()
        text += (
            "\nslurmctld:\n" + "\n".join(line for line in ctld if f"JobId={job_id}" in line)[-3000:]
        )
    return text


def wait_requeued(cluster, job_id: str, limit: float, minutes: int | None = None) -> None:
    """Wait until the job requeued itself. ``minutes``: give its next start a longer time limit (as
    the next allocation might have), so a one-minute test limit does not signal it again at once."""
    wait_until(
        f"job {job_id} requeued",
        lambda: (j := cluster.job(job_id)).get("JobState") == "PENDING"
        and j.get("Restarts", "0") != "0",
        limit,
        every=0.5,
    )
    if minutes:
        res = cluster.client("scontrol", "update", f"jobid={job_id}", f"TimeLimit={minutes}")
        assert res.returncode == 0, res.stderr


def test_grpo_trains_on_two_nodes_and_resumes_after_preemption(
    slurm_cluster, project, tool_path
) -> None:
    save_every, max_steps = 4, 60
    job = render_job(
        project,
        tool_path,
        "--requeue",
        "--signal-seconds",
        "60",
        "--time",
        "30",
        script=[
            str(GRPO),
            "--max-steps",
            str(max_steps),
            "--save-every",
            str(save_every),
            "--output-dir",
            "run",
        ],
    )
    text = job.read_text()
    assert f"#SBATCH --chdir={project}" in text and "#SBATCH --signal=B:USR1@60" in text
    started = time.monotonic()
    job_id = submit(slurm_cluster, job, project)
    try:
        slurm_cluster.wait_state(job_id, ("RUNNING",), 60)
        latest = project / "run" / "latest"
        wait_until(
            "the first checkpoint",
            lambda: latest.exists()
            or slurm_cluster.job(job_id).get("JobState") not in ("RUNNING", "PENDING"),
            JOB_LIMIT,
            every=0.1,
        )
        assert latest.exists(), explain(project, job_id)
        # what Slurm sends `--signal-seconds` before the time limit (or on preemption):
        # USR1 to the batch shell
        assert slurm_cluster.client("scancel", "--batch", "--signal=USR1", job_id).returncode == 0
        wait_requeued(slurm_cluster, job_id, 60)  # it starts again after cred_expire (5 s here)
        resumed_from = int(latest.read_text().strip().split("-")[1])
        steps_before = [
            json.loads(line)["step"]
            for line in (project / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        final = slurm_cluster.wait_state(
            job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), JOB_LIMIT
        )
    finally:
        slurm_cluster.client("scancel", job_id)
    took = time.monotonic() - started
    out, logs = job_output(project, job_id), node_logs(project, job_id)
    lost = max(steps_before) - resumed_from
    print(
        f"slurm grpo: preempted at step {max(steps_before)}, resumed from "
        f"checkpoint-{resumed_from} "
        f"(lost {lost} step(s), save every {save_every}); job done in {took:.0f} s"
    )
    assert final["JobState"] == "COMPLETED", explain(project, job_id, slurm_cluster)
    assert final["Restarts"] == "1"
    # the doctor ran on both nodes before each start, and passed
    assert out.count("zerofit doctor --allocation: 2 node report(s)") == 2, out
    assert out.count("all nodes passed") == 2
    assert "time limit or preemption near (USR1): requeueing" in out
    assert "resuming (--resume-from latest)" in out
    assert "grpo: 2 process(es), ZeRO stage 2" in logs[0]
    assert 0 <= lost <= save_every
    steps = [
        json.loads(line)["step"]
        for line in (project / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, max_steps + 1))  # every step once: the lost ones were redone
    assert (project / "run" / "final").is_dir()


def test_time_limit_requeues_and_restarts_with_resume(slurm_cluster, project, tool_path) -> None:
    """A real time limit: Slurm sends USR1 `--signal-seconds` before it and the job requeues.

    The job starts with a 5-minute limit; once its first start has a checkpoint (the probe wrote
    `latest`), the limit is cut to one minute, so Slurm's own warning comes next (at most ~30 s
    later, its check period) and always after that checkpoint, whatever the machine's load.
    """
    job = render_job(
        project,
        tool_path,
        "--requeue",
        "--signal-seconds",
        "50",
        "--time",
        "5",
        "--no-doctor",
        script=[str(PROBE), "--output-dir", "probe"],
    )
    job_id = submit(slurm_cluster, job, project)
    try:
        wait_until(
            "the first start's checkpoint",
            lambda: (project / "probe" / "latest").exists()
            or slurm_cluster.job(job_id).get("JobState") not in ("RUNNING", "PENDING"),
            JOB_LIMIT,
            every=0.2,
        )
        assert (project / "probe" / "latest").exists(), explain(project, job_id, slurm_cluster)
        cut = time.monotonic()
        res = slurm_cluster.client("scontrol", "update", f"jobid={job_id}", "TimeLimit=1")
        assert res.returncode == 0, res.stderr
        wait_requeued(slurm_cluster, job_id, JOB_LIMIT, minutes=5)  # by Slurm's own signal
        signalled = time.monotonic() - cut
        final = slurm_cluster.wait_state(
            job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), JOB_LIMIT
        )
    finally:
        slurm_cluster.client("scancel", job_id)
    starts = [
        json.loads(line) for line in (project / "probe" / "starts.jsonl").read_text().splitlines()
    ]
    print(f"slurm time limit: requeued by Slurm's signal {signalled:.0f} s after the 1-min limit")
    assert final["JobState"] == "COMPLETED", explain(project, job_id, slurm_cluster)
    assert [s["argv"][-2:] for s in starts] == [
        ["--output-dir", "probe"],
        ["--resume-from", "latest"],
    ]
    assert [s["restart"] for s in starts] == [None, "1"]  # Slurm sets it from the first restart on
    assert "time limit or preemption near (USR1)" in job_output(project, job_id)


def test_a_dying_node_fails_the_job_and_names_it(slurm_cluster, project, tool_path) -> None:
    job = render_job(
        project,
        tool_path,
        "--no-doctor",
        script=[str(TRAIN), "--steps", "400", "--step-sleep", "0.5", "--timeout", "30"],
    )
    job_id = submit(slurm_cluster, job, project)
    try:
        wait_until(
            "node 1 mid-run",
            lambda: "step 1 loss" in node_logs(project, job_id)[1]
            or slurm_cluster.job(job_id).get("JobState") not in ("RUNNING", "PENDING"),
            JOB_LIMIT,
        )
        assert "step 1 loss" in node_logs(project, job_id)[1], explain(project, job_id)
        node1 = slurm_cluster.hosts.names[1]
        workers = [pid for pid in ns_pids(node1) if _is_rank_process(pid)]
        assert workers, "no training process found on node 1"
        kill_pids(workers, signal.SIGKILL)  # the rank dies as on a crashed GPU / OOM-killed process
        killed = time.monotonic()
        final = slurm_cluster.wait_state(
            job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 90
        )
        took = time.monotonic() - killed
    finally:
        slurm_cluster.client("scancel", job_id)
    out = job_output(project, job_id)
    print(f"slurm fault: job ended {final['JobState']} {took:.1f} s after node 1's rank was killed")
    assert final["JobState"] == "FAILED", explain(project, job_id)
    assert "zerofit: node zfn1 (rank 1) failed" in out, explain(project, job_id)
    assert "step 399" not in node_logs(project, job_id)[0]


def _is_rank_process(pid: int) -> bool:
    """A training rank (not its launcher): runs multinode_train.py and has LOCAL_RANK set."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        any(w.endswith(b"multinode_train.py") for w in cmdline)
        and b"accelerate" not in b" ".join(cmdline)
        and any(e.startswith(b"LOCAL_RANK=") for e in environ)
    )
