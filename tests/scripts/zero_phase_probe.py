"""Per-phase peak bytes of a real DeepSpeed ZeRO training step, measured on CPU, one JSON per rank.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/scripts/zero_phase_probe.py \\
        --runs 1 2 3 3:reuse=0 --log-bytes 65536 [--out DIR] [--profiler-check]

(run ``tests/warm_ops.py`` once first: it builds DeepSpeed's shm comm op.) Every rank builds a
random-init bf16 Qwen2ForCausalLM, hands it with a client ``torch.optim.AdamW(foreach=True)`` to
``deepspeed.initialize`` (bf16, gradient_clipping 1.0, overlap_comm and contiguous_gradients on,
explicit bucket sizes smaller than the model so that buckets and sub-groups really split), runs
``--steps`` training steps and records the peak bytes of every phase: ``init``
(``deepspeed.initialize``), ``forward`` (forward + loss), ``backward`` (``engine.backward``) and
``step`` (``engine.step``). The first step creates Adam's states, so a caller reads the last one.
The ``--runs`` (a ZeRO stage; ``STAGE:reuse=N`` sets ``stage3_max_reuse_distance``,
``STAGE:vocab=N`` that run's vocabulary) run one after the other in the same process group, each
with a fresh model, engine and tracker.

How bytes are counted: ``StorageTracker``, a ``TorchDispatchMode`` that sees the output of every
aten op (what DeepSpeed, transformers and torch.optim allocate, on any device) and follows each
storage until it is freed through a weak reference (with ``UntypedStorage.resize_`` patched, as
``torch/distributed/_tools/mem_tracker.py`` does; MemTracker itself is not used: the probe needs
each large storage's call site and a separate count of what collectives allocate, which it does
not record). Each storage counts its size rounded up to 512 bytes, the CUDA caching allocator's
granularity, so the sum is what ``torch.cuda.max_memory_allocated()`` would report for the same
tensors. Not seen: what a C++ kernel allocates and frees inside one op (the CPU bf16 matmul's
fp32 scratch, for one), which on a GPU is cuBLAS's workspace. Counted apart
(``peak_with_comm_internal``): storages made inside ``torch.distributed``'s collectives, i.e.
gloo's staging copies, which NCCL does not take from torch's allocator. The script checks the
tracker on known allocations first (``validation`` in the output) and refuses to measure when
that check fails; ``--profiler-check`` compares it with ``torch.profiler`` on one more step.

``--log-bytes N`` adds, per phase of the last step, every storage of at least N bytes alive at the
phase's peak, with its shape, dtype, the op that made it, the innermost frames in DeepSpeed (or
torch / transformers) that called that op and the buffer it is (``term``, from ``TERMS``), so a
difference can be traced to its source line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
BLOCK = 512  # c10/cuda/CUDACachingAllocator.cpp kMinBlockSize: every block is a multiple of it
# Path fragments that name the library that allocated a tensor, innermost first wins.
SOURCES = ("/deepspeed/", "/torch/optim/", "/transformers/", "/torch/nn/", "/torch/")


def rounded(nbytes: int) -> int:
    """Bytes the CUDA caching allocator would count for a request of ``nbytes``."""
    return -(-nbytes // BLOCK) * BLOCK


def _where(stack: list) -> list[str]:
    """The innermost frames of ``stack`` in DeepSpeed (else torch.optim, transformers, torch)."""
    this = os.path.abspath(__file__)
    frames = [f for f in stack if os.path.abspath(f.filename) != this]
    for fragment in SOURCES:
        hits = [f for f in frames if fragment in f.filename]
        if hits:
            short = [
                f"{f.filename.split(fragment, 1)[1]}:{f.name}:{f.lineno}" for f in hits[-3:][::-1]
            ]
            return [fragment.strip("/") + "/" + s for s in short]
    return [f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}" for f in frames[-2:][::-1]]


def _in_c10d(depth: int = 40) -> bool:
    """True while a ``torch.distributed`` collective (its Python API) is on the call stack."""
    frame = sys._getframe(2)
    while frame is not None and depth:
        if frame.f_code.co_filename.endswith(C10D):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


class StorageTracker(TorchDispatchMode):
    """Live bytes of every storage created by an aten op while the mode is active, and their peak.

    ``log_bytes``: while ``logging``, storages at least this big also keep their shape, dtype, op
    and call site, and each new peak copies that list (``peak_tensors``).
    """

    def __init__(self, log_bytes: int = 0):
        super().__init__()
        self.live: dict[int, int] = {}  # id(StorageImpl) -> counted bytes
        # storages a collective's backend made for itself, first seen while torch.distributed's
        # Python API is on the stack (gloo's reduce-scatter clones its whole input and copies the
        # rank's chunk out in ``work.wait()``): NCCL on a GPU takes no such copy from torch's
        # allocator, so they are counted apart (``internal_bytes``), not in ``current``
        self.internal: set[int] = set()
        self.internal_bytes = 0
        self.info: dict[int, dict] = {}  # id -> description, for storages >= log_bytes
        self._refs: dict[int, weakref.ref] = {}
        self.current = 0
        self.peak = 0
        self.raw_peak = 0  # with the collectives' own storages (``internal_bytes``)
        self.log_bytes = log_bytes
        self.logging = False
        self.peak_tensors: list[dict] = []
        self._orig_resize = torch.UntypedStorage.resize_

    # --- bookkeeping
    def _freed(self, key: int, _ref=None) -> None:
        if key in self.internal:
            self.internal.discard(key)
            self.internal_bytes -= self.live.pop(key, 0)
        else:
            self.current -= self.live.pop(key, 0)
        self.info.pop(key, None)
        self._refs.pop(key, None)

    def _set_size(self, storage, key: int, nbytes: int, describe) -> None:
        old = self.live.get(key)
        new = rounded(nbytes) if nbytes else 0
        if old is None:
            self._refs[key] = weakref.ref(storage, lambda ref, k=key: self._freed(k, ref))
            old = 0
            if _in_c10d():
                self.internal.add(key)
        self.live[key] = new
        if key in self.internal:
            self.internal_bytes += new - old
            self.raw_peak = max(self.raw_peak, self.current + self.internal_bytes)
            return
        self.current += new - old
        if self.logging and new >= self.log_bytes and (old == 0 or key not in self.info):
            self.info[key] = describe()
        self.raw_peak = max(self.raw_peak, self.current + self.internal_bytes)
        if self.current > self.peak:
            self.peak = self.current
            if self.logging:
                self.peak_tensors = list(self.info.values())

    def _track(self, tensor: torch.Tensor, func) -> None:
        if tensor.device.type == "meta":
            return
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return
        key = storage._cdata
        nbytes = storage.nbytes()
        if self.live.get(key) == rounded(nbytes) or (nbytes == 0 and key not in self.live):
            return

        def describe():
            return {
                "bytes": rounded(nbytes),
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype).replace("torch.", ""),
                "op": str(func),
                "where": _where(traceback.extract_stack()),
            }

        self._set_size(storage, key, nbytes, describe)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, func)
        # in-place ops with out= / resize may grow an argument's storage
        if func._schema.is_mutable:
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor):
                    self._track(t, func)
        return out

    def __enter__(self):
        tracker = self

        def resize_(storage, size):
            tracker._orig_resize(storage, size)
            key = storage._cdata
            if key in tracker.live or size:
                tracker._set_size(storage, key, size, lambda: {"bytes": rounded(size)})

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._orig_resize
        return super().__exit__(*exc)

    def track_existing(self, tensors) -> None:
        """Count storages that exist before the mode is entered (a model's weights) from now on,
        so that an in-place update inside the mode (an optimizer step) does not count them as
        new."""
        for tensor in tensors:
            self._track(tensor, "existing")

    # --- phases
    def start_phase(self) -> int:
        """Collect garbage, reset the peak to what is alive now and return that."""
        gc.collect()
        self.peak = self.current
        self.raw_peak = self.current + self.internal_bytes
        self.peak_tensors = list(self.info.values())
        return self.current


def validate() -> dict:
    """The tracker on allocations of known size: a bf16 tensor, a view of it, temporaries inside
    an expression, a foreach op's outputs, and everything freed again. Returns what it saw and
    whether it was exact."""
    n = 1_000_003
    with StorageTracker() as t:
        a = torch.empty(n, dtype=torch.bfloat16)
        after_alloc = t.current
        view = a.narrow(0, 0, 10)  # a view shares the storage: no bytes
        view_added = t.current - after_alloc
        b = (a.float() * 2).sum()  # a.float(): fp32 temporary, (.. * 2): a second one
        peak_expr = t.peak
        del b
        xs = [torch.ones(1000) for _ in range(4)]
        before_foreach = t.current
        ys = torch._foreach_sqrt(xs)
        foreach_added = t.current - before_foreach
        del a, ys, xs, view
        gc.collect()
        end = t.current
    expect = {
        "alloc": rounded(2 * n),
        "peak_expr": rounded(2 * n) + 2 * rounded(4 * n),
        "foreach_added": 4 * rounded(4000),
        "end": 0,
    }
    seen = {"alloc": after_alloc, "peak_expr": peak_expr, "foreach_added": foreach_added}
    seen.update(end=end, view_added=view_added)
    expect["view_added"] = 0
    # the scalar sum() result adds one 512-byte block to the expression's peak at most
    ok = (
        seen["alloc"] == expect["alloc"]
        and 0 <= seen["peak_expr"] - expect["peak_expr"] <= BLOCK
        and seen["foreach_added"] == expect["foreach_added"]
        and seen["end"] == 0
        and seen["view_added"] == 0
    )
    return {"ok": ok, "seen": seen, "expected": expect}


# ``--runs`` options: DeepSpeed zero_optimization keys and the probe's model arguments
RUN_ZERO_KEYS = {"reuse": "stage3_max_reuse_distance"}
RUN_MODEL_KEYS = ("vocab", "hidden", "intermediate", "layers")


def parse_run(spec: str, args) -> tuple[int, dict, argparse.Namespace]:
    """``"3"`` -> (3, {}, args); ``"3:reuse=0"`` sets stage3_max_reuse_distance=0;
    ``"2:vocab=32768"`` trains that run's model with another vocabulary (any of
    ``RUN_MODEL_KEYS``)."""
    stage, _, extra = spec.partition(":")
    zero, model = {}, dict(vars(args))
    for item in filter(None, extra.split(",")):
        name, _, value = item.partition("=")
        if name in RUN_MODEL_KEYS:
            model[name] = int(value)
        else:
            zero[RUN_ZERO_KEYS.get(name, name)] = int(value)
    return int(stage), zero, argparse.Namespace(**model)


def ds_config(args, stage: int, extra_zero: dict | None = None) -> dict:
    """The calibration runs' DeepSpeed JSON, with explicit bucket sizes for the tiny model.
    ``stage3_max_reuse_distance`` is left at DeepSpeed's default (1e9) unless a run sets it."""
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    zero["reduce_bucket_size"] = args.reduce_bucket
    if stage in (1, 2):
        zero["allgather_bucket_size"] = args.allgather_bucket
    else:
        zero.update(
            stage3_prefetch_bucket_size=args.prefetch_bucket,
            stage3_param_persistence_threshold=args.persistence,
            stage3_max_live_parameters=args.max_live,
            sub_group_size=args.sub_group,
        )
    zero.update(extra_zero or {})
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def model_config(args) -> dict:
    """The transformers config.json fields of the model the probe trains (zerofit's ModelSpec is
    built from the same dict)."""
    return {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "max_position_embeddings": max(256, args.seq_len),
        "tie_word_embeddings": args.tied,
        "use_cache": False,
        "torch_dtype": "bfloat16",
    }


