"""The CUDA allocation trace of a LoRA training run: every storage the GPU would hold, in order.

For each LoRA case measured in tests/data/gpu_lora_memory_h200.jsonl (the ``plain`` stack) and
the ``autocast`` rows of tests/data/gpu_lora_memory_h100_stacks.jsonl, the run of
benchmarks/gpu_lora_memory.py (the saved bf16 model loaded, peft's all-linear adapters, three
training steps of its ``build_step``) is replayed on fake tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``: shapes and dtypes, no memory, no compute), so
Qwen2.5-0.5B's real shape at 2 x 2048 tokens records in seconds on a CPU. An
``AllocationRecorder`` (a ``TorchDispatchMode`` stacked above the fake mode: the technique of
tests/scripts/zero_phase_probe.py ``StorageTracker``) writes one event per storage the GPU
would hold:

    ("alloc", key, nbytes)    a new storage of nbytes (unrounded)
    ("free", key, 0)          that storage died (a weak reference on it fired)
    ("resize", key, nbytes)   UntypedStorage.resize_ (0 frees it; the key stays known)
    ("empty_cache", 0, 0)     torch.cuda.empty_cache()

which src/zerofit/memory/allocator.py replays through the CUDA caching allocator's rules.

The fake tensors live on the CPU device (a CPU-only torch cannot run autograd on fake CUDA
tensors: the engine has no CUDA device thread), so what the GPU run does differently is
emulated:
- the load order: transformers' ``from_pretrained`` copies each checkpoint tensor to the GPU in
  the order of its sorted keys (transformers/core_model_loading.py
  ``convert_and_load_state_dict_in_model``: ``sorted(..., key=dot_natural_key)``), then the
  rotary buffers; peft's adapters are recorded as peft makes them: built on the host (not
  recorded), moved to the base's device in bf16, then each cast to fp32
  (``autocast_adapter_dtype``);
- host tensors: ``torch.tensor(...)`` constants (``aten.lift_fresh``: foreach AdamW's step
  counters, which stay on the CPU in a GPU run) are not recorded;
- attention: the flash kernel that SDPA picks on an H100 / H200 for Qwen2's bf16 causal
  attention without a mask, GQA's fewer key/value heads taken as they are
  (``FlashAttention``: its output in the kernel's [batch, seq, heads, dim] layout, the
  log-sum-exp it saves, and in backward the scratch flash_api.cpp ``mha_bwd`` allocates and
  frees inside the op);
- dropout: CUDA's fused kernel, which keeps a bool mask (aten/src/ATen/native/Dropout.cpp
  ``is_fused_kernel_acceptable``; the CPU multiplies by a noise tensor of the input's dtype);
- cuBLAS's workspaces, taken from the caching allocator once per handle (per thread: the
  forward's, and the autograd engine's device thread's for the backward) and kept
  (aten/src/ATen/cuda/CublasHandlePool.cpp, memory/overheads.py): 32 MiB at the handle's first
  matmul (``getCurrentCUDABlasHandle``), and 1 MiB for cuBLASLt at its first bias ``addmm``
  (``getCUDABlasLtWorkspace``; torch's ``addmm_out_cuda_impl`` takes cuBLASLt's
  ``gemm_and_bias`` for a 1-D bias); both handles' pairs are the 69,206,016 B the measured rows
  hold beside their tensors.
The autocast stack runs CPU autocast: for this model's ops (linear, matmul in bf16; the norms,
rotary embedding and loss already upcast by transformers) its casts are CUDA autocast's, weight
cast cache included. Not seen: other kernels' scratch inside one op (reductions' partial sums).

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
import contextlib
import gc
import json
import sys
import time
import weakref
from pathlib import Path

import gpu_lora_memory
import model_shapes

ROOT = Path(__file__).resolve().parents[1]
PLAIN_RESULTS = ROOT / "tests" / "data" / "gpu_lora_memory_h200.jsonl"
STACK_RESULTS = ROOT / "tests" / "data" / "gpu_lora_memory_h100_stacks.jsonl"
BLOCK = 512  # c10/cuda/CUDACachingAllocator.cpp kMinBlockSize
# cuBLAS's and cuBLASLt's workspaces per handle on Hopper (memory/overheads.py
# CUBLAS_WORKSPACE_32MIB, CUBLASLT_WORKSPACE): the measured rows hold two pairs, 69,206,016 B
CUBLAS_WORKSPACE_BYTES = 32 * 1024 * 1024
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
DEVICE = "cpu"  # the fake tensors' device; every storage recorded stands for a GPU one
STEPS = 3
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm")
HOST_OPS = ("lift_fresh",)  # torch.tensor(...) constants: host tensors in the GPU run

Event = tuple[str, int, int]


def rounded(nbytes: int) -> int:
    """Bytes the CUDA caching allocator counts for a request of ``nbytes``."""
    return -(-nbytes // BLOCK) * BLOCK


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


class AllocationRecorder:
    """Records the storages that aten ops create, resize and free, as allocator events.

    Use ``recording()`` (a context) around the code; ``events`` is the trace. A
    ``TorchDispatchMode`` sees every op's outputs; each new storage gets a key, and a weak
    reference on it writes its ``free`` when it dies (zero_phase_probe.py ``StorageTracker``).
    Storages first seen inside ``on_host()`` or made by ``HOST_OPS`` are host tensors in the GPU
    run and are never recorded.
    """

    def __init__(self, workspaces: bool = True):
        self.events: list[Event] = []
        self.workspaces = workspaces
        # key -> "forward/cublas" etc.: the workspaces, each taken once per process
        self.workspace_keys: dict[int, str] = {}
        self._key_of: dict[int, int] = {}  # id of the StorageImpl -> key
        self._bytes: dict[int, int] = {}  # key -> its current bytes
        self._refs: dict[int, weakref.ref] = {}  # key (or host id) -> weak reference
        self._host: set[int] = set()  # ids of host storages
        self._host_depth = 0
        self._next_key = 0
        # (thread, library) pairs that have their workspace: ("forward" | "backward",
        # "cublas" | "cublaslt")
        self._workspace_in: set[tuple[str, str]] = set()

    # --- events
    def allocate(self, nbytes: int) -> int:
        """A new key holding ``nbytes``, and its alloc event."""
        key = self._next_key
        self._next_key += 1
        self._bytes[key] = nbytes
        self.events.append(("alloc", key, nbytes))
        return key

    def free(self, key: int) -> None:
        """``key``'s free event (none for one already resized to 0)."""
        if self._bytes.pop(key, 0):
            self.events.append(("free", key, 0))

    def live_keys(self) -> list[int]:
        """Keys alive now (holding bytes), oldest first."""
        return [key for key, nbytes in self._bytes.items() if nbytes]

    def _died(self, cdata: int, key: int) -> None:
        if self._key_of.get(cdata) == key:
            del self._key_of[cdata]
        self._refs.pop(key, None)
        self.free(key)

    def _host_died(self, cdata: int) -> None:
        self._host.discard(cdata)
        self._refs.pop(-cdata, None)

    @contextlib.contextmanager
    def on_host(self):
        """Storages first seen inside are host tensors in the GPU run (peft's adapters before
        they move to the base's device)."""
        self._host_depth += 1
        try:
            yield
        finally:
            self._host_depth -= 1

    # --- storages
    def track(self, tensor, host: bool = False) -> None:
        """Record ``tensor``'s storage if it is new, or grew since it was seen."""
        if tensor.device.type == "meta":
            return
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return
        self.track_storage(storage, host=host)

    def track_storage(self, storage, resized_to: int | None = None, host: bool = False) -> None:
        """Record ``storage``: an alloc when new, a resize when its size changed."""
        cdata = storage._cdata
        if cdata in self._host:
            return
        nbytes = storage.nbytes() if resized_to is None else resized_to
        key = self._key_of.get(cdata)
        if key is not None:
            if self._bytes.get(key) != nbytes:
                self._bytes[key] = nbytes
                self.events.append(("resize", key, nbytes))
            return
        if host or self._host_depth:
            self._host.add(cdata)
            self._refs[-cdata] = weakref.ref(storage, lambda _ref, c=cdata: self._host_died(c))
            return
        if nbytes == 0:
            return
        key = self.allocate(nbytes)
        self._key_of[cdata] = key
        self._refs[key] = weakref.ref(storage, lambda _ref, c=cdata, k=key: self._died(c, k))

    def op_done(self, func, args, kwargs, out) -> None:
        """What one aten op left: its outputs, grown arguments, and cuBLAS's workspaces."""
        import torch
        from torch.utils._pytree import tree_flatten

        name = func.overloadpacket.__name__
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for tensor in outputs:
            self.track(tensor, host=name in HOST_OPS)
        if func._schema.is_mutable:  # out= and resize ops may grow an argument's storage
            for tensor in tree_flatten((args, kwargs))[0]:
                if isinstance(tensor, torch.Tensor):
                    self.track(tensor)
        if name in MATMUL_OPS and outputs and self.workspaces:
            self.cublas_workspaces(name, args)

    def cublas_workspaces(self, name: str, args) -> None:
        """The workspaces a matmul's thread takes on its first cuBLAS / cuBLASLt call, after
        the op's output (the kernel asks its handle once the output exists)."""
        import torch

        thread = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        needed = [("cublas", CUBLAS_WORKSPACE_BYTES)]
        if name == "addmm" and args[0].dim() == 1:  # a bias: cuBLASLt's gemm_and_bias
            needed.append(("cublaslt", CUBLASLT_WORKSPACE_BYTES))
        for library, nbytes in needed:
            if (thread, library) not in self._workspace_in:
                self._workspace_in.add((thread, library))
                self.workspace_keys[self.allocate(nbytes)] = f"{thread}/{library}"

    @contextlib.contextmanager
    def recording(self):
        """Record while inside: the dispatch mode and a patched ``UntypedStorage.resize_``."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        original_resize = torch.UntypedStorage.resize_

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                recorder.op_done(func, args, kwargs or {}, out)
                return out

        def resize_(storage, size):
            result = original_resize(storage, size)
            recorder.track_storage(storage, resized_to=size)
            return result

        torch.UntypedStorage.resize_ = resize_
        try:
            with Mode():
                yield self
        finally:
            torch.UntypedStorage.resize_ = original_resize


def flash_attention_function():
    """``FlashAttention``: SDPA's flash kernel on a GPU, as an autograd function on fake tensors.

    Forward (aten/src/ATen/native/transformers/cuda/attention.cu
    ``_scaled_dot_product_flash_attention_cuda`` -> flash_api.cpp ``mha_fwd``): the output in
    the kernel's [batch, seq, heads, dim] layout, returned transposed, the fp32 log-sum-exp
    [batch, heads, seq], and the philox seed and offset on the GPU (uint64 [2] and [], as
    torch/_meta_registrations.py ``meta__scaled_dot_product_flash_attention`` gives them on
    CUDA); all saved with the inputs. Backward (``mha_bwd``): dq, dk, dv like
    their inputs, then scratch freed inside the op: ``softmax_d`` fp32 [b, h, s_q rounded to
    128], ``dq_accum`` fp32 [b, s_q rounded, h, d rounded to 32], and under GQA
    ``dk_expanded`` / ``dv_expanded`` [b, s_k, h, d] in the inputs' dtype."""
    import torch

    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value):
            batch, heads, seq, head_dim = query.shape
            out = query.new_empty((batch, seq, heads, head_dim)).transpose(1, 2)
            logsumexp = query.new_empty((batch, heads, seq), dtype=torch.float32)
            philox_seed = query.new_empty((2,), dtype=torch.uint64)
            philox_offset = query.new_empty((), dtype=torch.uint64)
            ctx.save_for_backward(query, key, value, out, logsumexp, philox_seed, philox_offset)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            query, key, value = ctx.saved_tensors[:3]
            grads = [torch.empty_like(t) for t in (query, key, value)]
            batch, heads, seq_q, head_dim = query.shape
            seq_q_rounded = round_up(seq_q, 128)
            scratch = [
                query.new_empty((batch, heads, seq_q_rounded), dtype=torch.float32),
                query.new_empty(
                    (batch, seq_q_rounded, heads, round_up(head_dim, 32)), dtype=torch.float32
                ),
            ]
            if key.shape[1] != heads:  # dk_expanded, dv_expanded
                expanded = (batch, key.shape[2], heads, head_dim)
                scratch += [query.new_empty(expanded), query.new_empty(expanded)]
            while scratch:  # freed in reverse, as C++ destroys its locals
                scratch.pop()
            return tuple(grads)

    return FlashAttention


