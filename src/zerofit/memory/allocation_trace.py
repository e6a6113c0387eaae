"""A training run's CUDA allocations, recorded on fake tensors and replayed through the allocator.

``replay_training_run`` builds the model from its config.json on fake tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``: shapes and dtypes, no memory, no compute),
loads it as ``from_pretrained`` would, adds peft's adapters for LoRA, and runs a few training
steps of the setup's stack through the real transformers / peft / torch.optim code. An
``AllocationRecorder`` (a ``TorchDispatchMode`` stacked above the fake mode) writes one event per
storage the GPU would hold:

    ("alloc", key, nbytes)    a new storage of nbytes (unrounded)
    ("free", key, 0)          that storage died (a weak reference on it fired)
    ("resize", key, nbytes)   UntypedStorage.resize_ (0 frees it; the key stays known)
    ("empty_cache", 0, 0)     torch.cuda.empty_cache()

and ``allocator.CachingAllocator`` replays them: the run's ``max_memory_allocated`` and
``max_memory_reserved``, at a real model's shape, in seconds on a CPU. Checked against measured
H100 / H200 rows by benchmarks/allocation_trace.py (7 of 8 LoRA rows' ``max_memory_allocated`` to
the byte).

The fake tensors live on the CPU device (a CPU-only torch cannot run autograd on fake CUDA
tensors: the engine has no CUDA device thread), so what the GPU run does differently is
emulated (``gpu_emulation``):
- the load order: transformers' ``from_pretrained`` warms the caching allocator up
  (modeling_utils.py ``caching_allocator_warmup``), then copies each checkpoint tensor to the
  GPU in the order of its sorted keys (core_model_loading.py
  ``convert_and_load_state_dict_in_model``: ``sorted(..., key=dot_natural_key)``; a blocking
  copy converts its dtype on the host), then the buffers;
- peft's adapters are built on the host (not recorded) and moved to the base's device, in its
  dtype, then cast to fp32 (``autocast_adapter_dtype``);
- host tensors: ``torch.tensor(...)`` constants (``aten.lift_fresh``: foreach AdamW's step
  counters, which stay on the CPU in a GPU run) are not recorded;
- attention: SDPA's flash kernel, which an H100 / H200 picks for 16-bit attention without a mask
  (GQA's fewer key/value heads taken as they are); ``flash_attention_2`` saves the same tensors
  and runs through it too. What it saves and its backward's scratch: ``flash_attention_function``.
  A mask (padded batches, sliding windows), fp32 or a head dim over 256 would pick the
  memory-efficient or math kernel, which is not emulated: ``KernelNotEmulated``;
- dropout: CUDA's fused kernel, which keeps a bool mask (aten/src/ATen/native/Dropout.cpp
  ``is_fused_kernel_acceptable``; the CPU multiplies by a noise tensor of the input's dtype);
- cuBLAS's workspaces, taken from the caching allocator once per handle (per thread: the
  forward's, and the autograd engine's device thread's for the backward) and kept
  (aten/src/ATen/cuda/CublasHandlePool.cpp, memory/overheads.py): the cuBLAS one at the
  handle's first matmul (``getCurrentCUDABlasHandle``), cuBLASLt's at its first bias ``addmm``
  (``getCUDABlasLtWorkspace``). None where the setup names no CUDA GPU.
Autocast runs as CPU autocast, whose casts for these models' ops (linear, matmul; the norms,
rotary embedding and loss already upcast by transformers) are CUDA autocast's, weight cast cache
included. Not seen: other kernels' scratch inside one op (reductions' partial sums), fp16's
GradScaler (a few scalars).

What it covers (``replay_support``): one GPU at stage 0 without DeepSpeed, sft, full fine-tuning
or LoRA, SDPA / flash_attention_2 in 16-bit or eager attention, unpadded batches, torch's AdamW
(fused or foreach). Padded batches are refused rather than emulated: SDPA then gets a 4-D mask
and runs the memory-efficient kernel, whose backward scratch depends on the cutlass kernel picked
for the GPU (attention_backward.cu ``_efficient_attention_backward``: ``delta``, the split-key
workspace). QLoRA too: bitsandbytes' 4-bit weights cannot be faked. A model transformers builds
as no causal LM, or whose run needs a kernel not emulated (a sliding-window mask, MoE experts'
``_grouped_mm`` in fp32) or that peft refuses, replays as None.

torch, transformers and peft are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time
import warnings
import weakref
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version

from zerofit.cache import cache_file, read_cache, store_in_cache
from zerofit.hardware import compute_capability
from zerofit.memory import overheads as oh
from zerofit.memory.allocator import CachingAllocator
from zerofit.memory.layer_trace import _fused_dropout, _model_config
from zerofit.memory.lora import ATTENTION_MODULES, PEFT_DEFAULT
from zerofit.model_classes import training_auto_class

BLOCK = 512  # c10/cuda/CUDACachingAllocator.cpp kMinBlockSize
# cuBLAS's and cuBLASLt's workspaces per handle on Hopper (memory/overheads.py)
CUBLAS_WORKSPACE_BYTES = oh.CUBLAS_WORKSPACE_32MIB
CUBLASLT_WORKSPACE_BYTES = oh.CUBLASLT_WORKSPACE
DEVICE = "cpu"  # the fake tensors' device; every storage recorded stands for a GPU one
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm")
HOST_OPS = ("lift_fresh",)  # torch.tensor(...) constants: host tensors in the GPU run
# transformers' caching_allocator_warmup leaves this much of the GPU unreserved
WARMUP_HEADROOM = int(1.2 * 1024**3)
FLASH_MAX_HEAD_DIM = 256  # flash_api.cpp: head dims up to 256
# bump when what a replay records changes: older cache entries are then ignored
REPLAY_CACHE_VERSION = "1"
UNREPLAYABLE = "unreplayable"  # cached too: the same model fails the same way next time
ATTENTIONS = ("sdpa", "flash_attention_2", "eager")
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch")
# how many runs were recorded in this process (a cached replay records none)
recordings_made = 0

Event = tuple[str, int, int]


@dataclass(frozen=True)
class ReplayedRun:
    """A training run's replayed peaks, as ``torch.cuda`` would report them. After an
    out-of-memory the replay goes on without the blocks it could not get, so its peaks stop near
    the capacity: the call without one gives what the run needs."""

    max_allocated: int  # torch.cuda.max_memory_allocated() over the whole run (load + steps)
    max_reserved: int  # torch.cuda.max_memory_reserved() over the whole run
    out_of_memory: bool  # the replay with `capacity` could not get a segment even after release
    steps: int
    seconds: float  # recording + replay time


class KernelNotEmulated(Exception):
    """The GPU would run a kernel whose allocations this module does not emulate."""


def rounded(nbytes: int) -> int:
    """Bytes the CUDA caching allocator counts for a request of ``nbytes``."""
    return -(-nbytes // BLOCK) * BLOCK


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


# --- the recorder ---------------------------------------------------------------------------------
class AllocationRecorder:
    """Records the storages that aten ops create, resize and free, as allocator events.

    Use ``recording()`` (a context) around the code; ``events`` is the trace. A
    ``TorchDispatchMode`` sees every op's outputs; each new storage gets a key, and a weak
    reference on it writes its ``free`` when it dies. Storages first seen inside ``on_host()`` or
    made by ``HOST_OPS`` are host tensors in the GPU run and are never recorded. ``workspaces``:
    record cuBLAS's (``cublas_bytes`` per handle) and cuBLASLt's workspaces.
    """

    def __init__(self, workspaces: bool = True, cublas_bytes: int = CUBLAS_WORKSPACE_BYTES):
        self.events: list[Event] = []
        self.workspaces = workspaces
        self.cublas_bytes = cublas_bytes
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

    def is_host(self, tensor) -> bool:
        """``tensor``'s storage is a host one (seen inside ``on_host``)."""
        return tensor.untyped_storage()._cdata in self._host

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
        needed = [("cublas", self.cublas_bytes)]
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