# Which buffer a logged storage is, by the DeepSpeed (or torch) function that allocated it.
TERMS = (
    ("stage_1_and_2.py:setup_buckets", "ipg_bucket"),
    ("stage_1_and_2.py:copy_grads_in_partition", "grads_in_partition"),
    ("coalesced_collectives.py:reduce_scatter_coalesced", "reduce_scatter_flat_copy"),
    ("partition_parameters.py:_all_gather_sequential", "gathered_param"),
    ("partition_parameters.py:_all_gather_dtype", "gathered_param"),
    ("partition_parameters.py:wait", "gathered_param"),
    ("stage3.py:_prepare_fp32_grad_for_sub_group", "fp32_grad"),
    ("stage_1_and_2.py:get_grad_norm_direct", "grad_norm_fp64"),
    ("stage_1_and_2.py:step", "fp32_grad"),
)


def term_of(entry: dict, tied_shape: list[int]) -> str:
    """The buffer a logged storage stands for (``other`` when no rule names it)."""
    where = " ".join(entry.get("where", []))
    if entry.get("op", "").startswith("aten._foreach_sqrt"):
        return "adam_foreach_sqrt"
    if entry.get("op") == "aten.cat.default" and "stage_1_and_2.py:step" in where:
        return "flat_grad_copy"
    for site, term in TERMS:
        if site in where:
            return term
    if entry.get("shape") == tied_shape and "engine.py:backward" in where:
        # autograd's gradients of the tied embedding/LM-head matrix: the LM head's (mm), the
        # embedding's (embedding_dense_backward) and their out-of-place sum (add)
        return "tied_weight_grad"
    return "other"


