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

``--zero3-one-gpu`` runs the Qwen README's single-A100 ZeRO-3 full fine-tune
(tests/data/step_times_public.jsonl qwen1-1.8b-full-seq256 ... -seq8192: 2.1-2.3 s per step up
to 2048 tokens) on one GPU, and ZeRO-2 beside it: a random-init Qwen2 of Qwen-1.8B's shape
(``QWEN1_18B``, from a transformers config, nothing downloaded), bf16, micro batch 1,
accumulation 8, gradient checkpointing (reentrant, transformers' default under the Trainer),
SDPA attention, Qwen's finetune/ds_config_zero{2,3}.json with the Trainer's "auto" values
resolved (``qwen_finetune_config``) and DeepSpeed's AdamW on torch's kernels (no op to build),
through ``deepspeed.initialize``. One optimizer step warms up (ZeRO-3 records its trace), then
each timed step is synchronized at both ends; its host time (before the synchronize) is kept
too. Every case is one JSON line. ``--annotate FILE`` adds zerofit's prediction where zerofit
is importable: ``est_step_s`` and its error, and for ZeRO-3 the per-module-pass cost that the
measured ZeRO-3 - ZeRO-2 gap implies (``gap_s_per_module_pass``) and the one that makes
zerofit's own prediction equal the measurement (``fit_s_per_module_pass``), beside
speed/step_time.py's ``STAGE3_FETCH_S_PER_MODULE``. ``--dry-run`` runs the same loop on CPU
with a two-layer model (fp32, gloo), two micro steps, to show it runs end to end.

    GPU:      python3 benchmarks/deepspeed_hook_costs.py --zero3-one-gpu --out zero3.jsonl
    annotate: .venv/bin/python benchmarks/deepspeed_hook_costs.py --annotate zero3.jsonl
    CPU:      .venv/bin/python benchmarks/deepspeed_hook_costs.py --zero3-one-gpu --dry-run
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


# Qwen/Qwen-1_8B's config.json as a transformers Qwen2 config: Qwen-1's MLP is
# ``config.intermediate_size // 2`` wide (11008 // 2), its q/k/v one fused linear with a bias
# (here three with biases: the same weights and FLOPs, one more module per layer)
QWEN1_18B = dict(
    hidden_size=2048,
    intermediate_size=5504,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=151936,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)
ONE_GPU_STAGES = (2, 3)  # ZeRO-2 first: a ZeRO-3 engine's hooks must not outlive its case
ONE_GPU_SEQS = (256, 2048)
ONE_GPU_ACCUM = 8


def qwen_finetune_config(stage: int, hidden_size: int, grad_accum: int, bf16: bool) -> dict:
    """Qwen's finetune/ds_config_zero2.json / ds_config_zero3.json with what transformers'
    Trainer sets for their "auto" values (integrations/deepspeed.py
    ``HfTrainerDeepSpeedConfig.trainer_config_finalize``: reduce bucket hidden^2, stage-3
    prefetch bucket 0.9 hidden^2, persistence threshold 10 hidden; clipping 1.0, micro batch 1),
    and DeepSpeed's AdamW on torch's kernels (``torch_adam``: nothing to compile)."""
    if stage == 2:
        zero = {
            "stage": 2,
            "allgather_partitions": True,
            "allgather_bucket_size": 200_000_000,
            "overlap_comm": True,
            "reduce_scatter": True,
            "reduce_bucket_size": 200_000_000,
            "contiguous_gradients": True,
        }
    else:
        zero = {
            "stage": 3,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": 1_000_000_000,
            "reduce_bucket_size": hidden_size * hidden_size,
            "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
            "stage3_param_persistence_threshold": 10 * hidden_size,
            "stage3_max_live_parameters": 1_000_000_000,
            "stage3_max_reuse_distance": 1_000_000_000,
        }
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}},
        "zero_optimization": zero,
    }
    if bf16:
        config["bf16"] = {"enabled": True}
    return config


