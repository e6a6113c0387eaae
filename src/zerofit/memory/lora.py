"""LoRA and QLoRA: what PEFT adapters on a frozen (or bitsandbytes 4-bit) base hold per GPU.

Pure arithmetic in bytes, no torch import. Sources, at the pinned versions (peft 0.21.2,
bitsandbytes 0.50.2, transformers 5.23, trl 1.16, deepspeed 0.19):

- Adapters: ``peft/tuners/lora/layer.py`` ``LoraLayer.update_layer`` gives each targeted linear
  layer ``lora_A = nn.Linear(in_features, r, bias=False)`` and ``lora_B = nn.Linear(r,
  out_features, bias=False)``, and ``lora_dropout = nn.Dropout(p)`` (``nn.Identity()`` at p = 0);
  ``Linear.forward`` computes ``result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``.
- Targets: ``peft/tuners/tuners_utils.py`` ``_maybe_include_all_linear_layers`` expands
  ``"all-linear"`` to every ``nn.Linear`` (and bitsandbytes ``Linear4bit``) but the output layer
  (``model.get_output_embeddings()``); ``check_target_module_exists`` matches a name when the
  module's full name equals it or ends with ``"." + name``.
- 4-bit base: transformers' ``integrations/bitsandbytes.py`` replaces every ``nn.Linear`` but the
  modules ``get_keys_to_not_convert`` returns (the output embedding, tied weights) with
  ``bnb.nn.Linear4bit``; embeddings and norms are no linear layers and keep the load dtype.
  ``bitsandbytes/functional.py`` ``quantize_4bit``: the packed NF4 values (half a byte per
  element), one absmax per 64-element block; with double quantization
  (``compress_statistics=True``, ``bnb_4bit_use_double_quant``) the absmax are themselves
  quantized by ``quantize_blockwise(blocksize=256)`` to one byte each plus one fp32 absmax per
  256 of them, an fp32 offset and the 256-entry fp32 code; the NF4 code itself is 16 fp32.
"""

from __future__ import annotations

import math
import re

from zerofit.errors import ZerofitError

FINETUNING = ("full", "lora", "qlora")
MAX_LORA_RANK = 4096
# "peft-default": what peft targets when ``LoraConfig`` gets no ``target_modules`` (its table by
# model_type, ``peft_default_targets``)
PEFT_DEFAULT = "peft-default"
TARGET_PRESETS = ("all-linear", "attention", PEFT_DEFAULT)
# the decoder layer's linear layers as transformers names them (Llama, Qwen2/3, Mistral, Gemma)
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# modules outside the decoder layers a user may name (PEFT targets them when named, never through
# "all-linear": the LM head is the output layer, the embedding is no linear layer)
OUTSIDE_MODULES = ("lm_head", "embed_tokens")
FUSED_QKV_NAMES = ("c_attn", "W_pack", "query_key_value", "qkv_proj")
LAYER_ALIASES = {
    "c_proj": ("o_proj", "down_proj"),  # Qwen-1: attn.c_proj and mlp.c_proj
    "w1": ("up_proj",),
    "w2": ("gate_proj",),
    "dense": ("o_proj",),
    "dense_h_to_4h": ("up_proj",),
    "dense_4h_to_h": ("down_proj",),
}
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")

FP32 = 4
COMPUTE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # the precision's element size
NF4_BLOCK = 64  # quantize_4bit's default blocksize (BitsAndBytesConfig leaves it)
ABSMAX_BLOCK = 256  # quantize_blockwise(blocksize=256) of the absmax under double quantization
# per quantized tensor: the NF4 code (get_4bit_type: 16 fp32), the absmax code
# (create_dynamic_map: 256 fp32) and the fp32 offset (``_absmax.mean()``)
NF4_TENSOR_CONSTANTS = 16 * FP32 + 256 * FP32 + FP32


def check_lora_targets(targets: str) -> None:
    """``all-linear``, ``attention``, ``peft-default`` or a comma list of module names as PEFT
    takes them;
    ZerofitError naming ``lora_targets`` otherwise."""
    if targets in TARGET_PRESETS:
        return
    names = [name.strip() for name in targets.split(",")]
    bad = [name for name in names if not _MODULE_NAME.match(name)]
    if not names or bad:
        shown = bad[0] if bad else targets
        raise ZerofitError(
            "lora_targets",
            f"{shown!r} is not a module name",
            "use all-linear, attention, peft-default, or names such as q_proj,v_proj",
        )


def peft_default_targets(model) -> str:
    """The modules peft adapts when ``LoraConfig(target_modules=None)``, as a comma list: its
    own table by the model's ``model_type`` (``peft/utils/constants.py``:
    ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``, read by ``LoraModel.
    _prepare_adapter_config``): q_proj and v_proj for Llama, Qwen2/3, Mistral and Gemma. peft is
    imported here only, where a user asks for its default."""
    try:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    except ImportError:
        raise ZerofitError(
            "lora_targets",
            "peft-default reads peft's own table of default targets, and peft is not installed",
            "pip install peft, or name the modules (e.g. q_proj,v_proj)",
        ) from None
    names = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model.architecture)
    if not names:
        raise ZerofitError(
            "lora_targets",
            f"peft has no default targets for {model.architecture!r} (its LoraConfig then "
            "asks for target_modules)",
            "name the modules, or use all-linear",
        )
    return ",".join(names)


def is_adapter(setup) -> bool:
    """The setup trains adapters (lora or qlora) on a frozen base."""
    return getattr(setup, "finetuning", "full") != "full"