def flash_sdpa(original):
    """``F.scaled_dot_product_attention`` as it dispatches on an H100 / H200 for bf16 attention
    without a mask: the flash kernel (``flash_attention_function``), which takes GQA's key/value
    heads as they are (transformers passes ``enable_gqa``). Anything else goes to
    ``original``."""
    import torch

    flash = flash_attention_function()

    def sdpa(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs
    ):
        if attn_mask is None and dropout_p == 0 and query.dtype in (torch.bfloat16, torch.float16):
            return flash.apply(query, key, value)
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale, **kwargs)

    return sdpa


def fused_dropout(input, p=0.5, training=True, inplace=False):
    """``F.dropout`` as CUDA runs it: the fused ``native_dropout`` kernel, its mask in bool
    (memory/layer_trace.py ``_fused_dropout``)."""
    import torch

    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


def swap_forgetting_fakes(fake_mode, original):
    """``torch.utils.swap_tensors`` for ``Module.to`` on fake parameters: the fake mode's memo
    holds a weak reference on every fake ``Parameter`` (torch/_subclasses/meta_utils.py
    ``tensor_memo``), which swap_tensors refuses; the memo maps real tensors to their fakes and
    this run has none, so it is emptied first."""

    def swap(first, second):
        fake_mode.fake_tensor_converter.meta_converter.tensor_memo.clear()
        return original(first, second)

    return swap


