"""The CUDA allocation trace of a LoRA training run: every storage the GPU would hold, in order.

For each LoRA case measured in tests/data/gpu_lora_memory_h200.jsonl (the ``plain`` stack) and
the ``autocast`` rows of tests/data/gpu_lora_memory_h100_stacks.jsonl, the run of
benchmarks/gpu_lora_memory.py (the saved bf16 model loaded, peft's all-linear adapters, three
training steps of its ``build_step``) is replayed on fake tensors
with src/zerofit/memory/allocation_trace.py's recorder and GPU emulation (its module docstring
lists what the GPU run does differently and how it is emulated), so Qwen2.5-0.5B's real shape at
2 x 2048 tokens records in seconds on a CPU. That module's ``replay_training_run`` is the same
recording for any model config and stage-0 setup; this benchmark keeps the measured cases'
own steps (gpu_lora_memory.py ``build_step``) and replays them as the measured rows ran: the
peaks of steps 2-3, and the cases of one stack one after the other in one process. Qwen2's
biased q/k/v projections take cuBLASLt's workspace at their first ``addmm``, so both handles'
cuBLAS and cuBLASLt pairs are the 69,206,016 B the measured rows hold beside their tensors.

Run:  python benchmarks/allocation_trace.py --out /tmp/alloc_traces/traces.jsonl [--cases 0,3]
      python benchmarks/allocation_trace.py --tiny --out traces.jsonl   (a 2-layer model)
Each line: the case, ``events``, ``step_starts`` (the event index where each training step
begins), ``teardown_start`` (from there: the case's release, every storage but cuBLAS's freed,
then ``empty_cache``, as gpu_lora_memory.py's ``release`` does before its next case),
``workspace_keys`` (cuBLAS's: key -> "thread/library"), ``warmup_key`` (the loading's warm-up),
``allocated_peak`` (the live bytes' peak over steps 2-3, each storage rounded up to 512 B,
cuBLAS's workspaces included: a lower bound of ``max_memory_allocated``, which counts a block
the allocator did not split whole), ``record_seconds``, the measured row's peaks
(``measured``) where one matches, and with src/zerofit/memory/allocator.py present its
replays' (``simulate``): ``sim``, the case alone, and ``sim_in_process``, after the earlier
cases of its stack in one process, as the measured rows ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import gpu_lora_memory
import model_shapes

from zerofit.memory.allocation_trace import (
    DEVICE,
    AllocationRecorder,
    Event,
    gpu_emulation,
    live_bytes_peak,
    load_in_checkpoint_order,
    warm_up_allocator,
    warmup_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
PLAIN_RESULTS = ROOT / "tests" / "data" / "gpu_lora_memory_h200.jsonl"
STACK_RESULTS = ROOT / "tests" / "data" / "gpu_lora_memory_h100_stacks.jsonl"
STEPS = 3


def build_base_model(shape: dict):
    """The random-init Qwen2 of ``shape`` that gpu_lora_memory.py saves, in bf16, on fake
    tensors (enter a FakeTensorMode first); ``load_in_checkpoint_order`` then makes the
    storages the GPU run loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def add_adapters(model, case: dict):
    """peft's adapters and checkpointing as gpu_lora_memory.py ``load_peft_model`` adds them to
    a bf16 base (LoRA)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=gpu_lora_memory.RANK, target_modules="all-linear", lora_dropout=gpu_lora_memory.DROPOUT
    )
    model = get_peft_model(model.train(), config)
    if case["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model


def case_stack(case: dict) -> dict:
    """``case`` as gpu_lora_memory.py ``build_step`` reads it on the trace's device: the plain
    stack keeps its bf16 weights (its CPU dry run would use fp32)."""
    stack = case.get("stack", "plain")
    if stack not in ("plain", "autocast"):
        raise ValueError(f"stack: {stack!r} is not traced (fix: plain or autocast)")
    if case["finetuning"] != "lora":
        raise ValueError(f"finetuning: {case['finetuning']!r} is not traced (fix: lora)")
    return dict(case, stack=stack)


def record_run(case: dict, shape: dict, workspaces: bool = True) -> dict:
    """The events of ``case``'s run (load, adapters, ``STEPS`` training steps, release), the
    event index where each step starts and where the release starts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = case_stack(case)
    recorder = AllocationRecorder(workspaces)
    step_starts = []
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode, gpu_emulation(fake_mode, recorder):
        model = build_base_model(shape)
        with recorder.recording():
            warm_up_allocator(model)
            warmup_key = recorder.events[-1][1]
            load_in_checkpoint_order(model)
            model = add_adapters(model, case)
            step, _trainable, _engine = gpu_lora_memory.build_step(model, case, shape, DEVICE)
            for _ in range(STEPS):
                step_starts.append(len(recorder.events))
                step()
            teardown_start = len(recorder.events)
            del model, step
            gc.collect()
    for key in recorder.live_keys():  # what a reference outside the run still holds
        if key not in recorder.workspace_keys:
            recorder.free(key)
    recorder.events.append(("empty_cache", 0, 0))
    return {
        "events": recorder.events,
        "step_starts": step_starts,
        "teardown_start": teardown_start,
        "workspace_keys": recorder.workspace_keys,
        "warmup_key": warmup_key,
    }


