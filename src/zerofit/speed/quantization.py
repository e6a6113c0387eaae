"""QLoRA's 4-bit base at run time: what bitsandbytes' NF4 weights add to a training micro step.

Under ``finetuning: qlora`` the decoder's linear weights are bitsandbytes NF4 with double
quantization (memory/lora.py ``quantized_elements``: every linear layer of every decoder layer;
embeddings, norms and the LM head stay 16-bit, transformers' ``get_keys_to_not_convert``). No
matmul reads them as they are: bitsandbytes 0.50.2 dequantizes a whole weight to the compute
dtype on each use, and the matmul then runs as LoRA's does (its FLOPs are counted already). What
QLoRA adds is, per micro step (``estimate_qlora_base``):

- the dequantizations (``count_dequantizations``): nn/modules.py ``Linear4bit.forward`` ->
  autograd/_functions.py ``matmul_4bit`` -> ``MatMul4Bit.forward`` ->
  ``torch.ops.bitsandbytes.gemm_4bit``, which on CUDA (backends/cuda/ops.py, the kernel
  registered for ``bitsandbytes::gemm_4bit``) runs ``_dequant_linear_fallback`` (dequantize,
  then ``F.linear``) past ``FUSED_KERNEL_MAX_ROWS`` rows; ``MatMul4Bit.backward`` calls
  functional.py ``dequantize_4bit`` again for the input gradient ``grad @ W`` of every layer
  whose input requires grad (``req_gradA``: never the weight's own gradient, it is frozen);
  gradient checkpointing re-runs each layer's forward inside backward, one more forward
  dequantization per layer; a no-grad reference forward (DPO) one more;
- their HBM bytes (``DEQUANTIZE_BYTES_PER_BLOCK``, ``dequantize_bytes_per_element``) at the
  device's streaming bandwidth, and peft's clone of each adapted 4-bit layer's output
  (peft/tuners/lora/bnb.py ``Linear4bit.forward``: ``result = result.clone()``);
- the host time of each dequantizing call beyond a 16-bit linear's
  (``DEQUANTIZE_HOST_S_PER_CALL``), as far as the GPU's work does not hide it.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerofit.memory.estimate import TrainSetup
from zerofit.memory.lora import (
    ABSMAX_BLOCK,
    ATTENTION_INPUT_GROUP,
    FP32,
    NF4_BLOCK,
    first_layer_input_grad,
    layer_linear_shapes,
    targeted_modules,
)
from zerofit.models.resolve import ModelSpec
from zerofit.speed.device import DeviceProfile
from zerofit.speed.generation import DECODE_HBM_EFFICIENCY

# bitsandbytes' CUDA ``gemm_4bit`` (backends/cuda/ops.py) takes its fused 4-bit kernel only for
# few rows: ``_gemm_4bit_use_custom_cuda`` returns False past 512 rows for weights of 4 Mi
# elements or more, and on Hopper past 64 rows (A100: 128) for most of them; past 1536 rows
# (``_gemm_4bit_custom_max_m``) always. Above this many rows (tokens of one forward) the model
# counts a dequantization for every 4-bit forward. Small weights with a short inner dimension
# (2 K < N, under 4 Mi elements: models under ~0.3B parameters) keep the fused kernel to 512 rows
# on Hopper and 1536 on an A100, which this single threshold leaves out; the CPU's default
# kernel (backends/default/ops.py ``_gemm_4bit_default_impl``) dequantizes at every size.
FUSED_KERNEL_MAX_ROWS = 128

# HBM bytes of one dequantization, per 64-element block (``NF4_BLOCK``) beside the packed values
# and the written weight (``dequantize_bytes_per_element``), with double quantization
# (``QuantState.nested``). CUDA's forward, backends/cuda/ops.py ``_dequant_linear_fallback``:
# ``_dequantize_blockwise_impl`` reads the 8-bit absmax (1 byte) and writes it as fp32 (4),
# ``absmax_dq + absmax_offset`` reads and writes it (8), ``_dequantize_4bit_impl`` reads it (4).
# The backward's functional.py ``dequantize_4bit`` does the same: ``dequantize_blockwise`` of
# ``quant_state.absmax`` (1 + 4), ``absmax += quant_state.offset`` (8), the 4-bit kernel (4).
# ``dequantize_blockwise`` also reads one fp32 absmax per 256 blocks (``ABSMAX_BLOCK``); the
# 256-entry code and the offset are a few bytes per call.
DEQUANTIZE_BYTES_PER_BLOCK = 1 + 4 + 8 + 4 + FP32 / ABSMAX_BLOCK

# Host seconds one dequantizing call adds beyond a 16-bit linear's: in the forward,
# ``Linear4bit.forward``'s Python, ``MatMul4Bit.apply``, the custom-op dispatch of
# ``bitsandbytes::gemm_4bit`` to its Python kernel, and the fallback's two ctypes launches, its
# add and two allocations; in the backward, ``MatMul4Bit.backward`` and functional.py
# ``dequantize_4bit`` -> ``dequantize_blockwise`` (two custom ops, two launches, an in-place
# add). Its value comes from a measurement, not a fit: benchmarks/qlora_step_time.py's ``host``
# rows time a frozen ``bnb.nn.Linear4bit`` forward + backward against an ``nn.Linear`` of the same
# shape (past the fused kernel's rows, on a weight small enough that the GPU keeps up with the
# host) and halve the difference. Until a lent GPU's rows are in, the value is that measurement
# through the same Python path on this project's 2-core CPU host (``--device cpu``: 8 rows of a
# 64 x 64 weight, the CPU's default kernel; 42-43 us per call in three runs, forward and backward
# alike), which leaves out CUDA's launch of the fallback's three kernels.
DEQUANTIZE_HOST_S_PER_CALL = 0.000043


@dataclass(frozen=True)
class Dequantizations:
    """One micro step's dequantizations: calls, and the weight elements they write."""

    calls: int
    elements: int