# --- the GPU's kernels on fake CPU tensors --------------------------------------------------------
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


def flash_sdpa():
    """``F.scaled_dot_product_attention`` as it dispatches on an H100 / H200 for 16-bit
    attention without a mask: the flash kernel (``flash_attention_function``), which takes GQA's
    key/value heads as they are (transformers passes ``enable_gqa``). Under autocast the inputs
    are cast first, as CUDA autocast casts SDPA's (a patched Python function sees them before
    the dispatcher does). Any other call would take another kernel: ``KernelNotEmulated``."""
    import torch

    flash = flash_attention_function()

    def sdpa(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs
    ):
        if torch.is_autocast_enabled(DEVICE):
            dtype = torch.get_autocast_dtype(DEVICE)
            query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
        if attn_mask is not None:
            raise KernelNotEmulated("SDPA with a mask runs the memory-efficient kernel")
        if query.dtype not in (torch.bfloat16, torch.float16):
            raise KernelNotEmulated(f"SDPA in {query.dtype} runs the memory-efficient kernel")
        if query.shape[-1] > FLASH_MAX_HEAD_DIM:
            raise KernelNotEmulated(f"head dim {query.shape[-1]} is past the flash kernel's")
        # the flash kernel keeps its RNG state whatever dropout_p is: nothing else to save
        return flash.apply(query, key, value)

    return sdpa


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
    kernel, no mask tensor for unpacked sequences, CUDA's fused dropout (memory/layer_trace.py
    ``_fused_dropout``), adapters built on the host, and ``Module.to`` on fakes."""
    import torch
    import torch.nn.functional as functional
    from transformers import masking_utils

    saved = (
        functional.scaled_dot_product_attention,
        torch.utils.swap_tensors,
        torch.nn.Linear.__init__,
        masking_utils.find_packed_sequence_indices,
    )
    functional.scaled_dot_product_attention = flash_sdpa()
    torch.utils.swap_tensors = swap_forgetting_fakes(fake_mode, saved[1])
    torch.nn.Linear.__init__ = host_built_linear(recorder, saved[2])
    masking_utils.find_packed_sequence_indices = unpacked_sequences(saved[3])
    try:
        with _fused_dropout():
            yield
    finally:
        (
            functional.scaled_dot_product_attention,
            torch.utils.swap_tensors,
            torch.nn.Linear.__init__,
            masking_utils.find_packed_sequence_indices,
        ) = saved


# --- loading as from_pretrained does --------------------------------------------------------------
def warm_up_allocator(model) -> None:
    """transformers/modeling_utils.py ``caching_allocator_warmup``, which ``from_pretrained``
    runs before loading onto a GPU: one fp16 tensor of the parameters' bytes (a tied weight
    once), freed at once, so the caching allocator reserves them in one segment. Recorded as the
    whole count; ``warmup_bytes`` gives what it takes given what the allocator holds."""
    import torch

    byte_count = sum(param.numel() * param.element_size() for param in model.parameters())
    warmup = torch.empty(byte_count // 2, dtype=torch.float16)
    del warmup


def warmup_bytes(allocator, byte_count: int, capacity: int | None = None) -> int:
    """What ``caching_allocator_warmup`` allocates for ``byte_count`` parameter bytes given what
    the allocator holds: the count less the reserved-but-unused bytes when that still exceeds
    them, else nothing (unless over 1.5 GiB more is needed: then just past the unused bytes),
    at most the GPU's ``capacity`` less 1.2 GiB."""
    unused = allocator.reserved - allocator.allocated
    if byte_count - unused > unused:
        nbytes = byte_count - unused
    elif byte_count - unused > 1.5 * 1024**3:
        nbytes = unused + 1
    else:
        nbytes = 0
    if capacity is not None:
        nbytes = max(0, min(nbytes, capacity - WARMUP_HEADROOM))
    return nbytes // 2 * 2  # torch.empty(count // 2, dtype=float16)


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