def record_case(case: dict, shape: dict) -> list[Event]:
    """The allocator events of ``case`` (a gpu_lora_memory.py case of the plain or autocast
    stack, LoRA) at ``shape``: loading, adapters, three training steps and the release."""
    return record_run(case, shape)["events"]


def traced_cases(tiny: bool) -> list[dict]:
    """The LoRA cases of gpu_lora_memory.py's plain stack, then of its autocast stack."""
    cases = []
    for stack in ("plain", "autocast"):
        for case in gpu_lora_memory.build_cases(tiny, stack):
            if case["finetuning"] == "lora":
                cases.append(case_stack(case))
    return cases


def measured_row(case: dict) -> dict | None:
    """The GPU row measured for ``case`` (tests/data), or None."""
    path = PLAIN_RESULTS if case["stack"] == "plain" else STACK_RESULTS
    for line in path.read_text().splitlines():
        row = json.loads(line)
        fields = ("finetuning", "checkpointing", "seq")
        same = all(row.get(field) == case[field] for field in fields)
        if same and row.get("stack", "plain") == case["stack"]:
            return row
    return None


def allocator_class():
    """src/zerofit/memory/allocator.py's ``CachingAllocator``, or None where it is absent."""
    try:
        from zerofit.memory.allocator import CachingAllocator
    except ImportError:
        return None
    return CachingAllocator


def replay_case(allocator, line: dict, key_offset: int = 0, skip: frozenset = frozenset()):
    """Apply one case's events to ``allocator`` as gpu_lora_memory.py measures it: the peaks
    reset after step 1 (``torch.cuda.reset_peak_memory_stats``) and read after step 3, then the
    release. ``key_offset`` keeps the keys of cases replayed in one process apart; ``skip``:
    keys whose alloc the process already made (cuBLAS's workspaces, taken once per handle).
    The warm-up before loading (``warmup_key``) takes what ``warmup_bytes`` allows. Returns
    what was held at the case's start and the peaks of its steps 2-3."""
    start = {"start_allocated": allocator.allocated, "start_reserved": allocator.reserved}
    events, step_2 = line["events"], line["step_starts"][1]
    peaks = {}
    for index, (kind, key, nbytes) in enumerate(events):
        if index == step_2:
            allocator.reset_peaks()
        if index == line["teardown_start"]:
            peaks = {
                "max_allocated": allocator.max_allocated,
                "max_reserved": allocator.max_reserved,
            }
        if kind != "empty_cache" and key in skip:
            continue
        if kind == "alloc" and key == line["warmup_key"]:
            nbytes = warmup_bytes(allocator, nbytes)
            if not nbytes:
                skip = skip | {key}
                continue
        allocator.apply((kind, key + key_offset if kind != "empty_cache" else key, nbytes))
    return {**start, **peaks}


