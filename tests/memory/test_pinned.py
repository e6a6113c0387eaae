"""Pinned host buffers of DeepSpeed's CPU offload (memory/pinned.py).

Pinned memory needs a CUDA device, so the rounding itself cannot run here: these tests read the
installed torch's caching host allocator and DeepSpeed's pin sites, run DeepSpeed's own sub-group
split, and check the host-RAM arithmetic built on them. One test (marked ``gpu``, left out of the
default run) measures the rounding with torch's own host-allocator statistics on a CUDA machine.

Run: .venv/bin/python -m pytest tests/memory/test_pinned.py -q   (~5 s)
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from memory_shapes import QWEN25_7B

from zerofit.memory import pinned
from zerofit.memory import states as st
from zerofit.memory.ds_config import read_ds_config
from zerofit.memory.estimate import TrainSetup
from zerofit.models.resolve import resolve_model

GIB = 1024**3


def test_pinned_bytes_is_the_next_power_of_two():
    assert pinned.pinned_bytes(0) == 0
    assert pinned.pinned_bytes(1) == 1
    assert pinned.pinned_bytes(GIB) == GIB
    assert pinned.pinned_bytes(GIB + 1) == 2 * GIB
    assert pinned.pinned_bytes(3 * GIB) == 4 * GIB


def test_torch_pinned_allocator_rounds_every_request_to_a_power_of_two():
    """ATen/core/CachingHostAllocator.h of the installed torch: ``allocate`` rounds with
    ``PowerOf2Ceil`` up to ``pinned_max_round_threshold``, whose default is unlimited."""
    torch = pytest.importorskip("torch")
    include = Path(torch.__file__).parent / "include"
    allocator = (include / "ATen/core/CachingHostAllocator.h").read_text()
    rounding = allocator[allocator.index("pinned_max_round_threshold() &&") :][:300]
    assert "PowerOf2Ceil(size)" in rounding
    config = (include / "c10/core/AllocatorConfig.h").read_text()
    assert re.search(r"pinned_max_round_threshold_\{std::numeric_limits<size_t>::max\(\)\}", config)


@pytest.mark.gpu
def test_pinned_blocks_are_reserved_at_a_power_of_two_on_a_gpu():
    """On a CUDA machine (``pytest -m gpu``): the caching host allocator's own statistics grow by
    the power of two of each fresh pinned request, and keep it after the tensor is freed."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: pinned memory is CUDA's")
    key = "allocated_bytes.current"
    # odd sizes far above anything cached by earlier tests: each request makes a new block
    sizes = [(1 << 27) + 1, (3 << 26) + 12_345, (5 << 25) + 7]
    before = torch.cuda.host_memory_stats()[key]
    tensors = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
    grown = torch.cuda.host_memory_stats()[key] - before
    assert grown == sum(pinned.pinned_bytes(n) for n in sizes)
    del tensors
    assert torch.cuda.host_memory_stats()[key] - before == grown  # freed blocks stay cached


def test_deepspeed_pins_the_offload_buffers_zerofit_counts():
    """The pin sites memory/pinned.py names, in the installed DeepSpeed, and the default that
    turns them on when an offload block leaves ``pin_memory`` out."""
    pytest.importorskip("deepspeed")
    from deepspeed.accelerator import abstract_accelerator
    from deepspeed.runtime.zero import offload_config, partition_parameters, stage3, stage_1_and_2

    pin = inspect.getsource(abstract_accelerator.DeepSpeedAccelerator._torch_pin_memory)
    assert "tensor.pin_memory()" in pin
    zero12 = inspect.getsource(stage_1_and_2)
    for buffer in ("weights_partition", "temp_buffer_bit16", "temp_grad_buffer_for_cpu_offload"):
        assert re.search(rf"pin_memory\(\s*(self\.)?{buffer}\b", zero12), buffer
    assert "single_grad_partition) if self.cpu_offload_pin_memory" in zero12
    zero3 = inspect.getsource(stage3)
    assert "get_accelerator().pin_memory(self.grad_partitions_flat_buffer)" in zero3
    assert "get_accelerator().pin_memory(subgroup_gradient_buffer)" in zero3
    assert "param_groups_fp16_flat_cpu_memory.append(get_accelerator().pin_memory(" in zero3
    init = inspect.getsource(partition_parameters)
    assert "partitioned_tensor = get_accelerator().pin_memory(partitioned_tensor)" in init
    assert offload_config.DeepSpeedZeroOffloadOptimizerConfig().pin_memory is True
    assert offload_config.DeepSpeedZeroOffloadParamConfig().pin_memory is True