# --- what the adapters target -------------------------------------------------------------------
def layer_linear_shapes(model) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each linear layer of one decoder layer, by module name.
    A transformers 5 MoE layer holds its experts as 3-D parameters, not ``nn.Linear``: its linear
    layers are the attention projections and the router (``gate``)."""
    h, heads, kv, d = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim
    shapes = {
        "q_proj": (h, heads * d),
        "k_proj": (h, kv * d),
        "v_proj": (h, kv * d),
        "o_proj": (heads * d, h),
    }
    if getattr(model, "num_experts", 0):
        shapes["gate"] = (h, model.num_experts)
    else:
        i = model.intermediate_size
        shapes.update({"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)})
    return shapes


def targeted_modules(model, targets: str) -> dict[str, tuple[int, int]]:
    """The modules ``targets`` gives adapters, with their (in, out) features: in the decoder layers
    (every layer) and, when named, the LM head (``lm_head``: hidden -> vocab) or the input
    embedding (``embed_tokens``: PEFT's ``lora.Embedding`` has A of r x vocab, B of hidden x r).
    ZerofitError for a name this model has no layer of (PEFT stops there too:
    ``BaseTuner.inject_adapter`` raises "Target modules ... not found in the base model")."""
    layer = layer_linear_shapes(model)
    if targets == "all-linear":
        return dict(layer)
    if targets == PEFT_DEFAULT:
        targets = peft_default_targets(model)
    if targets == "attention":
        return {name: layer[name] for name in ATTENTION_MODULES}
    outside = {"lm_head": (model.hidden_size, model.vocab_size)}
    outside["embed_tokens"] = (model.vocab_size, model.hidden_size)
    # older architectures' names for the same layers (Qwen-1, Baichuan, ChatGLM, Falcon): a
    # fused q/k/v projection, and names that match a layer in attention and one in the MLP
    fused_qkv = (model.hidden_size, (model.num_heads + 2 * model.num_kv_heads) * model.head_dim)
    chosen: dict[str, tuple[int, int]] = {}
    for name in (part.strip() for part in targets.split(",")):
        short = name.rsplit(".", 1)[-1]  # PEFT matches a suffix of the module's full name
        if short in FUSED_QKV_NAMES:
            chosen["qkv_proj"] = fused_qkv
        elif short in LAYER_ALIASES and all(a in layer for a in LAYER_ALIASES[short]):
            chosen.update({alias: layer[alias] for alias in LAYER_ALIASES[short]})
        elif short in layer:
            chosen[short] = layer[short]
        elif short in outside:
            chosen[short] = outside[short]
        else:
            known = ", ".join([*layer, *outside])
            raise ZerofitError(
                "lora_targets",
                f"{name!r} is no linear layer of {model.name}",
                f"use all-linear, attention, or names among {known}",
            )
    return chosen


def _is_outside(name: str) -> bool:
    return name in OUTSIDE_MODULES


def adapter_tensor_sizes(model, rank: int, targets: str) -> list[int]:
    """Elements of every adapter tensor, A (r x in) then B (out x r) of each targeted module,
    every decoder layer (the outside modules once), then the fused experts' adapters
    (``expert_adapter_tensor_sizes``): the trainable parameters one by one, as ZeRO-3
    partitions them."""
    sizes = []
    for name, (fan_in, fan_out) in targeted_modules(model, targets).items():
        copies = 1 if _is_outside(name) else model.num_layers
        sizes += [rank * fan_in, rank * fan_out] * copies
    return sizes + expert_adapter_tensor_sizes(model, rank, targets)


# --- an MoE layer's fused experts -----------------------------------------------------------------
def check_fused_expert_dropout(model, setup) -> None:
    """peft refuses dropout on a fused expert parameter (``peft/tuners/lora/layer.py``:
    ``ParamWrapper.__init__`` raises "does not work with lora_dropout != 0"): a LoRA run whose
    adapters reach an MoE model's experts must set no dropout. ZerofitError naming
    ``lora_dropout`` otherwise."""
    if is_adapter(setup) and setup.lora_dropout > 0 and adapts_fused_experts(
        model, setup.lora_targets
    ):
        raise ZerofitError(
            "lora_dropout",
            f"peft adapts {model.name}'s fused experts as parameters, which take no dropout "
            f"(peft's ParamWrapper refuses {setup.lora_dropout})",
            "use --lora-dropout 0, or name the attention's layers in --lora-targets",
        )


def adapts_fused_experts(model, targets: str) -> bool:
    """The adapters reach an MoE model's experts. transformers 5 keeps a layer's experts as two
    3D parameters (``Qwen3MoeExperts``: ``gate_up_proj`` E x 2I x H, ``down_proj`` E x H x I),
    no ``nn.Linear``; peft resolves ``all-linear`` against the experts' former per-expert
    gate/up/down layers and turns them into ``target_parameters``
    (``peft/utils/transformers_weight_conversion.py``: ``_convert_peft_config_moe``, for Mixtral,
    Qwen2/3-MoE, DeepSeek-V2/V3, OLMoE, GLM-4-MoE and the others it maps). Named targets are
    the attention's and the router's layers here, which leave the experts frozen."""
    return model.num_experts > 0 and targets == "all-linear"


def expert_adapter_tensor_sizes(model, rank: int, targets: str) -> list[int]:
    """Elements of the fused experts' adapters, every layer: peft's ``ParamWrapper`` gives a 3D
    parameter of E experts A (rank * E x in) and B (out x rank * E)
    (``peft/tuners/lora/layer.py``: ``ParamWrapper.update_layer``), and gives ``gate_up_proj``
    twice the rank, one r per fused projection (``_convert_peft_config_moe``'s
    ``rank_pattern``). Every layer is counted as an MoE layer (DeepSeek's first dense layers are
    not told apart: on the safe side)."""
    if not adapts_fused_experts(model, targets):
        return []
    experts, inter, hidden = model.num_experts, model.moe_intermediate_size, model.hidden_size
    gate_up_rank = 2 * rank
    per_layer = [
        gate_up_rank * experts * hidden,
        2 * inter * gate_up_rank * experts,
        rank * experts * inter,
        hidden * rank * experts,
    ]
    return per_layer * model.num_layers


def fused_expert_weight_bytes(model, setup, weight_bytes: int) -> int:
    """One layer's experts as LoRA runs them: peft folds the adapters into the whole 3D weights
    on every forward (``ParamWrapper._activate_lora``: ``_LoraFactorsProxy.forward`` is
    ``torch.baddbmm(W, B, A)``, in W's dtype, cached for the layer's forward), and the experts'
    grouped matmuls keep both folded weights (gate_up_proj and down_proj) for the input's
    gradient. 0 unless the experts are adapted."""
    if not adapts_fused_experts(model, setup.lora_targets):
        return 0
    experts, inter, hidden = model.num_experts, model.moe_intermediate_size, model.hidden_size
    return 3 * experts * inter * hidden * weight_bytes


def fused_expert_gradient_bytes(model, setup, weight_bytes: int) -> int:
    """What a layer's backward adds beyond its saved folded weights: each folded weight's
    gradient, whole, on the way to A and B. down_proj's (E x H x I) comes first, with every
    weight still saved; gate_up_proj's (twice that) after down_proj's folded weight was freed
    with its matmul's backward: E x H x I either way (checked against the allocation replay of
    a real peft + transformers run, tests/memory/test_lora.py)."""
    if not adapts_fused_experts(model, setup.lora_targets):
        return 0
    return model.num_experts * model.moe_intermediate_size * model.hidden_size * weight_bytes


def adapter_params(model, rank: int, targets: str) -> int:
    """Trainable parameters: r x (in + out) per targeted module, every decoder layer, and the
    fused experts' adapters (``adapter_tensor_sizes``)."""
    return sum(adapter_tensor_sizes(model, rank, targets))