def simulate(lines: list[dict]) -> None:
    """Add the simulator's peaks to each line: ``sim``, the case alone in a fresh process;
    ``sim_in_process``, the cases of one stack replayed one after the other in one process, in
    the order given, as gpu_lora_memory.py runs them (each later case starts from what the
    earlier ones left cached after ``empty_cache``, and takes no cuBLAS workspace its thread
    already holds). Nothing where src/zerofit/memory/allocator.py is absent."""
    allocator_type = allocator_class()
    if allocator_type is None:
        return
    process: dict[str, tuple] = {}  # stack -> (allocator, next key offset, workspaces held)
    for line in lines:
        line["sim"] = replay_case(allocator_type(), line)
        stack = line["case"]["stack"]
        allocator, offset, held = process.get(stack, (allocator_type(), 0, set()))
        workspaces = {int(key): name for key, name in line["workspace_keys"].items()}
        skip = frozenset(key for key, name in workspaces.items() if name in held)
        line["sim_in_process"] = replay_case(allocator, line, offset, skip)
        held = held | set(workspaces.values())
        process[stack] = (allocator, offset + len(line["events"]), held)


def trace_line(case: dict, shape: dict) -> dict:
    """One output line: the case's events, its step boundaries, its allocated peak over steps
    2-3, how long it took to record, and the measured row's peaks."""
    began = time.perf_counter()
    run = record_run(case, shape)
    line = dict(case=case, **run, record_seconds=round(time.perf_counter() - began, 1))
    line["allocated_peak"] = live_bytes_peak(
        run["events"], run["step_starts"][1], run["teardown_start"]
    )
    row = measured_row(case) if shape is not model_shapes.TINY else None
    if row is not None:
        fields = ("max_allocated", "max_reserved", "start_allocated", "start_reserved", "gpu")
        line["measured"] = {field: row[field] for field in fields if field in row}
    return line


def mib(nbytes: int | None) -> str:
    """``nbytes`` in MiB for the console, or a dash."""
    return "-" if nbytes is None else f"{nbytes / 2**20:.0f}"


def relative(value: int | None, measured: int | None) -> str:
    """``value`` against ``measured`` in percent, or a dash."""
    if value is None or not measured:
        return "-"
    return f"{value / measured - 1:+.2%}"


SUMMARY_HEADER = (
    "stack    ckpt  seq   events  rec_s | alloc: trace measured err | reserved: sim_alone "
    "sim_in_process measured err_alone err_in_process | start_reserved: sim measured (MiB)"
)


def summary(line: dict) -> str:
    """One console line per case: the trace's allocated peak and the simulator's reserved
    peaks beside the measured row's."""
    case, measured = line["case"], line.get("measured", {})
    alone, in_process = line.get("sim", {}), line.get("sim_in_process", {})
    columns = [
        f"{case['stack']:8} {case['checkpointing']!s:5} {case['seq']:5} {len(line['events']):7}",
        f"{line['record_seconds']:6.1f} |",
        mib(line["allocated_peak"]),
        mib(measured.get("max_allocated")),
        relative(line["allocated_peak"], measured.get("max_allocated")) + " |",
        mib(alone.get("max_reserved")),
        mib(in_process.get("max_reserved")),
        mib(measured.get("max_reserved")),
        relative(alone.get("max_reserved"), measured.get("max_reserved")),
        relative(in_process.get("max_reserved"), measured.get("max_reserved")) + " |",
        mib(in_process.get("start_reserved")),
        mib(measured.get("start_reserved")),
    ]
    return " ".join(columns)


def write_lines(path: Path, lines: list[dict]) -> None:
    """All lines so far, written whole (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(line) + "\n" for line in lines))
    partial.replace(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON lines file to write")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (a quick check)")
    parser.add_argument(
        "--cases",
        help="only these cases, a comma list of 0-based positions (0-3: plain, 4-7: autocast)",
    )
    args = parser.parse_args(argv)
    count = len(traced_cases(args.tiny))
    try:
        args.cases = None if args.cases is None else [int(i) for i in args.cases.split(",")]
    except ValueError:
        parser.error(f"--cases: {args.cases!r} is not a comma list of numbers (fix: --cases 0,4)")
    if args.cases is not None and not all(0 <= index < count for index in args.cases):
        parser.error(f"--cases: {args.cases} (fix: positions from 0 to {count - 1})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shape = model_shapes.TINY if args.tiny else gpu_lora_memory.QWEN25_05B
    cases = traced_cases(args.tiny)
    chosen = cases if args.cases is None else [cases[index] for index in args.cases]
    lines = []
    for case in chosen:
        lines.append(trace_line(case, shape))
        write_lines(args.out, lines)
    simulate(lines)
    write_lines(args.out, lines)
    print(SUMMARY_HEADER)
    for line in lines:
        print(summary(line))


if __name__ == "__main__":
    sys.exit(main())
