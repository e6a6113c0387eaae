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

import re

from zerofit.errors import ZerofitError

FINETUNING = ("full", "lora", "qlora")
MAX_LORA_RANK = 4096
TARGET_PRESETS = ("all-linear", "attention")
# the decoder layer's linear layers as transformers names them (Llama, Qwen2/3, Mistral, Gemma)
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# modules outside the decoder layers a user may name (PEFT targets them when named, never through
# "all-linear": the LM head is the output layer, the embedding is no linear layer)
OUTSIDE_MODULES = ("lm_head", "embed_tokens")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")

FP32 = 4
NF4_BLOCK = 64  # quantize_4bit's default blocksize (BitsAndBytesConfig leaves it)
ABSMAX_BLOCK = 256  # quantize_blockwise(blocksize=256) of the absmax under double quantization
# per quantized tensor: the NF4 code (get_4bit_type: 16 fp32), the absmax code
# (create_dynamic_map: 256 fp32) and the fp32 offset (``_absmax.mean()``)
NF4_TENSOR_CONSTANTS = 16 * FP32 + 256 * FP32 + FP32


def check_lora_targets(targets: str) -> None:
    """``all-linear``, ``attention`` or a comma list of module names as PEFT takes them;
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
            "use all-linear, attention, or names such as q_proj,v_proj",
        )
