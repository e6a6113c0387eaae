"""DeepSpeed's host cost per trainable tensor and per module, measured on real engines on CPU.

speed/step_time.py charges a micro step ``GRAD_HOOK_S_PER_TENSOR`` per trainable tensor (the
gradient hook ZeRO-2/3 registers: runtime/zero/stage_1_and_2.py
``DeepSpeedZeroOptimizer.create_reduce_and_remove_grad_hooks`` ->
``reduce_ready_partitions_and_remove_grads``; stage3.py ``create_reduce_and_remove_grad_hooks``)
and ``STAGE3_FETCH_S_PER_MODULE`` per module fetch and release at ZeRO-3
(runtime/zero/parameter_offload.py ``DeepSpeedZeRoOffload._register_deepspeed_module``:
``_pre_forward_module_hook`` / ``_post_forward_module_hook`` and the backward pair ->
partitioned_param_coordinator.py ``fetch_sub_module`` / ``release_sub_module``). This runs
``deepspeed.initialize`` (one process, gloo, fp32 on CPU, a client SGD) at stages 0-3 on models
whose compute is negligible: ``depth`` blocks, each ``width`` tiny bias-free Linear layers (one
trainable tensor each) and ``empty`` parameterless modules (ReLU), so trainable tensors
(depth x width) and modules (depth x (width + empty + 1) + 1) vary apart. It times forward plus
backward (the optimizer step runs untimed after each) and solves, per stage, by least squares
over every shape,

    seconds per micro step = base + per_tensor x tensors + per_module x modules

and prints the costs beside the H200-derived ones (0.77 ms, 0.17 ms).

Run: .venv/bin/python benchmarks/deepspeed_hook_costs.py [--quick]   (~1-2 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

H200_GRAD_HOOK_S = 0.00077
H200_FETCH_S = 0.00017
FEATURES = 8
# (depth, width, empty): tensors and modules varied apart
SHAPES = [
    (8, 8, 0),
    (8, 8, 24),
    (8, 16, 0),
    (16, 8, 0),
    (16, 8, 16),
    (16, 16, 8),
    (32, 8, 0),
    (32, 4, 24),
    (32, 16, 0),
]
QUICK_SHAPES = [(4, 4, 0), (4, 4, 12), (8, 4, 0)]


def build_model(depth: int, width: int, empty: int):
    """``depth`` blocks of ``width`` Linear layers summed and ``empty`` ReLUs after them."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linears = torch.nn.ModuleList(
                torch.nn.Linear(FEATURES, FEATURES, bias=False) for _ in range(width)
            )
            self.empties = torch.nn.ModuleList(torch.nn.ReLU() for _ in range(empty))

        def forward(self, x):
            out = sum(linear(x) for linear in self.linears)
            for module in self.empties:
                out = module(out)
            return out

    return torch.nn.Sequential(*(Block() for _ in range(depth)))


def counts(depth: int, width: int, empty: int) -> tuple[int, int]:
    """(trainable tensors, modules ZeRO-3 hooks: the blocks, their lists, their children and the
    root)."""
    lists = 1 + (1 if empty else 0)
    return depth * width, depth * (1 + lists + width + empty) + 1


def time_micro_steps(stage: int, shape: tuple[int, int, int], repeats: int) -> tuple[float, float]:
    """(forward plus backward, the optimizer step) seconds of a fresh engine at ``stage``: the
    fastest of ``repeats`` after two warm-up steps (the least disturbed by other work on a
    shared host)."""
    import deepspeed
    import torch

    model = build_model(*shape)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    batch = torch.randn(1, FEATURES)
    micro, step = [], []
    for _ in range(repeats + 2):  # two warm-up steps
        start = time.perf_counter()
        engine.backward(engine(batch).sum())
        middle = time.perf_counter()
        engine.step()
        micro.append(middle - start)
        step.append(time.perf_counter() - middle)
    engine.destroy()
    return min(micro[2:]), min(step[2:])


def least_squares(rows: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """(base, per_tensor, per_module) of seconds = base + a x tensors + b x modules."""
    import numpy as np

    design = np.array([[1.0, tensors, modules] for tensors, modules, _ in rows])
    seconds = np.array([row[2] for row in rows])
    solution, *_ = np.linalg.lstsq(design, seconds, rcond=None)
    return tuple(float(value) for value in solution)


def init_single_rank() -> None:
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
        os.environ.setdefault(key, value)
    for key in ("RANK", "LOCAL_RANK"):
        os.environ.setdefault(key, "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")


def measure(stages, shapes, repeats: int) -> dict[int, dict]:
    """Per stage: the timed rows (tensors, modules, seconds) of the micro step and of the
    optimizer step, and each one's fitted costs."""
    init_single_rank()
    results = {}
    for stage in stages:
        micro_rows, step_rows = [], []
        for shape in shapes:
            tensors, modules = counts(*shape)
            micro_s, step_s = time_micro_steps(stage, shape, repeats)
            micro_rows.append((tensors, modules, micro_s))
            step_rows.append((tensors, modules, step_s))
        base, per_tensor, per_module = least_squares(micro_rows)
        step_base, step_per_tensor, step_per_module = least_squares(step_rows)
        results[stage] = {
            "rows": micro_rows,
            "base_s": base,
            "per_tensor_s": per_tensor,
            "per_module_s": per_module,
            "step_rows": step_rows,
            "step_base_s": step_base,
            "step_per_tensor_s": step_per_tensor,
            "step_per_module_s": step_per_module,
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three shapes, ZeRO-0 and 3 only")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    stages = (0, 3) if args.quick else (0, 1, 2, 3)
    results = measure(stages, QUICK_SHAPES if args.quick else SHAPES, args.repeats)
    plain = results[0]
    for stage, fit in results.items():
        tensor_added = fit["per_tensor_s"] - plain["per_tensor_s"]
        module_added = fit["per_module_s"] - plain["per_module_s"]
        print(
            f"ZeRO-{stage}: base {fit['base_s'] * 1e3:6.2f} ms, per tensor "
            f"{fit['per_tensor_s'] * 1e6:7.1f} us (+{tensor_added * 1e6:6.1f} over ZeRO-0), "
            f"per module {fit['per_module_s'] * 1e6:7.1f} us (+{module_added * 1e6:6.1f}); "
            f"optimizer step per tensor {fit['step_per_tensor_s'] * 1e6:7.1f} us"
        )
    if 2 in results:
        added = results[2]["per_tensor_s"] - plain["per_tensor_s"]
        print(f"ZeRO-2 gradient hook / H200-derived: {added / H200_GRAD_HOOK_S:.2f}")
    added = results[3]["per_module_s"] - plain["per_module_s"]
    print(f"ZeRO-3 module fetch+release / H200-derived (2 passes): "
          f"{added / 2 / H200_FETCH_S:.2f}")
    print(json.dumps({str(stage): fit for stage, fit in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