def one_gpu_cases(dry_run: bool) -> list[dict]:
    """The cases of ``--zero3-one-gpu``: ZeRO-2 and ZeRO-3 at each sequence length."""
    seqs = (16, 32) if dry_run else ONE_GPU_SEQS
    accum = 2 if dry_run else ONE_GPU_ACCUM
    return [
        {"stage": stage, "seq_len": seq, "micro_batch": 1, "grad_accum": accum}
        for stage in ONE_GPU_STAGES
        for seq in seqs
    ]


def time_one_gpu_case(case: dict, shape: dict, device: str, steps: int) -> dict:
    """``case`` timed on ``device``: the seconds of each optimizer step after one warm-up step
    (``step_s``), its host seconds before the closing synchronize (``host_s``), the peak."""
    import deepspeed
    import torch
    import transformers

    cuda = device == "cuda"
    config = transformers.Qwen2Config(**shape, attn_implementation="sdpa", use_cache=False)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16 if cuda else torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    ds_config = qwen_finetune_config(case["stage"], shape["hidden_size"], case["grad_accum"], cuda)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config
    )
    ids = torch.randint(0, shape["vocab_size"], (case["micro_batch"], case["seq_len"]))
    ids = ids.to(device)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    step_s, host_s = [], []
    for _ in range(steps + 1):  # the first warms up
        synchronize()
        start = time.perf_counter()
        for _ in range(case["grad_accum"]):
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()  # steps the optimizer only at the accumulation boundary
        host_s.append(time.perf_counter() - start)
        synchronize()
        step_s.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    engine.destroy()
    return {"step_s": step_s[1:], "host_s": host_s[1:], "peak_alloc_gib": peak}