def count_trainable_params(model, setup) -> int | None:
    """The parameters the optimizer steps, for the speed model's ``trainable_params``: the
    adapters' under lora / qlora, None (every weight) for a full fine-tune."""
    if not is_adapter(setup):
        return None
    return adapter_params(model, setup.lora_rank, setup.lora_targets)


def largest_adapter_tensor(model, rank: int, targets: str) -> int:
    """Elements of the biggest single A or B matrix (a for-loop optimizer's temporaries)."""
    return max(adapter_tensor_sizes(model, rank, targets))


# --- the frozen base ----------------------------------------------------------------------------
def quantized_elements(model) -> tuple[int, int]:
    """(elements, tensors) bitsandbytes quantizes: every linear weight of every decoder layer
    (the LM head stays in 16-bit: ``get_keys_to_not_convert``)."""
    shapes = layer_linear_shapes(model).values()
    per_layer = sum(fan_in * fan_out for fan_in, fan_out in shapes)
    return per_layer * model.num_layers, len(shapes) * model.num_layers


def nf4_bytes(elements: int, tensors: int) -> int:
    """Bytes of ``elements`` weights in NF4 with double quantization, over ``tensors`` tensors
    (``functional.quantize_4bit``): packed values, one 8-bit absmax per 64-element block, one fp32
    absmax per 256 blocks, and each tensor's codes and offset. Per tensor the counts round up;
    summed over many tensors the rounding is within a few bytes per tensor."""
    return math.ceil(elements / 2) + nf4_state_bytes(elements, tensors)


def nf4_state_bytes(elements: int, tensors: int) -> int:
    """The quantization state beside the packed values (``nf4_bytes`` less them): the 8-bit
    absmax per 64-element block, the fp32 absmax per 256 blocks, each tensor's codes and offset.
    bitsandbytes keeps it in ``Params4bit.quant_state`` (``QuantState.absmax``, ``.state2``),
    tensors of their own outside the parameter's storage."""
    blocks = math.ceil(elements / NF4_BLOCK)
    return blocks + math.ceil(blocks / ABSMAX_BLOCK) * FP32 + tensors * NF4_TENSOR_CONSTANTS


def nf4_tensor_bytes(elements: int) -> int:
    """One weight of ``elements`` in NF4 with double quantization, exactly as quantize_4bit
    stores it (``nf4_bytes`` of one tensor)."""
    return nf4_bytes(elements, 1)


def frozen_base_bytes(model, setup, element_bytes: int) -> int:
    """The frozen base on one GPU. lora: every weight in ``element_bytes``; qlora: the decoder's
    linear weights in NF4 and the rest (embeddings, norms, LM head, biases) in ``element_bytes``.

    ZeRO-1/2 partition only what the optimizer holds (``stage_1_and_2.py``: ``bit16_groups`` are
    built from the optimizer's param groups, which the HF Trainer fills with ``requires_grad``
    parameters only), so the frozen base stays a full replica on every GPU. ZeRO-3's
    ``zero.Init`` partitions every parameter when the model is built; 4-bit weights are
    partitioned only when they are stored in the compute dtype (``bnb_4bit_quant_storage``
    bfloat16: Params4bit is then a floating tensor that DeepSpeed shards; with the default uint8
    storage it is left whole on every rank, see peft's ``docs/source/accelerate/deepspeed.md``,
    "ZeRO-3 and QLoRA"). Offloaded parameters (``offload_param``) leave nothing on the GPU.
    DeepSpeed 0.19's ``Init(module=...)`` does give a uint8 ``Params4bit`` a partition of its
    own (``_convert_to_zero_parameters`` filters no dtype; probed on one rank,
    tests/memory/test_lora.py); whether ranks then gather it right is what the uint8 rule of
    ``zerofit check`` warns about, so the GPU side keeps it whole, the safe side.

    ZeRO-3 partitions a parameter's ``data`` only (``partition_parameters.py``:
    ``_partition_param`` copies a slice of it to ``param.ds_tensor``, ``free_param`` empties
    ``param.data``), so a 4-bit weight's quantization state, which bitsandbytes keeps in
    ``Params4bit.quant_state`` outside the parameter (``nf4_state_bytes``), stays whole on every
    rank, whether parameters are offloaded or not."""
    params = model.params
    if setup.finetuning == "qlora":
        quantized, tensors = quantized_elements(model)
        quantized = min(quantized, params)
        state = nf4_state_bytes(quantized, tensors)
        partitioned = math.ceil(quantized / 2) + (params - quantized) * element_bytes
        shardable = setup.quant_storage == "compute"
        if shardable:
            # the packed weights in the compute dtype, as DeepSpeed partitions them
            partitioned = zero3_parameter_model(model, setup, element_bytes).params * element_bytes
    else:
        state, partitioned, shardable = 0, params * element_bytes, True
    if setup.stage == 3 and shardable:
        if setup.offload_param != "none":
            return state
        return math.ceil(partitioned / setup.world_size) + state
    return partitioned + state


def packed_elements(elements: int, storage_bytes: int) -> int:
    """Elements of the tensor one 4-bit weight of ``elements`` values is packed into, in a storage
    dtype of ``storage_bytes`` (``bnb_4bit_quant_storage``): two 4-bit values per byte
    (``bitsandbytes/backends/cuda/ops.py`` ``quantize_4bit``: ``torch.empty(((n + 1) //
    (quant_storage.itemsize * 2), 1), dtype=quant_storage)``; the default (CPU) kernel packs the
    bytes and ``view``s them as ``quant_storage``). In bf16 storage a weight of n values is a
    parameter of n / 4 elements: what ``Params4bit.numel()`` and DeepSpeed's ``ds_numel`` are."""
    return (elements + 1) // (2 * storage_bytes)


def packed_linear_elements(model, storage_bytes: int) -> int:
    """Every ``Linear4bit`` weight of the model at its packed element count (``packed_elements``
    per tensor, each rounded as the kernel rounds it)."""
    shapes = layer_linear_shapes(model).values()
    per_layer = sum(packed_elements(fan_in * fan_out, storage_bytes) for fan_in, fan_out in shapes)
    return per_layer * model.num_layers


