"""Stand-in training script for the Slurm time-limit test: no training, only what resuming needs.

Each start appends its arguments to OUTPUT/starts.jsonl and writes OUTPUT/latest (a checkpoint
exists from then on, as after a recipe's first save). Started with `--resume-from`, it exits 0 at
once; otherwise it waits to be stopped by the time limit (at most --max-seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", required=True)
    p.add_argument("--resume-from")
    p.add_argument("--max-seconds", type=float, default=300)
    args = p.parse_args()
    if os.environ.get("RANK", "0") != "0":  # one record per start, from global rank 0
        return 0 if args.resume_from else _wait(args.max_seconds)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "starts.jsonl"), "a") as fh:
        fh.write(
            json.dumps({"argv": sys.argv[1:], "restart": os.environ.get("SLURM_RESTART_COUNT")})
            + "\n"
        )
    with open(os.path.join(args.output_dir, "latest"), "w") as fh:
        fh.write("checkpoint-0\n")
    print(f"resume_probe: started, resume_from={args.resume_from}", flush=True)
    return 0 if args.resume_from else _wait(args.max_seconds)


def _wait(limit: float) -> int:
    time.sleep(limit)
    return 1  # the time limit should have ended this start long before


if __name__ == "__main__":
    sys.exit(main())
