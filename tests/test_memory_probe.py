"""The probes' fp32 kernels for CPUs without native bf16 (tests/memory_probe.py) leave every byte
the trackers count unchanged: same peak, same storages, same output dtypes and strides."""

from __future__ import annotations

import pytest
from memory_probe import _fp32_kernels_mode, tracked_peak
from memory_shapes import TINY_DECODER


def _bf16_step(checkpointing: bool):
    """A whole training step (forward, loss, backward, foreach AdamW) of a bf16 Qwen2 with sdpa
    attention: every op of HEAVY_BF16_OPS runs in it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "qwen2", attn_implementation="sdpa", use_cache=False, **TINY_DECODER
    )
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(0, TINY_DECODER["vocab_size"], (2, 64))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # Adam's states
    return step, model, optimizer


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fp32_kernels_count_the_same_bytes_as_bf16_kernels(checkpointing):
    import torch

    step, model, optimizer = _bf16_step(checkpointing)
    native = tracked_peak(step, model, optimizer)
    seen = []

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    # the mode under the tracker, as fp32_kernels_for_emulated_bf16 enters it on an AVX2 CPU
    with _fp32_kernels_mode(), Ops():
        in_fp32 = tracked_peak(step, model, optimizer)
    assert in_fp32 == native
    assert {"aten.mm.default", "aten.addmm.default"} <= set(seen)
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in seen


def test_fp32_kernels_return_what_the_bf16_kernel_returns():
    import torch

    q, k, v = (torch.randn(2, 4, 16, 32, dtype=torch.bfloat16) for _ in range(3))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    native = flash(q, k, v)
    with _fp32_kernels_mode():
        in_fp32 = flash(q, k, v)
        product = q @ k.transpose(-1, -2)
        mixed = q.float() @ k.float().transpose(-1, -2)  # not all bf16: passed through
    for got, want in zip(in_fp32, native, strict=True):
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert product.dtype == torch.bfloat16 and mixed.dtype == torch.float32
