"""What a real DeepSpeed ZeRO-3 engine with ``offload_param: cpu`` holds of a peft QLoRA model.

    DS_ACCELERATOR=cpu python tests/scripts/zero3_qlora_offload_probe.py SHAPE_JSON

One process, one rank over gloo. ``SHAPE_JSON`` is a Qwen2 config's fields. A random-init Qwen2
of that shape is saved in bf16 and loaded by transformers with QLoRA's BitsAndBytesConfig (NF4,
double quantization, bf16 compute) on the CPU, once per ``bnb_4bit_quant_storage`` (bfloat16,
what ZeRO-3 needs, and uint8, the default); peft adds all-linear adapters (r 8), and
``deepspeed.initialize`` converts the model to ZeRO-3 parameters
(``parameter_offload.py:_convert_to_zero_parameters``) with the parameters offloaded to the CPU.
Per storage it prints, in one JSON object: the bytes of every parameter's partition
(``ds_tensor.numel() * element_size()``), frozen and trainable apart, the devices they are on,
the packed elements of the ``Linear4bit`` weights, the optimizer's flat CPU buffers
(``param_groups_fp16_flat_cpu_memory``) and the device of the quantization states.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def zero3_offload_config() -> dict:
    """ZeRO-3, parameters on the CPU, bf16, torch's AdamW so nothing compiles (it never steps)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}},
        "steps_per_print": 1_000_000,
    }


def measure(model_dir: str, storage: str) -> dict:
    """The partitions a ZeRO-3 engine holds of the model loaded with ``storage``."""
    import deepspeed
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=getattr(torch, storage),
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, quantization_config=quantization, device_map="cpu", dtype=torch.bfloat16
    )
    model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.0))
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, optimizer, *_ = deepspeed.initialize(
        model=model, model_parameters=trainable, config=zero3_offload_config()
    )
    frozen = held = packed = 0
    devices = set()
    for name, param in engine.module.named_parameters():
        partition = param.ds_tensor
        size = partition.numel() * partition.element_size()
        devices.add(str(partition.device))
        if param.requires_grad:
            held += size
        else:
            frozen += size
        if "base_layer" in name and name.endswith(".weight"):
            packed += param.ds_numel
    states = [
        module.weight.quant_state
        for module in engine.module.modules()
        if getattr(getattr(module, "weight", None), "quant_state", None) is not None
    ]
    flat = [b.numel() * b.element_size() for b in optimizer.param_groups_fp16_flat_cpu_memory]
    engine.destroy()
    return {
        "frozen_bytes": frozen,
        "trainable_bytes": held,
        "devices": sorted(devices),
        "packed_linear_elements": packed,
        "flat_buffer_bytes": flat,
        "quant_state_devices": sorted({str(state.absmax.device) for state in states}),
    }


def main() -> None:
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = json.loads(sys.argv[1])
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", use_cache=False, **shape)
    with tempfile.TemporaryDirectory(prefix="qlora-probe-") as model_dir:
        AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(model_dir)
        results = {storage: measure(model_dir, storage) for storage in ("bfloat16", "uint8")}
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
