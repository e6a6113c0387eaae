"""Build (or load from cache) the DeepSpeed C++ ops the test suite uses, once, before pytest.

Run: `.venv/bin/python tests/warm_ops.py`  (`make test` does this first).

DeepSpeed JIT-compiles ops on first use into $TORCH_EXTENSIONS_DIR, which this script (like
`make test`, `make demo` and tests/conftest.py) points at the venv's own `.venv/torch_extensions`
when unset: torch's default, ~/.cache/torch_extensions, is shared by every clone and venv of the
machine, which then rebuild the ops for one another. The ops: the shared-memory comm op (every
distributed CPU run, ~50 s cold) and cpu_adam (optimizer offload, ~80 s cold). Paying that inside
a timed test makes the engine tests flaky and slow, so this warms both, after removing a stale
build lock (zerofit.demo.clear_stale_build_lock). Idempotent: when the cache is warm it only
loads the .so files (a few seconds).
"""

from __future__ import annotations

import os
import sys

from zerofit.demo import load_deepspeed_op, use_venv_extensions_dir

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # silences DeepSpeed's accelerator-detection warning

# Ops, by the accelerator's builder class name; fused_adam is deliberately absent (zerofit's
# DeepSpeed JSON has no `optimizer` block, so DeepSpeed never asks for it).
OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")


def say(line: str) -> None:
    print(f"warm_ops: {line}", flush=True)


def warm(names=OPS) -> dict[str, float]:
    """Load (building if needed) each op; return seconds spent per op."""
    spent = {}
    for name in names:
        seconds = load_deepspeed_op(name, say)
        if seconds is None:
            say(f"{name} not available on this accelerator; skipped")
            continue
        spent[name] = round(seconds, 1)
        say(f"{name} ready in {spent[name]} s")
    return spent


if __name__ == "__main__":
    say(f"DeepSpeed ops in {use_venv_extensions_dir() or 'torch default (~/.cache)'}")
    try:
        warm()
    except Exception as exc:  # a broken toolchain should not hide the real test results
        print(
            f"warm_ops: could not build ops ({exc}); engine tests will build them", file=sys.stderr
        )