def move_host_parameters(model, recorder) -> None:
    """Parameters still on the host (peft's adapters on a base whose dtype they already have:
    ``_move_adapter_to_device_of_base_layer`` then only moves them) copied to the GPU, in the
    order peft made them."""
    import torch

    for module in model.modules():
        for attr, param in module._parameters.items():
            if param is not None and recorder.is_host(param):
                moved = torch.nn.Parameter(torch.empty_like(param), param.requires_grad)
                module._parameters[attr] = moved


# --- what the replay supports ---------------------------------------------------------------------
def replay_support(model, setup) -> str | None:
    """None when ``setup`` can be replayed, else a one-line reason (shown to the user)."""
    if setup.finetuning == "qlora":
        return "bitsandbytes' 4-bit weights cannot be faked"
    if setup.finetuning not in ("full", "lora"):
        return f"finetuning {setup.finetuning} is not replayed (full or lora are)"
    if not setup.without_deepspeed:
        return f"DeepSpeed's ZeRO-{setup.stage} engine is not replayed (stage 0 without it is)"
    if setup.world_size != 1:
        return f"a run on {setup.world_size} GPUs is not replayed (one GPU is)"
    if setup.workload != "sft":
        return f"the {setup.workload} workload is not replayed (sft is)"
    if not getattr(model, "config_json", ""):
        return f"{model.name} has no config.json to build it from"
    return _attention_support(setup) or _optimizer_support(setup)


