"""Median wall time of `zerofit --help` vs `accelerate config --help` (5 runs each, subprocess).

.venv/bin/python benchmarks/cli_startup.py      # prints JSON; target ratio <= 0.1
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNS = 5
BIN = Path(sys.executable).parent


def median_seconds(cmd: list[str], runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    zerofit = median_seconds([str(BIN / "zerofit"), "--help"])
    accelerate = median_seconds([str(BIN / "accelerate"), "config", "--help"])
    ratio = zerofit / accelerate
    print(
        json.dumps(
            {
                "runs": RUNS,
                "zerofit_help_s": round(zerofit, 3),
                "accelerate_config_help_s": round(accelerate, 3),
                "ratio": round(ratio, 3),
                "target_ratio": 0.1,
                "ok": ratio <= 0.1,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