def zero3_parameter_model(model, setup, element_bytes: int):
    """``model`` with the parameter counts DeepSpeed ZeRO-3 partitions, gathers and offloads.

    lora / full: the model itself. qlora: transformers loads a quantized model outside
    ``zero.Init`` (``modeling_utils.py`` ``PreTrainedModel.get_init_context``: ``if not
    is_quantized``), and ``deepspeed.initialize`` converts its parameters as they are
    (``parameter_offload.py`` ``DeepSpeedZeRoOffload._convert_to_zero_parameters`` ->
    ``Init(module=...)``). Each ``Linear4bit`` weight is then a ``Params4bit`` of packed
    elements (``packed_elements``, ``nn/modules.py`` ``Params4bit._quantize``), which is all
    DeepSpeed sees of it (``partition_parameters.py`` ``_partition_param`` slices
    ``param.contiguous().view(-1)``; ``ds_numel`` is its ``numel()``); embeddings, norms, biases
    and the LM head keep the load dtype at their full count. The copy's ``params`` is that
    total, and its ``head_dim`` (and, dense, ``intermediate_size``) are shrunk by the packing
    factor, so that the per-weight lists ``pinned.weight_matrix_sizes`` and
    ``param_layout`` derive from the shape hold packed sizes (rounded down where a dimension
    does not divide). A MoE's experts are 3-D parameters, no ``nn.Linear``: bitsandbytes leaves
    them in 16-bit, and so does this copy. Used for ZeRO-3's arithmetic only, never for
    activations."""
    import dataclasses

    if setup.finetuning != "qlora":
        return model
    quantized, _ = quantized_elements(model)
    if quantized > model.params:
        return model  # a shape these formulas do not describe
    factor = 2 * element_bytes
    params = model.params - quantized + packed_linear_elements(model, element_bytes)
    shrunk = {"head_dim": max(1, model.head_dim // factor)}
    if not getattr(model, "num_experts", 0):
        shrunk["intermediate_size"] = max(1, model.intermediate_size // factor)
    active = params if model.active_params == model.params else model.active_params
    return dataclasses.replace(model, params=params, active_params=active, **shrunk)


def zero3_live_param_bytes(model, setup, element_bytes: int, buckets: dict) -> int:
    """ZeRO-3's gathered parameters with adapters: ``states.stage3_live_params`` counted on the
    parameters DeepSpeed really holds, the adapters with their layer's base weights
    (``lora_A`` / ``lora_B`` are modules of the layer, gathered when it runs; offloaded, their
    gathered copies are on the GPU beside their CPU partition).

    With a 4-bit base (``zero3_parameter_model``) a gathered ``Linear4bit`` weight is its packed
    elements in the compute dtype, a quarter of its 16-bit size in bf16 (its quantization state
    is never partitioned, ``frozen_base_bytes``); the LM head and the embedding are no
    ``Linear4bit`` (transformers' ``get_keys_to_not_convert``) and are gathered whole. The
    prefetch bucket, ``stage3_max_live_parameters`` and ``stage3_max_reuse_distance`` count
    elements, ``param.ds_numel`` (``partitioned_param_coordinator.py`` ``fetch_sub_module``:
    ``numel_prefetching += param.ds_numel``), so a bucket of packed weights holds four times
    the 16-bit weights. Measured on one H100 (a 0.49B Llama shape, one rank, parameters
    offloaded, benchmarks/gpu_qlora_offload.py): 451,874,816 bytes gathered at the end of forward,
    this function's figure.

    With the default uint8 storage the memory model keeps every 4-bit weight whole on each GPU
    (``frozen_base_bytes``: what zerofit check and peft's guide warn about): only the 16-bit
    rest and the adapters are gathered, in the share of the 16-bit figure they take."""
    import dataclasses

    from zerofit.memory.states import stage3_live_params

    trainable = adapter_params(model, setup.lora_rank, setup.lora_targets)
    if setup.finetuning == "qlora" and setup.quant_storage != "compute":
        with_adapters = dataclasses.replace(model, params=model.params + trainable)
        live = stage3_live_params(with_adapters, setup, element_bytes, buckets)
        quantized, _ = quantized_elements(model)
        rest = max(0, with_adapters.params - quantized)
        return math.ceil(live * rest / with_adapters.params)
    held = zero3_parameter_model(model, setup, element_bytes)
    held = dataclasses.replace(held, params=held.params + trainable)
    return stage3_live_params(held, setup, element_bytes, buckets)


def zero3_qlora_load_bytes(model, setup, element_bytes: int) -> dict[str, int]:
    """What each GPU holds while transformers loads a 4-bit model for ZeRO-3, before
    ``deepspeed.initialize`` partitions it; empty where no such moment outgrows training.

    transformers builds a quantized model outside ``zero.Init`` (``modeling_utils.py``
    ``PreTrainedModel.get_init_context``: ``if not is_quantized``; ``_load_pretrained_model``'s
    rank-0 ZeRO-3 path is for ``not is_quantized`` only), and with no ``device_map`` (ZeRO-3
    refuses one: ``integrations/accelerate.py`` ``check_and_set_device_map``) bitsandbytes'
    quantizer puts the whole model on the current GPU (``quantizers/quantizer_bnb_4bit.py``
    ``update_device_map``: ``{"": torch.cuda.current_device()}``). Every rank so holds the
    whole base, its 4-bit weights quantized there one by one (``Params4bit._quantize``: the
    16-bit weight copied to the GPU, ``quantize_4bit``'s packed output and absmax beside it),
    until ``deepspeed.initialize`` converts it (``_convert_to_zero_parameters``) and frees
    each parameter's data. ZeRO-1/2 and no DeepSpeed keep the whole base anyway
    (``frozen_base_bytes``)."""
    if setup.finetuning != "qlora" or setup.stage != 3 or setup.without_deepspeed:
        return {}
    quantized, tensors = quantized_elements(model)
    quantized = min(quantized, model.params)
    whole = nf4_bytes(quantized, tensors) + (model.params - quantized) * element_bytes
    largest = max(fan_in * fan_out for fan_in, fan_out in layer_linear_shapes(model).values())
    return {"frozen_params": whole, "quantize_temp": largest * element_bytes}


QUANTIZED_LOAD_NOTE = (
    "note: the peak is in loading: transformers loads a 4-bit model whole onto every GPU "
    "(no zero.Init for quantized models) and ZeRO-3 partitions it only in deepspeed.initialize, "
    "so each GPU must hold the whole 4-bit base once, whatever the offload: more GPUs do not "
    "change that, a GPU with more memory does"
)


def quantized_load_note(peak_phase: str) -> str | None:
    """Why a QLoRA ZeRO-3 peak is in loading (``zero3_qlora_load_bytes``); None for any other
    phase."""
    return QUANTIZED_LOAD_NOTE if peak_phase == "load" else None


# --- the adapters' states under each ZeRO stage ---------------------------------------------------
def adapter_element_bytes(setup, compute_bytes: int) -> int:
    """Element size of A and B. DeepSpeed casts the whole module to the compute dtype
    (``engine.py:_configure_distributed_model``). Without it, PEFT upcasts 16-bit adapters to
    fp32 (``get_peft_model(autocast_adapter_dtype=True)`` -> ``tuners_utils.py:
    cast_adapter_dtype``), except that TRL casts a quantized model's adapters back to bf16 as the
    QLoRA paper does (``trl/trainer/sft_trainer.py`` ``SFTTrainer.__init__``, after
    ``get_peft_model``)."""
    if not setup.without_deepspeed:
        return compute_bytes
    if setup.finetuning == "qlora" and setup.autocast:
        return compute_bytes
    return FP32


def lora_path_bytes(setup, compute_bytes: int) -> int:
    """Element size of what the LoRA path saves for backward: ``lora_A``'s input and ``lora_B``'s
    rank-r input. peft's ``Linear.forward`` (``peft/tuners/lora/layer.py``) casts ``x`` to the
    adapters' dtype (``_cast_input_dtype``) before ``lora_B(lora_A(dropout(x)))``. Under
    autocast ``F.linear`` casts it back to the compute dtype, and that copy is what ``lora_A``
    saves; in a loop without autocast (``TrainSetup.autocast`` False) the matmuls run in the
    adapters' dtype, so peft's fp32 adapters save an fp32 copy of the input and an fp32
    intermediate."""
    if setup.autocast or not setup.without_deepspeed:
        return compute_bytes
    return adapter_element_bytes(setup, compute_bytes)


def adapter_resident_states(model, setup, b: int, buckets: dict) -> dict[str, int]:
    """The adapters' counterpart of ``states.resident_states``: the same DeepSpeed buffers, sized
    by the trainable parameters only (``stage_1_and_2.py`` / ``stage3.py`` build their flat
    groups from the optimizer's params), plus the frozen base (``frozen_base_bytes``)."""
    trainable = adapter_params(model, setup.lora_rank, setup.lora_targets)
    world = setup.world_size
    shard = trainable if setup.stage == 0 else math.ceil(trainable / world)
    on_gpu_opt = setup.offload_optimizer == "none"
    out = {"frozen_params": frozen_base_bytes(model, setup, b)}
    if setup.stage == 3:
        out["params"] = 0 if setup.offload_param != "none" else shard * b
    else:
        out["params"] = trainable * b  # bit16_groups_flat of the trainable parameters
    if on_gpu_opt:
        out["master_fp32"] = shard * FP32
        out["optimizer_states"] = shard * 2 * FP32
    if setup.stage == 3 and on_gpu_opt:
        out["gradients"] = shard * b
    elif setup.grad_accum > 1 and on_gpu_opt and setup.stage in (0, 1, 2):
        out["gradients"] = (shard if setup.stage == 2 else trainable) * b
    if setup.stage == 3 and buckets.get("reduce_bucket_size"):
        # stage3.py: the ipg bucket is reduce_bucket_size elements, however few are trainable
        out["comm_buckets"] = int(buckets["reduce_bucket_size"]) * b
    if setup.stage in (1, 2) and not on_gpu_opt:
        largest = largest_adapter_tensor(model, setup.lora_rank, setup.lora_targets)
        out["comm_buckets"] = largest * b
    return out


def adapter_backward_buffers(model, setup, b: int, buckets: dict) -> dict[str, int]:
    """Gradient buffers while backward runs (``states.backward_buffers`` for the adapters):
    ZeRO-1/2's ipg buffers are ``reduce_bucket_size`` elements whatever the trainable count
    (``stage_1_and_2.py:setup_buckets``: ``torch.empty(int(self.reduce_bucket_size))``, two with
    overlap_comm); the frozen embedding has no gradient to hold."""
    trainable = adapter_params(model, setup.lora_rank, setup.lora_targets)
    out: dict[str, int] = {}
    if setup.stage in (1, 2):
        bucket = int(buckets.get("reduce_bucket_size", 500_000_000))
        out["comm_buckets"] = (2 if setup.overlap_comm else 1) * bucket * b
        if setup.offload_optimizer == "none" and trainable > bucket and setup.grad_accum == 1:
            out["gradients"] = math.ceil(trainable / setup.world_size) * b
    elif setup.stage == 0:
        out["gradients"] = trainable * b if setup.grad_accum == 1 else 0
        if setup.world_size > 1:
            out["comm_buckets"] = min(trainable, 500_000_000) * b
    return out


def adapter_step_buffers(model, setup, b: int, buckets: dict, optimizer: str) -> dict[str, int]:
    """``optimizer.step()`` on the adapters' partition (``states.step_buffers``' sequence: the
    bit16 grads held while the flattened and fp32 copies are made, then the fp32 grad and the
    optimizer's temporaries)."""
    from zerofit.memory.optimizers import step_temporary_bytes

    if setup.offload_optimizer != "none":
        return {}
    trainable = adapter_params(model, setup.lora_rank, setup.lora_targets)
    shard = trainable if setup.stage == 0 else math.ceil(trainable / setup.world_size)
    if setup.stage == 3:
        sub = min(shard, int(buckets.get("sub_group_size", 1_000_000_000)))
        temp = step_temporary_bytes(optimizer, sub, sub)
        if b + FP32 > FP32 + temp:
            return {"fp32_grads": sub * (b + FP32)}
        return {"fp32_grads": sub * FP32, "optimizer_step_temp": temp}
    first = {"fp32_grads": shard * (b + FP32)}
    if setup.grad_accum == 1:
        first["gradients"] = shard * b
    temp = step_temporary_bytes(optimizer, shard, shard)
    if sum(first.values()) >= shard * FP32 + temp:
        return first
    return {"fp32_grads": shard * FP32, "optimizer_step_temp": temp}


def plain_adapter_resident(model, setup, weight_bytes: int, adapter_bytes: int) -> dict[str, int]:
    """Without DeepSpeed (``states.plain_resident_states``): the frozen base in its load dtype,
    the adapters with AdamW's two states in the adapters' dtype (``zeros_like``), accumulated
    grads, and DDP's buckets, which hold only parameters that require grad
    (``torch/nn/parallel/distributed.py``: ``_build_params_for_reducer``)."""
    trainable = adapter_params(model, setup.lora_rank, setup.lora_targets)
    out = {
        "frozen_params": frozen_base_bytes(model, setup, weight_bytes),
        "params": trainable * adapter_bytes,
        "optimizer_states": 2 * trainable * adapter_bytes,
    }
    if setup.grad_accum > 1:
        out["gradients"] = trainable * adapter_bytes
    if setup.world_size > 1:
        out["comm_buckets"] = trainable * adapter_bytes
    return out


def plain_adapter_step(model, setup, adapter_bytes: int, optimizer: str) -> dict[str, int]:
    """The adapters' ``optimizer.step()`` without DeepSpeed: grads still held, and the
    optimizer's temporaries over every adapter tensor (``optimizers.step_temporary_bytes``)."""
    from zerofit.memory.optimizers import step_temporary_bytes

    trainable = adapter_params(model, setup.lora_rank, setup.lora_targets)
    largest = largest_adapter_tensor(model, setup.lora_rank, setup.lora_targets)
    out = {"gradients": trainable * adapter_bytes} if setup.grad_accum == 1 else {}
    temp = step_temporary_bytes(optimizer, trainable, largest, adapter_bytes)
    if temp:
        out["optimizer_step_temp"] = temp
    return out


# --- activations ----------------------------------------------------------------------------------
# the bytes a CUDA dropout keeps per element for backward: ``at::native_dropout``'s boolean mask
# (``aten/src/ATen/native/Dropout.cpp``: ``dropout`` takes the fused kernel on CUDA); on the CPU
# ``_dropout_impl`` keeps a scaled noise tensor in the input's dtype instead
CUDA_DROPOUT_MASK_BYTES = 1
ATTENTION_INPUT_GROUP = ("q_proj", "k_proj", "v_proj", "qkv_proj")
MLP_INPUT_GROUP = ("gate_proj", "up_proj")


def copies_each_input(setup, compute_bytes: int) -> bool:
    """Each targeted module keeps its own copy of its input for ``lora_A``'s weight gradient:
    with dropout (``lora_A(dropout(x))``: each module drops its own copy), or when the adapters'
    dtype is not the compute dtype (fp32 adapters under autocast: ``_cast_input_dtype`` then
    autocast cast ``x`` again for each ``lora_A``, and autocast caches only casts of weights)."""
    adapter_bytes = adapter_element_bytes(setup, compute_bytes)
    return setup.lora_dropout > 0 or adapter_bytes != compute_bytes


def adapter_layer_delta_per_token(
    model, setup, a: int, residual: int, mask_bytes: int = CUDA_DROPOUT_MASK_BYTES
) -> int:
    """What one decoder layer keeps per token with adapters, minus what the full fine-tune's
    formula (``activations.layer_bytes_per_token``) counts. Autograd saves a tensor only for the
    gradients it must produce (checked with saved-tensor hooks, tests/memory/test_lora.py):

    - frozen norm weights: ``weight * x`` no longer saves ``x`` (the normalised tensor, per norm
      and per q/k norm);
    - a frozen linear layer saves no input; ``lora_A`` saves its own: the norm's output once per
      group (q/k/v, gate/up) when it takes ``x`` itself, else one copy per targeted module
      (``copies_each_input``); ``down_proj``'s input is saved only when it is targeted, and
      ``o_proj``'s is the attention kernel's output, saved anyway, unless copied per module;
    - dropout keeps a mask per targeted module (``mask_bytes`` per input element);
    - ``lora_B`` saves the rank-r intermediate (``lora_A``'s output) of each targeted module;
    - the copies and the intermediate are in the LoRA path's dtype (``lora_path_bytes``): fp32
      in a loop without autocast over peft's fp32 adapters.
    """
    from zerofit.memory.activations import LLAMA_NORMS, NORM_LAYOUTS

    h, heads, kv, d = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim
    layout = NORM_LAYOUTS.get(model.architecture, LLAMA_NORMS)
    normalised = FP32 if layout.fp32_weight else residual
    delta = -(layout.pre + layout.post) * normalised * h
    if layout.qk:
        delta -= (FP32 if layout.fp32_weight else a) * (heads + kv) * d
    targets = {
        name: shape
        for name, shape in targeted_modules(model, setup.lora_targets).items()
        if not _is_outside(name)
    }
    per_module = copies_each_input(setup, a) or residual != a
    copy = lora_path_bytes(setup, a)
    for group, full_copies in (
        (ATTENTION_INPUT_GROUP, 3 if residual != a else 1),
        (MLP_INPUT_GROUP, 2 if residual != a else 1),
    ):
        chosen = [name for name in group if name in targets]
        if not chosen and any(name in layer_linear_shapes(model) for name in group):
            delta -= full_copies * a * h
        elif chosen:
            saved = len(chosen) * copy if per_module else a
            delta += (saved - full_copies * a) * h
    if "o_proj" in targets and copies_each_input(setup, a):
        delta += copy * heads * d
    if "down_proj" in layer_linear_shapes(model) and "down_proj" not in targets:
        delta -= a * model.intermediate_size
    elif "down_proj" in targets and copies_each_input(setup, a):
        # the gated product itself is saved by nothing (``act_fn(gate) * up`` saves its
        # operands): lora_A's copy takes its place, in the LoRA path's dtype
        delta += (copy - a) * model.intermediate_size
    if setup.lora_dropout > 0:
        delta += mask_bytes * sum(fan_in for fan_in, _ in targets.values())
    delta += zero3_base_input_per_token(model, setup, a, residual)
    delta -= frozen_experts_saving_per_token(model, setup, a)
    return delta + copy * setup.lora_rank * len(targets)


def frozen_experts_saving_per_token(model, setup, a: int) -> int:
    """What an MoE layer's experts do not save when the adapters leave them frozen, beyond
    ``activations.mlp_bytes_per_token``'s count for trained experts: per chosen expert, the
    token's gathered input and the gated product, which only the experts' weight gradients
    would read (transformers/integrations/moe.py ``grouped_mm_experts_forward``: the gate_up
    output, the activation's output and the down output stay saved). 0 for a dense model or
    adapted experts (``adapts_fused_experts``)."""
    if not model.num_experts or adapts_fused_experts(model, setup.lora_targets):
        return 0
    inter = model.moe_intermediate_size or model.intermediate_size
    return model.experts_per_token * a * (model.hidden_size + inter)


# --- ZeRO-3's memory-efficient linear -------------------------------------------------------------
def frozen_linears_save_inputs(setup) -> bool:
    """Every 16-bit ``nn.Linear`` saves its input for backward, frozen or not: DeepSpeed ZeRO-3.

    ``zero.Init`` (``deepspeed/runtime/zero/partition_parameters.py``) calls
    ``_enable_mem_efficient_linear`` while the ZeRO config's ``memory_efficient_linear`` is on
    (``runtime/zero/config.py``: default True; zerofit's JSON leaves it), from ``Init.__init__``
    for ``Init(module=...)`` (what ``deepspeed.initialize`` runs on a model loaded whole:
    ``parameter_offload.py:_convert_to_zero_parameters``) and when transformers builds the model
    inside ``zero.Init``. It sets ``torch.nn.functional.linear = zero3_linear_wrap`` and never puts
    it back, so ``nn.Linear.forward``'s ``F.linear`` call runs
    ``LinearFunctionForZeroStage3`` (``runtime/zero/linear.py``), whose ``setup_context`` calls
    ``ctx.save_for_backward(input, weight, bias)`` whatever needs a gradient. Autograd keeps
    them whenever some input requires grad (a function none of whose inputs does is not
    recorded). torch's own linear saves a frozen weight's input for nothing. A user's
    ``memory_efficient_linear: false`` (``TrainSetup.memory_efficient_linear``, read from the
    DeepSpeed JSON) keeps torch's linear."""
    return setup.stage == 3 and is_adapter(setup) and setup.memory_efficient_linear


def _group_input_saved_anyway(chosen: list[str], per_module: bool) -> bool:
    """The input a group of linear layers reads is already saved without ZeRO-3: ``lora_A`` of
    a targeted module saves ``x`` itself when no dropout or cast copies it per module."""
    return bool(chosen) and not per_module


def zero3_base_input_per_token(model, setup, a: int, residual: int) -> int:
    """Per token and decoder layer, what ZeRO-3's ``LinearFunctionForZeroStage3`` adds by
    saving the input of every frozen 16-bit base layer (``frozen_linears_save_inputs``), beyond
    what ``adapter_layer_delta_per_token`` counts without it. A saved tensor costs nothing when
    its storage is saved already, so per input the layers read:

    - the attention norm's output (q/k/v) and the MLP norm's (gate/up): ``a * hidden`` each,
      unless a targeted module's ``lora_A`` saves that very tensor (no dropout:
      ``nn.Identity`` returns ``x``; with dropout each module saves its own dropped copy and
      the norm's output is then new);
    - ``down_proj``'s input, the gated product: ``a * intermediate`` unless ``lora_A`` of a
      targeted ``down_proj`` saves it itself (``act_fn(gate) * up`` saves its operands, not
      its output);
    - ``o_proj``'s input: nothing. It is the attention kernel's output, which the kernel saves
      for its own backward: the CUDA flash and memory-efficient kernels write it as (batch,
      seq, heads, dim) and return a transposed view (``aten/src/ATen/native/transformers/cuda/
      attention.cu``: ``_scaled_dot_product_flash_attention_cuda`` returns
      ``attention.view({batch, q_len, heads, dim}).transpose(1, 2)``, the efficient kernel
      allocates ``res`` as ``{B, M, num_heads, Kv}`` and returns ``attention.transpose(1,
      2)``), so transformers' ``attn_output.transpose(1, 2).contiguous()``
      (``integrations/sdpa_attention.py``) and the attention's ``reshape(...).contiguous()``
      are views of that storage; the CPU flash kernel lays it out the same way (checked by the
      probe, tests/memory/test_lora.py). ``activations.layer_bytes_per_token`` counts the same
      sharing for a full fine-tune.

    QLoRA's 4-bit layers add nothing: bitsandbytes' ``Linear4bit.forward`` calls
    ``bnb.matmul_4bit`` (``MatMul4Bit``, which keeps only the packed weight; its dequantizing
    fallback calls ``F.linear`` inside the Function's forward, where grad mode is off). A full
    fine-tune saves these inputs anyway (no adapters: this is never added there)."""
    if not frozen_linears_save_inputs(setup) or setup.finetuning != "lora":
        return 0
    h = model.hidden_size
    layer = layer_linear_shapes(model)
    targets = {
        name: shape
        for name, shape in targeted_modules(model, setup.lora_targets).items()
        if not _is_outside(name)
    }
    per_module = copies_each_input(setup, a) or residual != a
    extra = 0
    for group in (ATTENTION_INPUT_GROUP, MLP_INPUT_GROUP):
        chosen = [name for name in group if name in targets]
        exists = chosen or any(name in layer for name in group)
        if exists and not _group_input_saved_anyway(chosen, per_module):
            extra += a * h
    if "down_proj" in layer:
        chosen = ["down_proj"] if "down_proj" in targets else []
        if not _group_input_saved_anyway(chosen, per_module):
            extra += a * model.intermediate_size
    return extra


def zero3_first_layer_saving_per_token(model, setup) -> int:
    """The first layer's q/k/v base layers save nothing under ZeRO-3 when that layer's input
    needs no grad (``first_layer_input_grad``): their input (the norm of the frozen
    embedding's output) and weights need no grad, so autograd does not record
    ``LinearFunctionForZeroStage3`` there. Under DeepSpeed the residual stream is in the
    compute dtype (the engine casts the module)."""
    if first_layer_input_grad(setup) or not frozen_linears_save_inputs(setup):
        return 0
    if setup.finetuning != "lora":
        return 0
    a = COMPUTE_BYTES[setup.precision]
    targets = targeted_modules(model, setup.lora_targets)
    chosen = [name for name in ATTENTION_INPUT_GROUP if name in targets]
    if _group_input_saved_anyway(chosen, copies_each_input(setup, a)):
        return 0
    return a * model.hidden_size


def adapter_final_delta_per_token(model, setup, residual: int, a: int, loss_path: str) -> int:
    """The final norm's normalised tensor is not saved (frozen weight), nor is the LM head's
    input where the head is a frozen ``nn.Linear`` (the HF loss and TRL's log-prob path; TRL's
    fused head and Liger save the hidden states themselves), except under ZeRO-3."""
    from zerofit.memory.activations import LLAMA_NORMS, NORM_LAYOUTS

    layout = NORM_LAYOUTS.get(model.architecture, LLAMA_NORMS)
    normalised = FP32 if layout.fp32_weight else residual
    delta = -normalised * model.hidden_size
    head_targeted = "lm_head" in targeted_modules(model, setup.lora_targets)
    # under ZeRO-3 the frozen 16-bit head saves its input like every nn.Linear (LoRA and QLoRA:
    # the head is no Linear4bit), see frozen_linears_save_inputs
    head_saves = frozen_linears_save_inputs(setup)
    if loss_path in ("hf", "trl_logps") and not head_targeted and not head_saves:
        delta -= a * model.hidden_size
    return delta


def first_layer_input_grad(setup) -> bool:
    """The first layer's input requires grad: gradient checkpointing makes TRL / the HF Trainer
    call ``enable_input_require_grads`` (``SFTTrainer.__init__``; peft's
    ``prepare_model_for_kbit_training``), and a targeted embedding has grads of its own;
    otherwise the frozen embedding's output needs none, and the first norm saves nothing."""
    if setup.gradient_checkpointing:
        return True
    return "embed_tokens" in targeted_modules_names(setup.lora_targets)


def targeted_modules_names(targets: str) -> set[str]:
    """The short module names a comma list gives (empty for the presets)."""
    if targets in TARGET_PRESETS:
        return set()
    return {part.strip().rsplit(".", 1)[-1] for part in targets.split(",")}


def first_layer_saving_per_token(
    model, setup, mask_bytes: int = CUDA_DROPOUT_MASK_BYTES
) -> int:
    """Bytes per token the first layer does not save when its input needs no grad
    (``first_layer_input_grad``): the fp32 copy its input norm's ``pow`` would keep, and the
    dropout masks of the modules that read that norm (q/k/v: nothing asks for their input's
    gradient, so the multiply by the mask keeps nothing), and under ZeRO-3 the input its q/k/v
    base layers would save (``zero3_first_layer_saving_per_token``)."""
    if first_layer_input_grad(setup):
        return 0
    saving = FP32 * model.hidden_size
    if setup.lora_dropout > 0:
        targets = targeted_modules(model, setup.lora_targets)
        readers = [name for name in ATTENTION_INPUT_GROUP if name in targets]
        saving += mask_bytes * model.hidden_size * len(readers)
    return saving + zero3_first_layer_saving_per_token(model, setup)


def dequantized_weight_bytes(model, setup, a: int) -> int:
    """QLoRA: ``MatMul4Bit`` dequantizes a whole weight for each forward and each input-gradient
    matmul (``bitsandbytes/autograd/_functions.py``; on CUDA ``backends/cuda/ops.py`` ``gemm_4bit``
    falls back to ``_dequant_linear_fallback`` past 256 rows, i.e. in training), in the compute
    dtype, after dequantizing its absmax to fp32 (one per 64-element block): the largest
    quantized weight sets it."""
    if setup.finetuning != "qlora":
        return 0
    largest = max(fan_in * fan_out for fan_in, fan_out in layer_linear_shapes(model).values())
    return largest * a + math.ceil(largest / NF4_BLOCK) * FP32


# --- host RAM -------------------------------------------------------------------------------------
def adapter_host_bytes_per_rank(model, setup, b: int) -> int:
    """Host RAM one rank holds for offload with adapters: an offloaded optimizer holds only the
    trainable partition (``memory/pinned.py`` sizes its buffers, pinned or not); offloaded ZeRO-3
    parameters are every parameter's partition as DeepSpeed holds it, a 4-bit base's packed
    weights included (``zero3_parameter_model``), and the adapters' flat buffer
    (``pinned.zero3_adapter_param_offload_host_bytes``). A 4-bit weight's quantization state
    is no parameter: DeepSpeed never moves it, it stays on the GPU (``frozen_base_bytes``).

    The packed bytes are the same whatever ``bnb_4bit_quant_storage`` is: DeepSpeed 0.19's
    ``Init(module=...)`` partitions a uint8 ``Params4bit`` too (``_convert_to_zero_parameters``
    has no dtype filter; probed, tests/memory/test_lora.py), so the host counts it either way,
    while the GPU side keeps the uint8 base whole (``frozen_base_bytes``): both on the safe side."""
    from zerofit.memory import pinned

    trainable = adapter_params(model, setup.lora_rank, setup.lora_targets)
    shard = math.ceil(trainable / setup.world_size)
    total = 0
    if setup.offload_optimizer == "cpu":
        if setup.stage == 3:
            # stage3.py: the flat grad partition and the fp32 grads pinned, master and moments not
            buffers = [shard * b, shard * FP32]
            if setup.pin_optimizer_offload:
                buffers = [pinned.pinned_bytes(size) for size in buffers]
            total += sum(buffers) + shard * 3 * FP32
        else:
            largest = largest_adapter_tensor(model, setup.lora_rank, setup.lora_targets)
            total += pinned.zero12_offload_host_bytes(setup, b, shard, largest)
    elif setup.offload_optimizer == "nvme":
        total += 2 * shard * 4 * FP32
    if setup.offload_param == "cpu":
        base = zero3_parameter_model(model, setup, b)
        adapters = adapter_tensor_sizes(model, setup.lora_rank, setup.lora_targets)
        total += pinned.zero3_adapter_param_offload_host_bytes(base, setup, b, adapters)
    elif setup.offload_param == "nvme":
        total += 5 * 100_000_000 * b
    return total


def dequantized_weight_peak_bytes(model, setup, a: int, tokens: int) -> int:
    """What the dequantized weight adds to the layers' backward peak. ``down_proj``'s input grad
    is ``grad @ W`` on the dequantized weight (``MatMul4Bit.backward``), which is freed before
    the adapter's input grad and their sum exist: that later moment holds two more
    intermediate-width grads (``estimate.adapter_activation_bytes``' temporaries), so the weight
    raises the peak only by what it exceeds them (probed: tests/memory/test_lora.py)."""
    dequantized = dequantized_weight_bytes(model, setup, a)
    return max(0, dequantized - 2 * a * tokens * model.intermediate_size)
