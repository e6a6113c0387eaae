"""Time from starting `zerofit wizard` in a pseudo-terminal to its first question on screen.

Run: .venv/bin/python benchmarks/wizard_first_prompt.py [--runs 5]
Target: median <= 0.5 s. Each run spawns the real console script in a fresh pty, waits
for the first question's text, then presses Ctrl-C (which must leave no file behind).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pexpect

FIRST_QUESTION = "Model"
TARGET_S = 0.5


def zerofit_executable() -> str:
    """The `zerofit` console script of the interpreter running this file."""
    exe = Path(sys.executable).with_name("zerofit")
    return str(exe) if exe.exists() else "zerofit"


def time_first_prompt(out_dir: str) -> float:
    """Seconds from spawn until FIRST_QUESTION is printed; asserts Ctrl-C writes nothing."""
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    start = time.perf_counter()
    child = pexpect.spawn(
        zerofit_executable(),
        ["wizard", "--out", out_dir],
        env=env,
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=30,
    )
    child.expect(FIRST_QUESTION)
    elapsed = time.perf_counter() - start
    child.sendcontrol("c")
    child.expect(pexpect.EOF)
    child.close()
    if os.listdir(out_dir) if os.path.isdir(out_dir) else False:
        raise SystemExit(f"Ctrl-C left files in {out_dir}: {os.listdir(out_dir)}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        time_first_prompt(os.path.join(tmp, "warm"))  # first run pays the cold .pyc / page cache
        for i in range(args.runs):
            times.append(time_first_prompt(os.path.join(tmp, f"run{i}")))
    median = statistics.median(times)
    print("runs (s): " + " ".join(f"{t:.3f}" for t in times))
    print(
        f"median time to first prompt: {median:.3f} s (target <= {TARGET_S} s): "
        f"{'OK' if median <= TARGET_S else 'SLOW'}"
    )
    return 0 if median <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
