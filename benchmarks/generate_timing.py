"""What the generation benchmarks share: TRL GRPO's sampling kwargs, a wall-clock timer that
drains the GPU around the timed call, transformers' generate as TRL calls it, and the JSON-line
output (stdout and ``$OUT/<name>.jsonl``).

Used by benchmarks/hf_generate_decode.py and benchmarks/ds_generate_overhead.py, which import it
from their own folder (a script's folder is first on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import time

import torch

# TRL 1.16 GRPOTrainer's generation kwargs at GRPOConfig's defaults (no min_new_tokens)
TRL_SAMPLING = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, repetition_penalty=1.0)


def drain_gpu() -> None:
    """Wait for the GPU's queued work (nothing to wait for on a CPU run)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    """Wall seconds of ``fn()`` with the GPU drained before and after."""
    drain_gpu()
    start = time.perf_counter()
    fn()
    drain_gpu()
    return time.perf_counter() - start


def generate(module, ids, new: int) -> None:
    """``new`` tokens after ``ids`` with TRL's sampling, no end token (every row runs to
    ``new``, as a GRPO batch nearly always does)."""
    with torch.no_grad():
        module.generate(ids, max_new_tokens=new, pad_token_id=0, eos_token_id=None, **TRL_SAMPLING)


def generate_seconds(module, ids, new: int) -> float:
    """Wall seconds of ``generate``."""
    return timed(lambda: generate(module, ids, new))


class JsonLines:
    """Rows printed as JSON lines and written to ``$OUT/<name>.jsonl`` (``$OUT``: the device
    machine's result folder; the current folder without it). A context manager: the file is
    closed on leaving it."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(os.environ.get("OUT", "."), f"{name}.jsonl")
        self.file = None

    def __enter__(self) -> "JsonLines":
        self.file = open(self.path, "w")
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()

    def write(self, row: dict) -> None:
        print(json.dumps(row), flush=True)
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