@pytest.mark.parametrize("sub_group_size", [10, 25, 1000])
def test_sub_groups_split_like_deepspeed(sub_group_size):
    """DeepSpeed's own ``_create_fp16_sub_groups`` on stand-in parameters gives the same sizes."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    numels = [7, 3, 12, 9, 1, 20, 4, 4, 15]
    params = [SimpleNamespace(partition_numel=lambda n=n: n) for n in numels]
    owner = SimpleNamespace(sub_group_size=sub_group_size)
    groups = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(owner, params)
    expected = [sum(p.partition_numel() for p in group) for group in groups]
    assert pinned.zero3_sub_groups(numels, sub_group_size) == expected


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen3-30b-a3b", "llama-3.1-8b"])
def test_weight_matrices_are_nearly_all_parameters(name):
    """The large weights listed (embedding, projections, MLP or experts, untied head) hold all
    but the norms and biases: within 0.1 % of the exact parameter count."""
    model = resolve_model(name)
    assert sum(pinned.weight_matrix_sizes(model)) == pytest.approx(model.params, rel=1e-3)


def test_unpinned_offload_keeps_the_plain_byte_counts():
    """pin_memory off: fp32 master + two Adam moments + fp32 grads + the bit16 buffer (18 B per
    parameter of the shard) and, ZeRO-1/2, the largest parameter's bit16 staging buffer."""
    model, b = QWEN25_7B, 2
    for stage in (2, 3):
        setup = TrainSetup(
            stage=stage,
            world_size=8,
            gpus_per_node=8,
            offload_optimizer="cpu",
            pin_optimizer_offload=False,
        )
        shard = math.ceil(model.params / 8)
        staging = st.largest_param(model) * b if stage == 2 else 0
        assert st.cpu_bytes_per_rank(model, setup, b, {}) == shard * 18 + staging


def test_pinned_offload_holds_each_buffer_at_its_power_of_two():
    """ZeRO-2, 8 ranks of Qwen2.5-7B: the shard's fp32 buffers (3.81 GB) pin 4 GiB each and the
    bf16 one (1.90 GB) 2 GiB; Adam's moments are not pinned."""
    model, b = QWEN25_7B, 2
    setup = TrainSetup(stage=2, world_size=8, gpus_per_node=8, offload_optimizer="cpu")
    shard = math.ceil(model.params / 8)
    head = model.vocab_size * model.hidden_size * b
    expected = 4 * GIB + 2 * GIB + 4 * GIB + pinned.pinned_bytes(head) + shard * 8
    assert st.cpu_bytes_per_rank(model, setup, b, {}) == expected


def test_zero3_param_offload_keeps_every_parameters_first_pinned_block():
    """One GPU of Qwen2.5-32B with its parameters on the CPU: each of the 192 MLP weights
    (27648 x 5120 bf16, 283 MB) was first pinned on its own in a 512 MiB block, and those blocks
    stay in PyTorch's pinned cache next to the flat buffer that replaces them."""
    model = resolve_model("qwen2.5-32b")
    setup = TrainSetup(stage=3, world_size=1, offload_optimizer="cpu", offload_param="cpu")
    held = pinned.zero3_param_offload_host_bytes(model, setup, 2, model.params)
    mlp_blocks = 3 * model.num_layers * 512 * 1024**2
    assert held > mlp_blocks + model.params * 2
    # unpinned, the per-parameter copies are plain memory, freed once moved; the flat buffer
    # is pinned anyway (stage3.py: _create_param_groups_fp16_flat_cpu_memory calls
    # get_accelerator().pin_memory whatever pin_memory says), at its power of two
    unpinned = TrainSetup(stage=3, world_size=1, offload_param="cpu", pin_param_offload=False)
    assert pinned.zero3_param_offload_host_bytes(model, unpinned, 2, model.params) == (
        pinned.pinned_bytes(model.params * 2)
    )


def test_ds_config_pin_memory_is_read_and_defaults_on():
    offload = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    offload["offload_param"] = {"device": "cpu"}
    read = read_ds_config({"zero_optimization": offload}, 4096)
    assert read["pin_optimizer_offload"] is False
    assert read["pin_param_offload"] is True
