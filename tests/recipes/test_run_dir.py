"""recipes/run_dir.py: one run per directory (the lock), fresh start or resume, checkpoints that
survive a cut-off save, metrics.jsonl, atomic writes. No training, except the last test: two real
recipe runs started together on one directory.

Run: .venv/bin/python -m pytest tests/recipes/test_run_dir.py -q   (~15 s; the last test ~1 min)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from recipe_runs import RECIPES, load_recipe, one_line_error

grpo = load_recipe("grpo")
run_dir = grpo.run_dir  # the instance grpo uses: its errors say "grpo.py: ..."


def args_for(out, *flags):
    return grpo.parse_args(["--output-dir", str(out), *flags])


def fake_checkpoint(out, step: int, payload: bytes = b"weights" * 100) -> str:
    """A checkpoint directory written the way save_checkpoint writes its manifest."""
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.bin").write_bytes(payload)
    state = {"step": step, "files": run_dir.list_files(str(path))}
    (path / "trainer_state.json").write_text(json.dumps(state))
    (out / "latest").write_text(path.name)
    return str(path)


# ----------------------------------------------------------------------------- one run at a time
def hold_lock(out) -> subprocess.Popen:
    """Another process holding the directory's lock, as a running recipe does."""
    code = (
        f"import sys, time; sys.path.insert(0, {str(RECIPES)!r}); import run_dir\n"
        f"run_dir.lock_output_dir({str(out)!r}); print('locked', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_run_is_refused_while_the_first_holds_the_directory(tmp_path, capsys):
    out = tmp_path / "run"
    holder = hold_lock(out)
    try:
        started = time.monotonic()
        err = one_line_error(capsys, lambda: run_dir.claim_output_dir(args_for(out)))
        assert err == (
            f"grpo.py: output_dir: another run, pid {holder.pid}, is using {out} "
            "(fix: wait for it to finish, or pick another --output-dir)"
        )
        # a live holder is refused at once: waiting let a short run finish inside the wait
        assert time.monotonic() - started < run_dir.LOCK_WAIT_S / 2
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the lock with the process: the directory (only .lock in it) is free
    assert run_dir.claim_output_dir(args_for(out)) == ""
    assert (out / ".lock").read_text().split()[0] == str(os.getpid())


def test_only_a_live_holder_on_this_host_counts_as_running():
    """A zombie (a killed run not yet reaped), a gone pid and another host's pid are waited
    for (up to LOCK_WAIT_S); a running process on this host is not."""
    host = socket.gethostname()
    assert run_dir.holder_is_running_here([str(os.getpid()), host])
    assert not run_dir.holder_is_running_here([str(os.getpid()), host + "-other"])
    assert not run_dir.holder_is_running_here([])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while not open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.05)
    assert not run_dir.holder_is_running_here([str(zombie.pid), host])
    zombie.wait()
    assert not run_dir.holder_is_running_here([str(zombie.pid), host])


