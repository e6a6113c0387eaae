"""Measure what real torch code allocates on CPU, with torch's own MemTracker
(``torch/distributed/_tools/mem_tracker.py``: a TorchDispatchMode that follows every storage
created and freed). Memory of these ops is device-independent, so the bytes check the estimator's
terms without a GPU."""

from __future__ import annotations

import os

CPU = "cpu"


def tracked_peak(fn, *external) -> tuple[int, int, dict]:
    """Run ``fn`` under MemTracker; return (peak total bytes, bytes alive after, peak by kind).
    ``external``: modules, optimizers and tensors that exist before ``fn`` (counted from the start).
    """
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*external)
    with fp32_kernels_for_emulated_bf16(), tracker:
        fn()
    dev = torch.device(CPU)
    peak = tracker.get_tracker_snapshot("peak")[dev]
    now = tracker.get_tracker_snapshot("current")[dev]
    return peak["Total"], now["Total"], {str(k).split(".")[-1]: v for k, v in peak.items()}


def make_optimizer_states(model, optimizer) -> None:
    """Create ``optimizer``'s states (Adam's exp_avg / exp_avg_sq) before a measured step: an
    optimizer step on zero gradients makes the same states as a whole training step, without a
    forward and backward nobody measures."""
    import torch

    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def saved_tensor_bytes(model, run) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` executes,
    ``model``'s weights excluded (each storage once, however many views of it are saved)."""
    from torch.autograd.graph import saved_tensors_hooks

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(saved.values())


# The CPU kernels that dominate a probe's time. Where the CPU has no native bf16 (AVX2 only, no
# AVX512-BF16 or AMX), torch computes bf16 matmuls without oneDNN, ~200 times slower than on a CPU
# that has it (a 2048x256x1408 mm: 3 ms native, 600-1150 ms emulated, 33 ms in fp32), and a
# whole-step probe takes minutes instead of seconds.
HEAVY_BF16_OPS = (
    "mm.default",
    "addmm.default",
    "bmm.default",
    "baddbmm.default",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_flash_attention_for_cpu_backward.default",
)


def bf16_matmul_is_emulated() -> bool:
    """True when a bf16 matmul on this CPU is slower than the same matmul in fp32, i.e. the CPU
    has no native bf16 and torch emulates it (measured once: a few milliseconds).
    ZEROFIT_FP32_KERNELS=1 / 0 says it instead (to compare both paths on one machine)."""
    global _EMULATED
    forced = os.environ.get("ZEROFIT_FP32_KERNELS")
    if forced in ("0", "1"):
        return forced == "1"
    if _EMULATED is None:
        import time

        import torch

        def seconds(dtype) -> float:
            left, right = torch.ones(256, 512, dtype=dtype), torch.ones(512, 512, dtype=dtype)
            left @ right  # the first call pays for kernel selection
            start = time.perf_counter()
            for _ in range(3):
                left @ right
            return time.perf_counter() - start

        _EMULATED = seconds(torch.bfloat16) > 2 * seconds(torch.float32)
    return _EMULATED


_EMULATED: bool | None = None


def fp32_kernels_for_emulated_bf16():
    """A TorchDispatchMode, to enter *outside* the byte tracker, that runs HEAVY_BF16_OPS on
    all-bf16 inputs in fp32 and rounds each result to the dtype the bf16 kernel returns, where
    bf16 is emulated (bf16_matmul_is_emulated); a context that does nothing elsewhere.

    The bytes a tracker above it counts do not change: it sees the op's outputs only, with the
    shapes, dtypes and strides of the bf16 kernel's, and the fp32 copies live and die inside the
    op, as the fp32 scratch of the CPU's bf16 kernel does (which no tracker sees either)."""
    import contextlib

    if not bf16_matmul_is_emulated():
        return contextlib.nullcontext()
    return _fp32_kernels_mode()


def _fp32_kernels_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    heavy = {getattr(torch.ops.aten, name.split(".")[0]).default for name in HEAVY_BF16_OPS}

    def is_float(value) -> bool:
        return isinstance(value, torch.Tensor) and value.is_floating_point()

    def is_plain_cpu(value) -> bool:
        """A real CPU tensor: fake, meta and subclass tensors (a FakeTensorMode trace) are left
        to their own kernels."""
        is_plain = type(value) in (torch.Tensor, torch.nn.Parameter)
        return is_plain and value.device.type == "cpu"

    def to_meta(value):
        return value.to("meta") if isinstance(value, torch.Tensor) else value

    def to_fp32(value):
        return value.float() if is_float(value) else value

    class Fp32Kernels(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.out_dtypes: dict = {}  # op -> the dtype of each output, on bf16 inputs

        def bf16_out_dtypes(self, func, args, kwargs) -> list:
            if func not in self.out_dtypes:
                outs = func(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))
                tensors = [o for o in tree_flatten(outs)[0] if isinstance(o, torch.Tensor)]
                self.out_dtypes[func] = [o.dtype for o in tensors]
            return self.out_dtypes[func]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            floats = [t for t in tree_flatten((args, kwargs))[0] if is_float(t)]
            upcast = (
                func in heavy
                and floats
                and all(t.dtype == torch.bfloat16 and is_plain_cpu(t) for t in floats)
            )
            if not upcast:
                return func(*args, **kwargs)
            dtypes = iter(self.bf16_out_dtypes(func, args, kwargs))
            result = func(*tree_map(to_fp32, args), **tree_map(to_fp32, kwargs))

            def to_bf16_dtype(value):
                return value.to(next(dtypes)) if isinstance(value, torch.Tensor) else value

            return tree_map(to_bf16_dtype, result)

    return Fp32Kernels()