def unpacked_sequences(original):
    """transformers/masking_utils.py ``find_packed_sequence_indices``: its ops run, and the
    traced batch is one sequence per row (position ids 0..n-1, as in the GPU run, where the
    function reads the values and returns None); on fake tensors it cannot read them and
    would return a packing mask."""

    def find(position_ids):
        original(position_ids)
        return None

    return find


def host_built_linear(recorder, original_init):
    """``nn.Linear.__init__`` whose storages are host tensors: peft builds each adapter on the
    CPU, then moves it to the base layer's device (peft/tuners/tuners_utils.py
    ``_move_adapter_to_device_of_base_layer``)."""

    def init(module, *args, **kwargs):
        with recorder.on_host():
            original_init(module, *args, **kwargs)

    return init


@contextlib.contextmanager
def gpu_emulation(fake_mode, recorder):
    """The GPU run's kernels and placements on fake CPU tensors, while inside: SDPA's flash
    kernel, no mask tensor for unpacked sequences, CUDA's fused dropout, adapters built on the
    host, and ``Module.to`` on fakes."""
    import torch
    import torch.nn.functional as functional
    from transformers import masking_utils

    saved = (
        functional.scaled_dot_product_attention,
        functional.dropout,
        torch.utils.swap_tensors,
        torch.nn.Linear.__init__,
        masking_utils.find_packed_sequence_indices,
    )
    functional.scaled_dot_product_attention = flash_sdpa(saved[0])
    functional.dropout = fused_dropout
    torch.utils.swap_tensors = swap_forgetting_fakes(fake_mode, saved[2])
    torch.nn.Linear.__init__ = host_built_linear(recorder, saved[3])
    masking_utils.find_packed_sequence_indices = unpacked_sequences(saved[4])
    try:
        yield
    finally:
        (
            functional.scaled_dot_product_attention,
            functional.dropout,
            torch.utils.swap_tensors,
            torch.nn.Linear.__init__,
            masking_utils.find_packed_sequence_indices,
        ) = saved


