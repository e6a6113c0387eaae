"""What training processes really hold outside PyTorch's caching allocator, against zerofit's terms.

Data: tests/data/oom_messages_outside_allocator.jsonl, public CUDA OOM messages of LLM training
runs (PyTorch >= 2.1 wording: "this process has X GiB memory in use. Of the allocated memory Y
GiB is allocated by PyTorch, and Z GiB is reserved by PyTorch but unallocated"). Each record's
``non_pytorch_gib`` = X - Y - Z: the CUDA context, the kernel images loaded so far, NCCL's buffers
and library state, everything the allocator does not own.

zerofit counts that memory as two terms (memory/overheads.py): ``cuda_context_bytes`` (measured
on the calibration H100: 0.5 GiB before the model, 1.301 GiB after ZeRO-1/2 steps, 1.683 GiB after
ZeRO-3 steps) and ``nccl_buffer_bytes`` (by world size and node count), with the 1 GiB safety
margin on top. For every record whose engine is known this prints the measurement next to
zerofit's sum, then a summary per engine. Records whose world size is not stated get the NCCL
term of one GPU (none), so their zerofit column is a floor.

    PYTHONPATH=src python benchmarks/outside_allocator.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "oom_messages_outside_allocator.jsonl"
sys.path.insert(0, str(ROOT / "src"))  # the checkout's zerofit

GIB = 1024**3


def load_records(path: Path = DATA) -> list[dict]:
    """Every record of the JSONL file, in file order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def zerofit_outside_gib(record: dict, before_model_context: bool = False) -> float | None:
    """zerofit's CUDA context + NCCL buffers for the record's engine, stage and world size;
    None where the engine is unknown (FSDP counts as a torch run: zerofit models no FSDP state,
    and its process holds what a plain torch process holds). ``before_model_context``: the 0.5
    GiB context for every engine, what zerofit counted before the in-training measurement."""
    from zerofit.memory import overheads as oh

    engine = record["engine"]
    if engine == "unknown":
        return None
    world = record.get("world_size") or 1
    nodes = record.get("num_nodes") or 1
    per_node = max(1, world // nodes)
    deepspeed = engine == "deepspeed"
    # a DeepSpeed record without its stage gets the ZeRO-1/2 value, the smaller one
    stage = record.get("zero_stage") or 2
    context = oh.cuda_context_bytes(stage, deepspeed=deepspeed and not before_model_context)
    return (context + oh.nccl_buffer_bytes(world, per_node)) / GIB


def main() -> int:
    from zerofit.memory import overheads as oh

    records = load_records()
    margin = oh.DEFAULT_SAFETY_MARGIN_GIB
    print(f"{len(records)} OOM messages; GiB outside PyTorch's allocator, measured vs zerofit")
    print(f"{'id':40} {'engine':9} {'stage':5} {'world':5} {'measured':>8} {'zerofit':>8}")
    by_engine: dict[str, list[tuple[float, float, float]]] = {}
    for record in records:
        ours = zerofit_outside_gib(record)
        before = zerofit_outside_gib(record, before_model_context=True)
        stage = record.get("zero_stage")
        world = record.get("world_size")
        when = "" if record.get("during_training", True) else "  (before training)"
        shown = "-" if ours is None else f"{ours:8.3f}"
        print(
            f"{record['id']:40} {record['engine']:9} {stage or '-'!s:5} {world or '-'!s:5} "
            f"{record['non_pytorch_gib']:8.3f} {shown:>8}{when}"
        )
        if ours is not None and record.get("during_training", True):
            row = (record["non_pytorch_gib"], ours, before)
            by_engine.setdefault(record["engine"], []).append(row)
    print()
    print("per engine (in training): measured median, and how many exceed zerofit's term and")
    print(f"zerofit's term + the {margin:g} GiB safety margin; last column: the same count with")
    print("the before-model context (0.5 GiB) for every engine, as zerofit counted before")
    for engine, rows in sorted(by_engine.items()):
        measured = [m for m, _, _ in rows]
        above = sum(m > z for m, z, _ in rows)
        above_margin = sum(m > z + margin for m, z, _ in rows)
        above_margin_before = sum(m > b + margin for m, _, b in rows)
        print(
            f"  {engine:9} n={len(rows):2}  median {statistics.median(measured):.2f} "
            f"(min {min(measured):.2f}, max {max(measured):.2f})  above term: {above}  "
            f"above term + margin: {above_margin}  (before: {above_margin_before})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
