"""Build (or load from cache) the DeepSpeed C++ ops the test suite uses, once, before pytest.

Run: `.venv/bin/python tests/warm_ops.py`  (`make test` does this first).

DeepSpeed JIT-compiles ops on first use into ~/.cache/torch_extensions (or $TORCH_EXTENSIONS_DIR):
the shared-memory comm op (every distributed CPU run, ~50 s cold) and cpu_adam (optimizer
offload, ~80 s cold). Paying that inside a timed test makes the engine tests flaky and slow, so
this warms both. Idempotent: when the cache is warm it only loads the .so files (a few seconds).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # silences DeepSpeed's accelerator-detection warning

# Ops, by the accelerator's builder class name; fused_adam is deliberately absent (zerofit's
# DeepSpeed JSON has no `optimizer` block, so DeepSpeed never asks for it).
OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")


def warm(names=OPS) -> dict[str, float]:
    """Load (building if needed) each op; return seconds spent per op."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    spent = {}
    for name in names:
        start = time.perf_counter()
        builder = acc.create_op_builder(name)
        if builder is None:
            print(f"warm_ops: {name} not available on {acc.device_name()}; skipped", flush=True)
            continue
        builder.load(verbose=False)
        spent[name] = round(time.perf_counter() - start, 1)
        print(f"warm_ops: {name} ready in {spent[name]} s", flush=True)
    return spent


if __name__ == "__main__":
    try:
        warm()
    except Exception as exc:  # a broken toolchain should not hide the real test results
        print(
            f"warm_ops: could not build ops ({exc}); engine tests will build them", file=sys.stderr
        )