def dequantize_bytes_per_element(element_bytes: int) -> float:
    """HBM bytes one dequantization moves per weight element: the packed NF4 value read (half a
    byte), the weight written in the compute dtype (``element_bytes``; the matmul's own read of
    it is LoRA's too), and the absmax chain per 64-element block (``DEQUANTIZE_BYTES_PER_BLOCK``).
    bf16: 0.5 + 2 + 17.02 / 64 = 2.77 bytes."""
    return 0.5 + element_bytes + DEQUANTIZE_BYTES_PER_BLOCK / NF4_BLOCK


def forward_dequantizes(rows: int) -> bool:
    """A 4-bit forward over ``rows`` tokens dequantizes its weight (``FUSED_KERNEL_MAX_ROWS``)."""
    return rows > FUSED_KERNEL_MAX_ROWS


def layer_targets(model: ModelSpec, setup: TrainSetup) -> set[str]:
    """The decoder layer's linear layers that carry adapters (a fused q/k/v name targets all
    three)."""
    names = set(targeted_modules(model, setup.lora_targets))
    if "qkv_proj" in names:
        names |= {"q_proj", "k_proj", "v_proj"}
    return names & set(layer_linear_shapes(model))


def input_grad_linears(
    model: ModelSpec, setup: TrainSetup, grad_enters: bool
) -> tuple[set[str], bool]:
    """(the layer's linear layers whose input requires grad, whether the layer's output does),
    for one decoder layer whose input requires grad or not (``grad_enters``).

    ``MatMul4Bit.backward`` dequantizes only for ``req_gradA``; autograd asks for an input's
    gradient where a trainable parameter lies upstream of it. In a layer the attention group
    (q/k/v) reads the normalised input; o_proj reads the attention, which requires grad when a
    q/k/v adapter does; the MLP's gate/up (or an MoE router) read the normalised residual;
    down_proj reads ``act(gate) * up``. An adapter's output joins its layer's, so a targeted
    layer's output requires grad whatever its input."""
    linears = set(layer_linear_shapes(model))
    targets = layer_targets(model, setup)
    attention_inputs = {name for name in ATTENTION_INPUT_GROUP if name in linears}
    mlp_inputs = linears - attention_inputs - {"o_proj", "down_proj"}
    needing: set[str] = set()
    if grad_enters:
        needing |= attention_inputs
    attention_out = grad_enters or bool(targets & attention_inputs)
    if attention_out and "o_proj" in linears:
        needing.add("o_proj")
    mlp_in = attention_out or "o_proj" in targets
    if mlp_in:
        needing |= mlp_inputs
    down_in = mlp_in or bool(targets & mlp_inputs)
    if down_in and "down_proj" in linears:
        needing.add("down_proj")
    return needing, down_in or "down_proj" in targets


