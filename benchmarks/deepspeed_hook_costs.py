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

``--calibration-loop`` times, instead, the H100 calibration runs' own loop
(tests/data/mem_h100_qwen2.5-0.5b.md: a client torch AdamW handed to ``deepspeed.initialize``
with tests/data/ds_calibration_h100.json, ``engine(ids, labels=ids)``, ``engine.backward``,
``engine.step``) phase by phase: each phase's host seconds (before a synchronize) and its
seconds to the GPU's end, per stage, with and without accumulation (the first and the boundary
micro step apart), beside a plain torch loop of the same model (clip_grad_norm_, AdamW). On CUDA
the model is Qwen2.5-0.5B's shape (benchmarks/model_shapes.py) in bf16, BERT-large beside it;
on CPU a tiny two-layer Qwen2 in fp32, which checks that the loop runs.
Two lent H100s (torch 2.11.0+cu130, DeepSpeed 0.19.8, transformers 5.17.0, one rank), medians
of 3-4 timed steps, seconds, forward / backward / step, the second machine's run of this code
first and an earlier run of the same loop on the first machine after it (every phase's host
time was within 13 ms of its synchronized time: the host, not the GPU, bounds these steps):

    Qwen2.5-0.5B, micro 2 x 1024   plain   0.024 / 0.038 / 0.013   0.054 / 0.073 / 0.016
                                   ZeRO-0  0.035 / 0.059 / 0.091   0.063 / 0.081 / 0.110
                                   ZeRO-1  0.037 / 0.105 / 0.081   0.057 / 0.123 / 0.070
                                   ZeRO-2  0.035 / 0.112 / 0.078   0.040 / 0.077 / 0.089
    same, accumulation 4: backward of the first and of the boundary micro step, then the step
                                   ZeRO-1  0.053, 0.095 / 0.073    0.058, 0.130 / 0.067
                                   ZeRO-2  0.099, 0.104 / 0.076    0.087, 0.094 / 0.074
                                   ZeRO-3  0.229, 0.209 / 0.045    0.235, 0.257 / 0.048
        (ZeRO-3's forward 0.141-0.144 and 0.169-0.175; the others' 0.030-0.048)
    Qwen2.5-0.5B, micro 4 x 2048   ZeRO-2  0.068 / 0.088 / 0.080   0.050 / 0.088 / 0.080
                                   ZeRO-3  0.218 / 0.194 / 0.048   0.232 / 0.269 / 0.055
        checkpointed               ZeRO-2  0.073 / 0.164 / 0.066   0.083 / 0.129 / 0.081
                                   ZeRO-3  0.197 / 0.353 / 0.049   0.292 / 0.449 / 0.051
    BERT-large, micro 4 x 512      plain   0.028 / 0.028 / 0.014   0.025 / 0.035 / 0.012
                                   ZeRO-2  0.035 / 0.083 / 0.089   0.027 / 0.073 / 0.077

Read: ZeRO-2's gradient hooks add 29-51 ms to a backward over ZeRO-1's before its boundary
(Qwen2.5-0.5B, 218 tensors) and 38-55 ms over a plain one (BERT-large, 391 tensors): 0.1-0.23
ms per tensor; ZeRO-1 does that bucket work in the boundary micro step's backward only (+42-72
ms there, nothing before it); ZeRO-3 adds 0.11-0.18 s to each of forward and backward for 318
hooked modules (0.33-0.57 ms per module pass), checkpointing a third pass; DeepSpeed's step
costs 0.045-0.11 s at one rank where torch's clip and AdamW take 0.012-0.016 s; the same loop's
host time differs by up to 2x from machine to machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CALIBRATION_CONFIG = Path(__file__).resolve().parents[1] / "tests/data/ds_calibration_h100.json"
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