def engine_internals(engine, stage: int) -> dict:
    """Sizes DeepSpeed chose that the byte counts depend on (elements)."""
    import deepspeed.comm as dist

    opt = engine.optimizer
    if stage in (1, 2):
        # each param's slice inside this rank's partition of the flat bit16 buffer: the grad norm
        # converts one slice at a time to fp64 (stage_1_and_2.py:get_grad_norm_direct)
        flat, size = opt.bit16_groups_flat[0], int(opt.partition_size[0])
        low = dist.get_rank(group=opt.real_dp_process_group[0]) * size
        slices = []
        for param in opt.round_robin_bit16_groups[0]:
            start = (param.data_ptr() - flat.data_ptr()) // flat.element_size()
            overlap = min(start + param.numel(), low + size) - max(start, low)
            slices.append(max(0, overlap))
        return {
            "partition_size": [int(n) for n in opt.partition_size],
            "params_in_partition_numel": [
                sum(p.numel() for p in group) for group in opt.params_in_partition
            ],
            "largest_slice_in_partition": max(slices),
        }
    persistent = [p for p in engine.module.parameters() if getattr(p, "ds_persist", False)]
    return {
        "sub_group_numel": [t.numel() for t in opt.fp32_partitioned_groups_flat],
        "persistent_numel": sum(p.ds_numel for p in persistent),
        "partition_numel": sum(p.ds_tensor.ds_numel for p in engine.module.parameters()),
    }