def _attention_support(setup) -> str | None:
    """Why the setup's attention kernel is not emulated, or None."""
    if setup.attention not in ATTENTIONS:
        return f"attention {setup.attention} is not replayed ({', '.join(ATTENTIONS)} are)"
    if setup.padded:
        # SDPA then gets a 4-D mask and runs the memory-efficient kernel on CUDA
        return (
            "padded batches run SDPA's memory-efficient kernel, which is not emulated "
            "(--no-padding if your rows are packed or of equal length)"
        )
    if setup.attention != "eager" and setup.compute_precision == "fp32":
        return f"{setup.attention} in fp32 runs the memory-efficient kernel, not emulated"
    return None


def _optimizer_support(setup) -> str | None:
    """Why the setup's optimizer is not replayed (torch's AdamW, fused or foreach, is), or
    None."""
    if setup.optimizer_impl not in OPTIMIZERS:
        return f"optimizer {setup.optimizer_impl} is not replayed ({', '.join(OPTIMIZERS)} are)"
    return None


# --- the run --------------------------------------------------------------------------------------
def replay_training_run(model, setup, capacity: int | None = None, steps: int = 3):
    """Record the run (model loaded as from_pretrained would, adapters, ``steps`` training
    steps) on fake tensors at the real shape and replay it through memory/allocator.py: a
    ``ReplayedRun``. None when torch / transformers (/ peft for LoRA) are missing, the setup is
    not supported (``replay_support``) or the model cannot be built or run on fake tensors.
    ``capacity``: the GPU's bytes; the replay then reports whether the run would run out.
    Cached on disk (``cache.py``: ``allocation_replays.json``) by the versions, the config, the
    setup fields the run reads, ``capacity`` and ``steps``: a second call records nothing. A
    recording stores its run without a capacity too, and a capped call whose uncapped run fits
    with the warm-up's headroom to spare reads that one (the allocator never reaches the cap)."""
    if replay_support(model, setup) is not None:
        return None
    packages = ["torch", "transformers"] + (["peft"] if setup.finetuning == "lora" else [])
    try:
        versions = [version(name) for name in packages]
    except PackageNotFoundError:
        return None
    path = cache_file("allocation_replays.json")
    cache = read_cache(path)
    keys = {cap: _cache_key(versions, model, setup, cap, steps) for cap in (capacity, None)}
    for cap in dict.fromkeys((capacity, None)):  # the capped entry first
        entry = cache.get(keys[cap])
        if entry == UNREPLAYABLE:
            return None
        run = _cached_run(entry)
        if run is not None and (cap == capacity or _fits_uncapped(run, capacity)):
            return run
    runs = _record_and_replay(model, setup, capacity, steps)
    for cap, key in keys.items():
        store_in_cache(path, key, asdict(runs[cap]) if runs else UNREPLAYABLE)
    return runs[capacity] if runs else None