def init_single_rank(backend: str = "gloo") -> None:
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
        os.environ.setdefault(key, value)
    for key in ("RANK", "LOCAL_RANK"):
        os.environ.setdefault(key, "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)


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


@dataclass(frozen=True)
class LoopCase:
    """One configuration of the calibration loop: ``stage`` None is the plain torch loop."""

    model: str  # "qwen2.5-0.5b", "bert-large" or "tiny"
    stage: int | None
    micro_batch: int
    seq_len: int
    grad_accum: int = 1
    checkpointing: bool = False


def build_loop_model(name: str, device: str):
    """A random-init model of ``name``'s shape on ``device`` (bf16 on CUDA, fp32 on CPU) and its
    vocabulary size."""
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model_shapes import QWEN25_05B

    if name == "bert-large":
        config = transformers.BertConfig(
            hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
            intermediate_size=4096, attn_implementation="sdpa",
        )
        model_class = transformers.BertForMaskedLM
    else:
        shape = dict(QWEN25_05B)
        if name == "tiny":
            shape.update(
                hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            )
        config = transformers.Qwen2Config(**shape, attn_implementation="sdpa", use_cache=False)
        model_class = transformers.Qwen2ForCausalLM
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = model_class(config).to(dtype)
    return model, config.vocab_size


def calibration_engine(case: LoopCase, model, optimizer, device: str):
    """``deepspeed.initialize`` as the calibration runs called it (their JSON, this case's stage,
    micro batch and accumulation); None for the plain loop."""
    if case.stage is None:
        return None
    import deepspeed

    config = json.loads(CALIBRATION_CONFIG.read_text())
    config.pop("_comment", None)
    config["train_micro_batch_size_per_gpu"] = case.micro_batch
    config["gradient_accumulation_steps"] = case.grad_accum
    config["zero_optimization"]["stage"] = case.stage
    if device != "cuda":
        config.pop("bf16", None)  # the CPU check runs fp32
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def time_calibration_loop(case: LoopCase, device: str, steps: int) -> dict:
    """Median seconds of each phase of ``case``'s micro steps after two warm-up steps: host
    seconds (``*_host``, before synchronizing) and seconds to the device's end."""
    import torch

    model, vocab = build_loop_model(case.model, device)
    if case.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    engine = calibration_engine(case, model, optimizer, device)
    ids = torch.randint(0, vocab, (case.micro_batch, case.seq_len), device=device)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def phases(boundary: bool) -> dict[str, float]:
        timed = {}
        synchronize()
        start = time.perf_counter()
        loss = (engine or model)(input_ids=ids, labels=ids).loss
        timed["forward_host"] = time.perf_counter() - start
        synchronize()
        timed["forward"] = time.perf_counter() - start
        start = time.perf_counter()
        if engine:
            engine.backward(loss)
        else:
            loss.backward()
        timed["backward_host"] = time.perf_counter() - start
        synchronize()
        timed["backward"] = time.perf_counter() - start
        start = time.perf_counter()
        if engine:
            engine.step()
        elif boundary:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        timed["step_host"] = time.perf_counter() - start
        synchronize()
        timed["step"] = time.perf_counter() - start
        return timed

    runs = [
        (micro, phases(micro == case.grad_accum - 1))
        for _ in range(steps + 2)
        for micro in range(case.grad_accum)
    ][2 * case.grad_accum :]
    result = {"case": dataclasses.asdict(case)}
    for name in runs[0][1]:
        result[name] = statistics.median(timed[name] for _, timed in runs)
        if case.grad_accum > 1:
            for label, micro in (("first", 0), ("boundary", case.grad_accum - 1)):
                values = [timed[name] for index, timed in runs if index == micro]
                result[f"{name}_{label}"] = statistics.median(values)
    if engine is not None:
        engine.destroy()
    return result


def calibration_cases(device: str) -> list[LoopCase]:
    """The cases of ``--calibration-loop``: on CUDA those the docstring's table reports; on CPU
    the tiny model at the plain loop, ZeRO-1 under accumulation and ZeRO-3."""
    if device != "cuda":
        return [
            LoopCase("tiny", None, 1, 64),
            LoopCase("tiny", 1, 1, 64, grad_accum=4),
            LoopCase("tiny", 3, 1, 64),
        ]
    qwen = [LoopCase("qwen2.5-0.5b", stage, 2, 1024) for stage in (None, 0, 1, 2)]
    qwen += [LoopCase("qwen2.5-0.5b", stage, 2, 1024, grad_accum=4) for stage in (1, 2, 3)]
    qwen += [
        LoopCase("qwen2.5-0.5b", stage, 4, 2048, checkpointing=checkpointing)
        for stage in (2, 3)
        for checkpointing in (False, True)
    ]
    return qwen + [LoopCase("bert-large", stage, 4, 512) for stage in (None, 2)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three shapes, ZeRO-0 and 3 only")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--calibration-loop", action="store_true", help="time the calibration loop's phases"
    )
    args = parser.parse_args(argv)
    if args.calibration_loop:
        return run_calibration_loop(args.repeats)
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


def run_calibration_loop(steps: int) -> int:
    """Every ``calibration_cases`` case, one JSON line each, on CUDA when there is one."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    init_single_rank("nccl" if device == "cuda" else "gloo")
    for case in calibration_cases(device):
        print(json.dumps(time_calibration_loop(case, device, steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