def build_base_model(shape: dict):
    """The random-init Qwen2 of ``shape`` that gpu_lora_memory.py saves, in bf16, on fake
    tensors (enter a FakeTensorMode first); ``load_in_checkpoint_order`` then makes the
    storages the GPU run loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def warm_up_allocator(model) -> None:
    """transformers/modeling_utils.py ``caching_allocator_warmup``, which ``from_pretrained``
    runs before loading onto a GPU: one fp16 tensor of the parameters' bytes (a tied weight
    once), freed at once, so the caching allocator reserves them in one segment. In a fresh
    process it takes the whole count; ``replay_case`` applies its rule for what earlier cases
    left cached."""
    import torch

    byte_count = sum(param.numel() * param.element_size() for param in model.parameters())
    warmup = torch.empty(byte_count // 2, dtype=torch.float16)
    del warmup


def load_in_checkpoint_order(model) -> None:
    """Each parameter copied in the order ``from_pretrained`` loads the saved checkpoint
    (transformers/core_model_loading.py ``convert_and_load_state_dict_in_model``: keys sorted by
    ``dot_natural_key``; a tied weight once, under its first name), then the buffers (the
    rotary frequencies, not in the checkpoint)."""
    import torch
    from transformers.core_model_loading import dot_natural_key

    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for attr, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, attr))
    named = sorted(model.named_parameters(), key=lambda item: dot_natural_key(item[0]))
    for _name, param in named:
        loaded = torch.nn.Parameter(torch.empty_like(param), requires_grad=param.requires_grad)
        for module, attr in owners[id(param)]:
            module._parameters[attr] = loaded
    for module in model.modules():
        for attr, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[attr] = torch.empty_like(buffer)


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


def live_bytes_peak(events: list[Event], start: int = 0, stop: int | None = None) -> int:
    """The peak of live bytes (each storage rounded up to 512 B) over ``events[start:stop]``,
    counting what the earlier events left alive."""
    sizes: dict[int, int] = {}
    live = peak = 0
    for index, (kind, key, nbytes) in enumerate(events[:stop]):
        if kind == "alloc":
            sizes[key] = rounded(nbytes)
            live += sizes[key]
        elif kind == "free":
            live -= sizes.pop(key)
        elif kind == "resize":
            live += rounded(nbytes) - sizes.get(key, 0)
            sizes[key] = rounded(nbytes)
        if index >= start:
            peak = max(peak, live)
    return peak


def check_events(events: list[Event]) -> list[str]:
    """Problems in a trace: a free or resize of a key that is not known, an alloc of a key in
    use, an unknown kind. Empty when the trace is consistent."""
    problems = []
    sizes: dict[int, int] = {}
    for index, (kind, key, nbytes) in enumerate(events):
        if kind == "alloc":
            if sizes.get(key):
                problems.append(f"event {index}: alloc of key {key}, already live")
            sizes[key] = nbytes
        elif kind == "free":
            if not sizes.get(key):
                problems.append(f"event {index}: free of key {key}, not live")
            sizes.pop(key, None)
        elif kind == "resize":
            if key not in sizes:
                problems.append(f"event {index}: resize of key {key}, never allocated")
            sizes[key] = nbytes
        elif kind != "empty_cache":
            problems.append(f"event {index}: unknown kind {kind!r}")
    return problems


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


def warmup_bytes(allocator, byte_count: int) -> int:
    """What ``caching_allocator_warmup`` allocates for ``byte_count`` parameter bytes given what
    the allocator holds: the count less the reserved-but-unused bytes when that still exceeds
    them, else nothing (unless over 1.5 GiB more is needed: then just past the unused bytes,
    a case these models never reach)."""
    unused = allocator.reserved - allocator.allocated
    if byte_count - unused > unused:
        return byte_count - unused
    if byte_count - unused > 1.5 * 1024**3:
        return unused + 1
    return 0


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
            nbytes = warmup_bytes(allocator, nbytes) // 2 * 2  # torch.empty(count // 2, fp16)
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