def _cache_key(versions: list[str], model, setup, capacity: int | None, steps: int) -> str:
    blob = [REPLAY_CACHE_VERSION, versions, model.config_json, replay_fields(setup)]
    return hashlib.sha256(json.dumps([*blob, capacity, steps]).encode()).hexdigest()


def _cached_run(entry) -> ReplayedRun | None:
    """The run a cache entry holds, or None (absent, or written by another version)."""
    names = {run_field.name for run_field in dataclasses.fields(ReplayedRun)}
    if isinstance(entry, dict) and set(entry) == names:
        return ReplayedRun(**entry)
    return None


def _fits_uncapped(run: ReplayedRun, capacity: int) -> bool:
    """The uncapped ``run`` is also the run on a GPU of ``capacity`` bytes: it never reserved
    more, and the warm-up (at most its allocated peak) kept whole under ``warmup_bytes``'s
    headroom."""
    return run.max_reserved <= capacity and run.max_allocated <= capacity - WARMUP_HEADROOM


def replay_fields(setup) -> dict:
    """The setup's fields a replay reads (its cache key)."""
    names = (
        "precision",
        "autocast",
        "micro_batch",
        "seq_len",
        "gradient_checkpointing",
        "attention",
        "stack",
        "finetuning",
        "lora_rank",
        "lora_targets",
        "lora_dropout",
        "grad_accum",
        "gpu",
    )
    fields = {name: getattr(setup, name) for name in names}
    return dict(fields, weight_dtype=setup.weight_dtype, optimizer=setup.optimizer_impl)


def _record_and_replay(model, setup, capacity: int | None, steps: int) -> dict | None:
    """The run recorded once and replayed with ``capacity`` and without one: {capacity: run,
    None: run}; None when it cannot be recorded."""
    began = time.perf_counter()
    try:
        events, warmup_key = record_training_run(model, setup, steps)
    except Exception:  # transformers, peft and torch raise many types for what they cannot build
        return None  # or run, KernelNotEmulated included
    runs = {}
    for cap in dict.fromkeys((None, capacity)):
        allocator = replay_events(events, warmup_key, cap)
        runs[cap] = ReplayedRun(
            max_allocated=allocator.max_allocated,
            max_reserved=allocator.max_reserved,
            out_of_memory=allocator.out_of_memory,
            steps=steps,
            seconds=round(time.perf_counter() - began, 2),
        )
    return runs


def replay_events(events: list[Event], warmup_key: int, capacity: int | None):
    """The caching allocator after ``events`` on a GPU of ``capacity`` bytes (None: unlimited),
    the loading's warm-up as ``warmup_bytes`` sizes it in a fresh process."""
    allocator = CachingAllocator(capacity=capacity)
    for kind, key, nbytes in events:
        if kind == "alloc" and key == warmup_key:
            nbytes = warmup_bytes(allocator, nbytes, capacity)
            if not nbytes:
                continue
        allocator.apply((kind, key, nbytes))
    return allocator


def cublas_bytes_per_handle(gpu: str | None) -> int | None:
    """cuBLAS's workspace per handle on ``gpu`` (memory/overheads.py), None without a CUDA GPU."""
    capability = compute_capability(gpu) if gpu else None
    if capability is None:
        return None
    if capability[0] in oh.CUBLAS_WORKSPACE_32MIB_MAJORS:
        return oh.CUBLAS_WORKSPACE_32MIB
    return oh.CUBLAS_WORKSPACE_OTHER