def run_stage(args, spec: str) -> dict:
    """Build, initialize and train one engine under a fresh tracker; return the per-phase bytes."""
    import deepspeed
    from transformers import Qwen2Config, Qwen2ForCausalLM

    stage, extra_zero, args = parse_run(spec, args)
    config = ds_config(args, stage, extra_zero)
    tracker = StorageTracker(args.log_bytes)
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len), generator=gen)
    tied_shape = [args.vocab, args.hidden]
    out: dict = {"run": spec, "stage": stage, "model": model_config(args), "ds_config": config}
    out["steps"] = []
    with tracker:
        torch.manual_seed(0)
        fields = {k: v for k, v in model_config(args).items()}
        for key in ("architectures", "model_type", "torch_dtype"):
            fields.pop(key)
        model = Qwen2ForCausalLM(Qwen2Config(**fields, attn_implementation="sdpa"))
        model = model.to(torch.bfloat16).train()
        out["params"] = sum(p.numel() for p in model.parameters())
        out["model_bytes"] = tracker.current
        # torch's default on CUDA; asked for explicitly since CPU params default to the for-loop
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        tracker.start_phase()
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        del model, optimizer
        gc.collect()
        out["init"] = {"peak": tracker.peak, "end": tracker.current}
        out["internals"] = engine_internals(engine, stage)
        for step in range(args.steps):
            last = step == args.steps - 1
            tracker.logging = last and args.log_bytes > 0
            phases, tensors = {}, {}
            loss = None
            for name in PHASES:
                start = tracker.start_phase()
                loss = run_phase(engine, ids, name, loss)
                phases[name] = {
                    "start": start,
                    "peak": tracker.peak,
                    "end": tracker.current,
                    "peak_with_comm_internal": tracker.raw_peak,
                }
                if tracker.logging:
                    logged = sorted(tracker.peak_tensors, key=lambda d: -d["bytes"])
                    for entry in logged:
                        entry["term"] = term_of(entry, tied_shape)
                    tensors[name] = logged
            out["steps"].append(phases)
            if tensors:
                out["peak_tensors"] = tensors
        tracker.logging = False
        if args.profiler_check:
            last = out["steps"][-1]
            out["profiler_check"] = {
                "tracker": {k: v["peak"] - last["forward"]["start"] for k, v in last.items()},
                "profiler": profiled_step(engine, ids),
            }
        engine.destroy()
        del engine
        gc.collect()
    return out


PHASES = ("forward", "backward", "step")


