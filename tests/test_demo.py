"""zerofit.demo's handling of DeepSpeed's op builds: the venv's own extensions directory and the
build lock an interrupted build leaves behind (torch waits for it forever, without a word)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from zerofit import demo


def _lock(build_dir, minutes_old: float):
    build_dir.mkdir(parents=True, exist_ok=True)
    lock = build_dir / "lock"
    lock.touch()
    then = time.time() - minutes_old * 60
    os.utime(lock, (then, then))
    return lock


def test_an_old_lock_with_no_build_running_is_removed_and_named(tmp_path):
    lock = _lock(tmp_path / "cpu_adam", minutes_old=10)
    said = []
    assert demo.clear_stale_build_lock(lock.parent, said.append)
    assert not lock.exists()
    assert said == [f"removed {lock}: left by a build interrupted 10 min ago"]


def test_a_fresh_lock_is_kept_and_the_wait_is_said(tmp_path):
    lock = _lock(tmp_path / "cpu_adam", minutes_old=0.2)
    said = []
    assert not demo.clear_stale_build_lock(lock.parent, said.append)
    assert lock.exists()
    assert said and said[0].startswith(f"waiting for {lock}")


def test_an_old_lock_is_kept_while_a_process_works_in_the_build_directory(tmp_path):
    """ninja runs with the build directory as its working directory: that build is alive."""
    lock = _lock(tmp_path / "cpu_adam", minutes_old=10)
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    worker = subprocess.Popen(sleeper, cwd=lock.parent)
    try:
        assert demo.build_is_running(lock.parent)
        assert not demo.clear_stale_build_lock(lock.parent, lambda line: None)
        assert lock.exists()
    finally:
        worker.kill()
        worker.wait()
    assert not demo.build_is_running(lock.parent)


def test_every_op_directory_is_checked_in_both_layouts(tmp_path):
    """``$TORCH_EXTENSIONS_DIR/<op>/lock``, and torch's default ``<root>/py311_cpu/<op>/lock``."""
    flat = _lock(tmp_path / "deepspeed_shm_comm", minutes_old=10)
    nested = _lock(tmp_path / "py311_cpu" / "cpu_adam", minutes_old=10)
    assert demo.clear_stale_build_locks(tmp_path, lambda line: None) == 2
    assert not flat.exists() and not nested.exists()
    assert demo.clear_stale_build_locks(tmp_path / "absent", lambda line: None) == 0


def test_the_venv_directory_is_used_unless_one_is_set(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    chosen = demo.use_venv_extensions_dir()
    if sys.prefix != sys.base_prefix:
        assert chosen == os.path.join(sys.prefix, "torch_extensions")
    else:  # outside a venv torch's own default stays
        assert chosen is None
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/elsewhere")
    assert demo.use_venv_extensions_dir() == "/elsewhere"