def record_training_run(model, setup, steps: int) -> tuple[list[Event], int]:
    """The allocator events of ``setup``'s run of ``model`` (load, adapters, ``steps`` training
    steps) and the key of the loading's allocator warm-up."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    global recordings_made
    recordings_made += 1
    cublas = cublas_bytes_per_handle(setup.gpu)
    recorder = AllocationRecorder(workspaces=cublas is not None, cublas_bytes=cublas or 0)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with quiet_libraries(), fake_mode, gpu_emulation(fake_mode, recorder):
        base = build_model(model.config_json, setup)
        with recorder.recording():
            warm_up_allocator(base)
            warmup_key = recorder.events[-1][1]
            load_in_checkpoint_order(base)
            trained = prepare_for_training(base, setup, recorder)
            step = build_training_step(trained, setup)
            for _ in range(steps):
                step()
    return recorder.events, warmup_key


@contextlib.contextmanager
def quiet_libraries():
    """While inside, what the libraries print about a run on fake tensors is kept from the
    user: transformers' config sanity warnings, deprecation warnings (gradient checkpointing's
    new name), and the fake mode's log of an op it cannot run (the run then fails and the
    replay is None)."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    transformers.logging.set_verbosity_error()
    fake_log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        fake_log.setLevel(level)


def build_model(config_json: str, setup):
    """The causal LM of ``config_json`` in the setup's weight dtype, on fake tensors (enter a
    FakeTensorMode first), in training mode. ``flash_attention_2`` runs through SDPA's flash
    kernel emulation (the flash_attn package saves the same tensors; it cannot load here)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _model_config(json.loads(config_json))
    if training_auto_class(config) is not AutoModelForCausalLM:
        raise KernelNotEmulated(f"{type(config).__name__} trains as no causal LM")
    config.use_cache = False
    config._attn_implementation = "eager" if setup.attention == "eager" else "sdpa"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    model = AutoModelForCausalLM.from_config(config, dtype=dtype[setup.weight_dtype])
    return model.train()


def peft_target_modules(targets: str):
    """``LoraConfig.target_modules`` for zerofit's ``lora_targets`` (memory/lora.py
    ``targeted_modules``): the presets, else the comma list's names."""
    if targets == "all-linear":
        return "all-linear"
    if targets == PEFT_DEFAULT:
        return None  # peft's own table by model_type
    if targets == "attention":
        return list(ATTENTION_MODULES)
    return [name.strip() for name in targets.split(",")]


def prepare_for_training(model, setup, recorder):
    """peft's adapters for LoRA (fp32: ``autocast_adapter_dtype``) and gradient checkpointing
    as TRL and peft enable it (``use_reentrant=False``; ``enable_input_require_grads`` for a
    frozen embedding)."""
    checkpointing = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    if setup.finetuning == "lora":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=setup.lora_rank,
            target_modules=peft_target_modules(setup.lora_targets),
            lora_dropout=setup.lora_dropout,
        )
        model = get_peft_model(model, config)
        move_host_parameters(model, recorder)
        if setup.gradient_checkpointing:
            model.gradient_checkpointing_enable(**checkpointing)
            model.enable_input_require_grads()
    elif setup.gradient_checkpointing:
        model.gradient_checkpointing_enable(**checkpointing)
    return model


def build_training_step(model, setup):
    """One optimizer step of the setup's stack as a function: ``grad_accum`` micro steps
    (forward and loss under autocast when ``setup.autocast``), the HF Trainer's
    ``clip_grad_norm_(1.0)`` for the hf stack, the optimizer's step and ``zero_grad``."""
    import torch

    trainable = [param for param in model.parameters() if param.requires_grad]
    if setup.optimizer_impl == "adamw_torch_fused":
        optimizer = torch.optim.AdamW(trainable, lr=1e-5, fused=True)
    else:
        optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
    vocab_size = model.config.vocab_size
    ids = torch.randint(0, vocab_size, (setup.micro_batch, setup.seq_len))
    dtype = torch.float16 if setup.precision == "fp16" else torch.bfloat16
    enabled = setup.autocast and setup.precision != "fp32"

    def step() -> None:
        for _ in range(setup.grad_accum):
            with torch.autocast(device_type=DEVICE, dtype=dtype, enabled=enabled):
                loss = model(input_ids=ids, labels=ids).loss
            if setup.grad_accum > 1:
                loss = loss / setup.grad_accum
            loss.backward()
            del loss
        if setup.stack == "hf":
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
