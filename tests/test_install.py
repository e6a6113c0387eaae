"""The Makefile's torch source: the CPU wheel index on machines without an NVIDIA driver.

`make -n` prints the install commands without running them, so these tests cost no download.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import REPO

CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def torch_install_line(path: str, *overrides: str) -> str:
    """The `pip install ... torch` line `make venv` would run with this PATH."""
    env = dict(os.environ, PATH=path)
    out = subprocess.run(
        ["make", "-n", "-B", "venv", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = [line for line in out.splitlines() if "pip install" in line and line.endswith(" torch")]
    assert len(lines) == 1, out
    return lines[0]


def test_cpu_machine_takes_torch_from_the_cpu_index():
    line = torch_install_line(os.environ["PATH"], "CPU_INDEX_UP=yes")
    assert CPU_INDEX in line and "-c constraints.txt" in line


def test_gpu_machine_keeps_pypi_cuda_build(tmp_path: Path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    line = torch_install_line(f"{tmp_path}:{os.environ['PATH']}", "CPU_INDEX_UP=yes")
    assert CPU_INDEX not in line


def test_unreachable_cpu_index_is_not_asked():
    line = torch_install_line(os.environ["PATH"], "CPU_INDEX_UP=")
    assert CPU_INDEX not in line