def run_phase(engine, ids, name: str, loss):
    """One phase of a training step on the engine; the loss to carry into the next phase (None
    once the optimizer stepped, and the freed graph collected, so the phase ends without it)."""
    if name == "forward":
        return engine(input_ids=ids, labels=ids).loss
    if name == "backward":
        engine.backward(loss)
        return loss
    engine.step()
    del loss
    gc.collect()
    return None


def profiled_step(engine, ids) -> dict:
    """One more training step under ``torch.profiler`` (``profile_memory=True``) with the tracker's
    dispatch mode off: per phase, the peak of the CPU allocator's "Total Allocated" counter above
    its value at the step's start, an independent check of the tracker's peak minus the step's
    start.

    The profiler's counter only subtracts frees made on a thread it profiles
    (c10/core/CPUAllocator.cpp ``ProfiledCPUMemoryReporter::Delete`` checks the thread's
    profiler state), so buffers that gloo's worker thread frees look alive to it, and it sees
    what kernels allocate inside one op (the CPU bf16 matmul's fp32 scratch). Where nothing of
    the kind happens the two agree within the tracker's 512-byte rounding; the cleanest check
    profiles one run per process (a later run's window can see earlier windows' blocks freed).
    """
    import tempfile

    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        gc.collect()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = None
            for name in PHASES:
                with record_function("PHASE_" + name):
                    loss = run_phase(engine, ids, name, loss)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
    memory = sorted(
        (e["ts"], e["args"]["Total Allocated"], e["args"]["Bytes"])
        for e in events
        if e.get("name") == "[memory]"
    )
    # the counter is process-wide and keeps what earlier profiled steps never saw freed:
    # measure from its value before this step's first allocation
    base = memory[0][1] - memory[0][2] if memory else 0
    spans = {
        e["name"][len("PHASE_") :]: (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e.get("name", "").startswith("PHASE_")
    }
    return {
        name: max([total for ts, total, _ in memory if start <= ts <= end], default=base) - base
        for name, (start, end) in spans.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        default=["1", "2", "3"],
        help="ZeRO stages to run, one after the other; STAGE:reuse=N sets "
        "stage3_max_reuse_distance=N, STAGE:vocab=N (hidden, intermediate, layers) the model's",
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--untied", dest="tied", action="store_false")
    # bucket sizes in elements, all smaller than the model (16.3M params at the defaults)
    parser.add_argument("--reduce-bucket", type=int, default=3_000_000)
    parser.add_argument("--allgather-bucket", type=int, default=3_000_000)
    parser.add_argument("--prefetch-bucket", type=int, default=2_000_000)
    parser.add_argument("--persistence", type=int, default=10_000)
    parser.add_argument("--max-live", type=int, default=6_000_000)
    parser.add_argument("--sub-group", type=int, default=4_000_000)
    parser.add_argument("--log-bytes", type=int, default=0, help="list storages >= this at peaks")
    parser.add_argument("--out", help="write DIR/rank<N>.json instead of printing one line")
    parser.add_argument(
        "--profiler-check",
        action="store_true",
        help="one more step under torch.profiler(profile_memory=True), to compare with the tracker",
    )
    args = parser.parse_args()

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.comm as dist

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    from memory_probe import fp32_kernels_for_emulated_bf16

    # the libraries' objects, loaded for good, out of every collection: each phase's
    # gc.collect() then scans only what the runs create (0.25 s -> milliseconds per phase)
    gc.freeze()
    check = validate()
    if not check["ok"]:
        print(json.dumps({"error": "tracker validation failed", "validation": check}), flush=True)
        sys.exit(2)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    with fp32_kernels_for_emulated_bf16():  # minutes -> seconds on a CPU without native bf16
        for spec in args.runs:
            results.append(run_stage(args, spec))
            dist.barrier()
    record = {
        "probe": "zero_phase",
        "rank": rank,
        "world": world,
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "validation": check,
        "model": model_config(args),
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "runs": results,
    }
    if args.out:
        # a file per rank: two ranks' long lines written to one shared pipe could interleave
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump(record, f)
    else:
        sys.stdout.write("ZERO_PHASE_PROBE " + json.dumps(record) + "\n")
        sys.stdout.flush()
    dist.barrier()
    sys.stderr.flush()
    # as recipes/common.py finish_run does: skip C++ static destructors, which can abort a finished
    # gloo / shm-comm run ("terminate called without an active exception")
    os._exit(0)


if __name__ == "__main__":
    main()
