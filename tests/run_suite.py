"""Run the whole test suite as `make test` does: the few tests that time the machine alone, then
two pytest processes at once.

Run: `.venv/bin/python tests/run_suite.py [extra pytest arguments]`   (`make test` runs it after
tests/warm_ops.py; plain `pytest` still runs every test, one after another).

Why two at once: the suite's time is its real process launches, and on a 2-core machine they
leave a core idle for about a third of their time (rendezvous, checkpoints written, daemons and
timers awaited). A full serial run measured with /proc/stat had 316 idle core-seconds in 600 s.
The in-process tests (thousands, mostly one core) fill that idle core when they run beside the
launches. Three groups, by marker (registered in pyproject.toml):

- ``exclusive``: tests that time the machine itself or compare timings (the 2-rank ZeRO probe's
  per-phase peaks, the shaped-network step times, the DeepSpeed hook costs, the doctor's
  bandwidth). They run first, alone, as they would in a serial run.
- ``distributed`` and not ``light``: launches that keep both cores busy (recipes, the
  compatibility matrix, multi-node jobs). One process.
- everything else: the in-process tests and the ``light`` launches, which keep less than about
  1.4 cores busy on average (the Slurm cluster waits on slurmctld's timers, the documents'
  commands on rendezvous and checkpoints). The other process; both streams take about as long.
- ``replay`` tests (fake-tensor recordings of whole training runs for the allocator replay) are
  in-process, but they join the launches' stream: without them the in-process stream ran 415 s
  beside 357 s of launches on a fresh clone.

The two streams run with one intra-op thread each (OMP_NUM_THREADS=1, as torchrun and accelerate
launch already give every rank). torch's default on this machine is one thread per core, and an
OpenMP team that shares its cores with another process waits at every barrier for a descheduled
thread: a whole-step memory probe took 21.7 s beside the launches instead of 1.1 s alone. What
the probes measure, the bytes each tensor holds, does not depend on the thread count.

Each stream writes its report to a file, printed whole when the stream ends; the exit status is
the first failing group's (pytest's own codes), else 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE = ["-q", "-p", "no:cacheprovider", "--durations=15"]


@dataclass(frozen=True)
class Group:
    """One pytest invocation: a name for the report and its marker expression."""

    name: str
    markers: str

    def command(self, extra: list[str]) -> list[str]:
        # `-m` on the command line replaces pyproject's `-m 'not gpu'`, so each says it again
        markers = f"({self.markers}) and not gpu"
        return [sys.executable, "-m", "pytest", *BASE, "-m", markers, *extra]


ALONE = Group("timing tests, alone", "exclusive")
TOGETHER = (
    Group("launches", "(distributed and not light or replay) and not exclusive"),
    Group(
        "in-process tests and light launches",
        "(not distributed or light) and not replay and not exclusive",
    ),
)


def run_alone(group: Group, extra: list[str]) -> int:
    """Run one group in the foreground, its report straight to this process's output."""
    started = time.monotonic()
    print(f"== {group.name}: pytest -m '{group.markers}'", flush=True)
    code = subprocess.call(group.command(extra), cwd=REPO)
    print(f"== {group.name}: exit {code} in {time.monotonic() - started:.0f} s", flush=True)
    return code


def run_together(groups: tuple[Group, ...], extra: list[str]) -> list[int]:
    """Start every group at once; print each report whole, in the order the groups end."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zerofit-tests-") as tmp:
        running = []
        for number, group in enumerate(groups):
            log = open(Path(tmp) / f"group{number}.log", "w+")
            print(f"== {group.name}: pytest -m '{group.markers}' (started)", flush=True)
            proc = subprocess.Popen(
                group.command(extra),
                cwd=REPO,
                env=dict(os.environ, OMP_NUM_THREADS="1"),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            running.append((group, proc, log))
        codes = {}
        while len(codes) < len(running):
            for group, proc, log in running:
                if group.name in codes or proc.poll() is None:
                    continue
                codes[group.name] = proc.returncode
                log.seek(0)
                print(f"\n== {group.name}: report", flush=True)
                sys.stdout.write(log.read())
                log.close()
                seconds = time.monotonic() - started
                print(f"== {group.name}: exit {proc.returncode} in {seconds:.0f} s", flush=True)
            time.sleep(0.5)
    return [codes[group.name] for group in groups]


def main(extra: list[str]) -> int:
    codes = [run_alone(ALONE, extra), *run_together(TOGETHER, extra)]
    failed = [code for code in codes if code != 0]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