def count_dequantizations(setup: TrainSetup, model: ModelSpec, sequences: int) -> Dequantizations:
    """The dequantizations of one QLoRA micro step of ``sequences`` trained sequences (nothing
    for lora or a full fine-tune), layer by layer:

    - forward: each 4-bit linear layer once, when the fused kernel is not taken
      (``forward_dequantizes``); checkpointing's recompute once more; DPO's reference forward
      (the adapter-disabled policy, on chosen and rejected) once more;
    - backward: each 4-bit layer whose input requires grad (``input_grad_linears``). The first
      layer's input requires grad under checkpointing (``enable_input_require_grads``) or a
      targeted embedding (memory/lora.py ``first_layer_input_grad``); otherwise grad enters the
      residual at the first adapter, so the first layer's q/k/v (all-linear) skip it."""
    if setup.finetuning != "qlora":
        return Dequantizations(0, 0)
    shapes = layer_linear_shapes(model)
    sizes = {name: fan_in * fan_out for name, (fan_in, fan_out) in shapes.items()}
    layer_elements = sum(sizes.values())
    forward_passes = 0
    if forward_dequantizes(sequences * setup.seq_len):
        forward_passes += 2 if setup.gradient_checkpointing else 1
    reference = setup.workload == "dpo" and setup.uses_reference
    if reference and forward_dequantizes(2 * setup.micro_batch * setup.seq_len):
        forward_passes += 1
    calls = forward_passes * len(shapes) * model.num_layers
    elements = forward_passes * layer_elements * model.num_layers
    grad_enters = first_layer_input_grad(setup)
    for _ in range(model.num_layers):
        needing, grad_enters = input_grad_linears(model, setup, grad_enters)
        calls += len(needing)
        elements += sum(sizes[name] for name in needing)
    return Dequantizations(calls, elements)


def clone_bytes_per_token(model: ModelSpec, setup: TrainSetup, element_bytes: int) -> int:
    """peft's QLoRA layer clones its base output before adding the adapter's (``result =
    result.clone()``, "defensively" for 4-bit): per token and forward pass, each adapted 4-bit
    layer's output read and written. LoRA's ``Linear.forward`` adds in place of no copy."""
    if setup.finetuning != "qlora":
        return 0
    shapes = layer_linear_shapes(model)
    outputs = sum(shapes[name][1] for name in layer_targets(model, setup))
    return 2 * element_bytes * outputs * model.num_layers


@dataclass(frozen=True)
class QloraBaseSeconds:
    """One micro step's 4-bit base work: GPU seconds (HBM-bound) and host seconds."""

    gpu_s: float
    host_s: float


def estimate_qlora_base(
    setup: TrainSetup,
    model: ModelSpec,
    device: DeviceProfile,
    sequences: int,
    element_bytes: int,
) -> QloraBaseSeconds:
    """GPU and host seconds one micro step's 4-bit base adds (zero for lora and full): the
    dequantizations' bytes (``dequantize_bytes_per_element`` each element written) and peft's
    clones over the device's memory bandwidth at the streaming share the adapters' elementwise
    work uses (step_time.py ``adapter_elementwise_seconds``), and the device's host seconds
    per dequantization (``DeviceProfile.dequantize_host_s_per_call``). ``element_bytes``: the
    compute dtype's size on the device."""
    if setup.finetuning != "qlora":
        return QloraBaseSeconds(0.0, 0.0)
    counted = count_dequantizations(setup, model, sequences)
    hbm_bytes = counted.elements * dequantize_bytes_per_element(element_bytes)
    passes = 2 if setup.gradient_checkpointing else 1
    tokens = sequences * setup.seq_len
    hbm_bytes += passes * tokens * clone_bytes_per_token(model, setup, element_bytes)
    gpu_s = hbm_bytes / (device.memory_gbps * 1e9 * DECODE_HBM_EFFICIENCY)
    return QloraBaseSeconds(gpu_s, counted.calls * device.dequantize_host_s_per_call)


def exposed_qlora_host_seconds(host_s: float, other_host_s: float, gpu_s: float) -> float:
    """What ``host_s`` of dequantizing calls adds to a micro step whose GPU work takes ``gpu_s``
    and whose host already spends ``other_host_s`` on the rest of it (the fixed cost per micro
    step: Python, the layers' launches, the data loader; DeepSpeed's hooks; checkpointing's
    dispatch). The calls are issued between the layers' launches while the GPU works through
    its queue, so the GPU hides them only with the time its work takes beyond the host's other
    work: a small model, whose micro step is host-bound already (step_time.py
    ``MICRO_STEP_OVERHEAD_S``: 0.06-0.13 s of host time for 0.01-0.02 s of GPU work at 0.5B),
    pays every call; a large one hides them."""
    hiding_s = max(0.0, gpu_s - other_host_s)
    return max(0.0, host_s - hiding_s)