def test_the_lock_file_does_not_make_a_directory_non_empty(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("")
    assert run_dir.decide_start(args_for(out)) == ""
    run_dir.start_fresh_directory(str(out))
    assert os.listdir(out) == [".lock"]  # never deleted: a new file would be a second lock


def test_only_the_main_rank_locks(tmp_path, monkeypatch):
    """Under a launch every rank decides where the run starts; only RANK 0 takes the lock."""
    out = tmp_path / "run"
    holder = hold_lock(out)
    try:
        monkeypatch.setenv("RANK", "1")
        assert run_dir.claim_output_dir(args_for(out)) == ""
    finally:
        holder.kill()
        holder.wait()


# ----------------------------------------------------------------------------- where a run starts
def test_non_empty_output_dir_is_refused(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    err = one_line_error(capsys, lambda: run_dir.decide_start(args_for(tmp_path)))
    assert err.startswith(f"grpo.py: output_dir: {tmp_path} is not empty")
    assert "--resume-from latest" in err and "--overwrite" in err
    assert run_dir.decide_start(args_for(tmp_path, "--overwrite", "true")) == ""


def test_overwrite_removes_only_recipe_artifacts(tmp_path):
    fake_checkpoint(tmp_path, 3)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / ".metrics.jsonl.k2j4_x.tmp").write_text("{}")  # left by a killed write_atomic
    (tmp_path / "notes.txt").write_text("mine")
    run_dir.start_fresh_directory(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_resume_auto_starts_fresh_or_resumes(tmp_path, capsys):
    assert run_dir.decide_start(args_for(tmp_path / "new", "--resume-from", "auto")) == ""
    path = fake_checkpoint(tmp_path, 4)
    assert run_dir.decide_start(args_for(tmp_path, "--resume-from", "auto")) == path
    assert run_dir.decide_start(args_for(tmp_path, "--resume-from", "latest")) == path
    err = one_line_error(
        capsys, lambda: run_dir.decide_start(args_for(tmp_path / "new", "--resume-from", "latest"))
    )
    assert err.startswith("grpo.py: resume_from: no complete checkpoint in")


def test_truncated_latest_falls_back_to_previous(tmp_path, capsys):
    older = fake_checkpoint(tmp_path, 3)
    newest = fake_checkpoint(tmp_path, 6)
    with open(os.path.join(newest, "model.bin"), "r+b") as f:
        f.truncate(100)  # a save cut off by the crash
    assert run_dir.decide_start(args_for(tmp_path, "--resume-from", "latest")) == older
    err = capsys.readouterr().err
    assert f"note: skipping {newest}: model.bin has 100 of 700 bytes" in err
    os.remove(os.path.join(older, "trainer_state.json"))  # no complete checkpoint left
    with pytest.raises(SystemExit):
        run_dir.decide_start(args_for(tmp_path, "--resume-from", "latest"))


def test_truncated_checkpoint_is_named(tmp_path):
    newest = fake_checkpoint(tmp_path, 6)
    with open(os.path.join(newest, "model.bin"), "r+b") as f:
        f.truncate(100)
    assert run_dir.checkpoint_problem(newest) == "model.bin has 100 of 700 bytes"
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text('{"step": 6, "fil')
    assert run_dir.checkpoint_problem(newest) == "trainer_state.json is unreadable"


class FakeRun:
    """The fields of common.Run that resume_or_start reads, with a stand-in accelerator."""

    project, unit, noun, per_step = "grpo", "prompts", "prompts", 4

    class accelerator:
        is_main_process = True


def test_resume_with_another_global_batch_is_refused(tmp_path, capsys):
    path = fake_checkpoint(tmp_path, 4)
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text(
        json.dumps({**state, "prompts_per_step": 8})
    )
    args = args_for(tmp_path, "--resume-from", "latest")
    err = one_line_error(capsys, lambda: run_dir.resume_or_start(args, FakeRun, path))
    assert err.startswith(
        "grpo.py: resume_from: the checkpoint used 8 prompts per step, this run 4 (fix: resume "
    )


def test_rotation_keeps_newest(tmp_path):
    for step in (2, 4, 6, 8):
        fake_checkpoint(tmp_path, step)
    run_dir.rotate_checkpoints(str(tmp_path), keep=2)
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("checkpoint")) == [
        "checkpoint-6",
        "checkpoint-8",
    ]


# ----------------------------------------------------------------------------- files
def test_torn_metrics_line_is_dropped(tmp_path):
    lines = [json.dumps({"step": s, "loss": 0.5}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "lo')
    run_dir.MetricsLog(FakeRun.accelerator, str(tmp_path), start_step=2)
    assert [r["step"] for r in run_dir.read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]


def test_write_atomic_leaves_no_temp(tmp_path):
    run_dir.write_atomic(str(tmp_path / "latest"), "checkpoint-2")
    assert os.listdir(tmp_path) == ["latest"]
    assert (tmp_path / "latest").read_text() == "checkpoint-2"


def test_concurrent_write_atomic_never_collides(tmp_path):
    """Two writers of one path: with one fixed temp name (`metrics.jsonl.tmp`) one writer's
    rename took the other's temp file away, and the other died with FileNotFoundError."""
    path = str(tmp_path / "metrics.jsonl")
    failures = []

    def write_many(writer: int) -> None:
        try:
            for number in range(60):
                run_dir.write_atomic(path, f"{writer} {number}\n")
        except Exception as e:  # collected: an exception in a thread would not fail the test
            failures.append(repr(e))

    threads = [threading.Thread(target=write_many, args=(w,)) for w in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert os.listdir(tmp_path) == ["metrics.jsonl"]
    assert (tmp_path / "metrics.jsonl").read_text().split()[1] == "59"


# ----------------------------------------------------------------------------- two real runs
@pytest.mark.distributed
@pytest.mark.light
def test_two_runs_started_together_on_one_directory(tmp_path):
    """`python recipes/sft.py --output-dir X` twice at once: both used to pass the "not empty"
    check and one died with a raw FileNotFoundError; now one trains and the other stops with
    one line naming the first."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(RECIPES / "sft.py"), "--output-dir", str(out)]
    cmd += ["--max-steps", "60", "--save-every", "20"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    runs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    results = [(run.pid, *run.communicate(timeout=600), run.returncode) for run in runs]
    codes = sorted(code for _, _, _, code in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err, _ in results]
    winner = next(pid for pid, _, _, code in results if code == 0)
    refused = next(err for _, _, err, code in results if code == 2)
    assert refused.strip() == (
        f"sft.py: output_dir: another run, pid {winner}, is using {out} "
        "(fix: wait for it to finish, or pick another --output-dir)"
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 61))