def run_zero3_one_gpu(dry_run: bool, steps: int, out: Path | None) -> int:
    """Every ``one_gpu_cases`` case, one JSON line each (also appended to ``out``)."""
    import gc

    import deepspeed
    import torch
    import transformers

    device = "cpu" if dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("--zero3-one-gpu: no CUDA GPU visible (fix: add --dry-run for the CPU check)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model_shapes import TINY

    shape = dict(TINY, tie_word_embeddings=False) if dry_run else QWEN1_18B
    init_single_rank("gloo" if dry_run else "nccl")
    versions = {
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__,
    }
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    for case in one_gpu_cases(dry_run):
        row = {**case, "device": device, "gpu": gpu, "shape": shape, "dry_run": dry_run}
        row["checkpointing"], row["attention"] = "reentrant", "sdpa"
        try:
            row.update(time_one_gpu_case(case, shape, device, 1 if dry_run else steps))
            row["step_s_median"] = statistics.median(row["step_s"])
        except Exception as error:  # one failing case must not lose the others' numbers
            row["error"] = f"{type(error).__name__}: {error}"[:300]
        row.update(versions)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        line = json.dumps(row)
        print(line, flush=True)
        if out is not None:
            with out.open("a") as handle:
                handle.write(line + "\n")
    return 0


def one_gpu_setup(row: dict):
    """zerofit's ``TrainSetup`` of a ``--zero3-one-gpu`` row."""
    from zerofit.memory.estimate import TrainSetup

    return TrainSetup(
        stage=row["stage"],
        world_size=1,
        gpus_per_node=1,
        precision="bf16",
        gradient_checkpointing=True,
        micro_batch=row["micro_batch"],
        seq_len=row["seq_len"],
        grad_accum=row["grad_accum"],
        attention=row.get("attention", "sdpa"),
    )


def one_gpu_prediction(row: dict, fetch_s_per_module: float | None = None) -> float:
    """zerofit's seconds per optimizer step of ``row`` on its GPU (an H100 SXM for a CPU dry
    run), at ``fetch_s_per_module`` per ZeRO-3 module pass where given."""
    from zerofit.hardware import lookup, match_gpu_name
    from zerofit.models.resolve import spec_from_config
    from zerofit.speed.step_time import estimate_step_time, gpu_profile

    model = spec_from_config({"model_type": "qwen2", **row["shape"]}, "qwen1-1.8b-as-qwen2")
    gpu = lookup(match_gpu_name(row["gpu"]) if row["device"] == "cuda" else "H100-SXM")
    device = gpu_profile(gpu)
    if fetch_s_per_module is not None:
        device = dataclasses.replace(device, stage3_fetch_s_per_module=fetch_s_per_module)
    return estimate_step_time(one_gpu_setup(row), model, device).total_s


def fitted_fetch_cost(row: dict) -> float | None:
    """The per-module-pass cost at which zerofit's prediction equals the measured step
    (bisection; the prediction grows with it); None outside 0-5 ms."""
    low, high = 0.0, 0.005
    measured = row["step_s_median"]
    if not one_gpu_prediction(row, low) <= measured <= one_gpu_prediction(row, high):
        return None
    for _ in range(40):
        middle = (low + high) / 2
        if one_gpu_prediction(row, middle) < measured:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def annotate_one_gpu(row: dict, rows: list[dict]) -> dict:
    """``row`` with zerofit's prediction beside it; ZeRO-3 rows with the per-module-pass costs
    the measurement implies: from the gap to the ZeRO-2 row of the same sequence length over
    the micro steps' passes (three with checkpointing) and hooked modules, and fitted."""
    from zerofit.models.resolve import spec_from_config
    from zerofit.speed.step_time import STAGE3_FETCH_S_PER_MODULE, zero3_hooked_modules

    predicted = one_gpu_prediction(row)
    measured = row["step_s_median"]
    out = {**row, "est_step_s": round(predicted, 4)}
    out["err_step_s_pct"] = round(100 * (predicted - measured) / measured, 1)
    if row["stage"] != 3:
        return out
    model = spec_from_config({"model_type": "qwen2", **row["shape"]}, "qwen1-1.8b-as-qwen2")
    passes = 3 * row["grad_accum"] * zero3_hooked_modules(model)
    out["model_s_per_module_pass"] = STAGE3_FETCH_S_PER_MODULE
    zero2 = [
        other
        for other in rows
        if other["stage"] == 2 and other["seq_len"] == row["seq_len"] and "error" not in other
    ]
    if zero2:
        out["gap_s_per_module_pass"] = (measured - zero2[0]["step_s_median"]) / passes
    out["fit_s_per_module_pass"] = fitted_fetch_cost(row)
    return out


def annotate(path: Path) -> int:
    """Rewrite a ``--zero3-one-gpu`` results file with zerofit's predictions beside each row."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    added = ("est_", "err_", "model_", "gap_", "fit_")
    measured = [{k: v for k, v in row.items() if not k.startswith(added)} for row in rows]
    fresh = [row if "error" in row else annotate_one_gpu(row, measured) for row in measured]
    path.write_text("".join(json.dumps(row) + "\n" for row in fresh))
    for row in fresh:
        print(json.dumps(row))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three shapes, ZeRO-0 and 3 only")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--calibration-loop", action="store_true", help="time the calibration loop's phases"
    )
    parser.add_argument(
        "--zero3-one-gpu",
        action="store_true",
        help="time the Qwen README's one-GPU ZeRO-3 full fine-tune, ZeRO-2 beside it",
    )
    parser.add_argument("--steps", type=int, default=3, help="--zero3-one-gpu's timed steps")
    parser.add_argument("--dry-run", action="store_true", help="--zero3-one-gpu on CPU, tiny")
    parser.add_argument("--out", type=Path, help="--zero3-one-gpu: append the JSON lines here")
    parser.add_argument("--annotate", type=Path, help="add zerofit's predictions to a results file")
    args = parser.parse_args(argv)
    if args.annotate:
        return annotate(args.annotate)
    if args.zero3_one_gpu:
        return run_zero3_one_gpu(args.dry_run, args.steps, args.out)
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
