"""QLoRA under DeepSpeed ZeRO-3 with the parameters offloaded, measured on one GPU beside zerofit.

A random-init Llama of 0.49B parameters (hidden 2048, 8 layers, vocab 32000, untied) is saved in
bf16 and loaded by transformers with QLoRA's BitsAndBytesConfig (NF4, double quantization, bf16
compute, ``bnb_4bit_quant_storage`` bf16) while a ZeRO-3 config is registered
(``HfDeepSpeedConfig``), as a trainer loads it; peft adds all-linear r 16 adapters (dropout
0.05, gradient checkpointing) and ``deepspeed.initialize`` runs with ``offload_param: cpu``
(pinned), one rank, torch's AdamW on the GPU. It prints one ``RESULT`` JSON line per stage:

- ``load``: the GPU right after ``from_pretrained`` (transformers skips ``zero.Init`` for a
  quantized model, bitsandbytes puts it whole on the GPU): memory_allocated and its peak;
- ``init``: every parameter's partition (``ds_tensor``) after ``deepspeed.initialize``, frozen
  and trainable apart, their devices and pinning, the optimizer's flat CPU buffers, PyTorch's
  pinned host allocator's counters, the packed elements of the ``Linear4bit`` weights;
- ``step``: three training steps, each with memory_allocated, its peak and the bytes of the
  parameters gathered on the GPU at the end of forward and of backward;
- ``snapshot``: the blocks over 1 MB still allocated after the last step, by size.

Compare with ``lora.zero3_qlora_load_bytes`` (load), ``pinned.zero3_partition_bytes`` /
``zero3_adapter_param_offload_host_bytes`` (init), ``lora.zero3_live_param_bytes`` and the
forward phase of ``estimate_memory`` (steps) for the same shape, one rank, those buckets.

One H100 80GB (torch 2.11+cu130, transformers 5.17, deepspeed 0.19.8, bitsandbytes 0.50.2,
peft 0.21.2), against the estimate of this checkout:

- load: peak 472,745,984 B, estimate 471,422,688 (-0.3 %): the whole 4-bit base and one 16-bit
  weight being quantized;
- init: partitions 442,568,704 B frozen + 9,306,112 trainable = 451,874,816, estimate
  451,874,816 (exact); packed linear elements 90,177,536, estimate 90,177,536; all on the CPU,
  pinned; the flat buffer 9,306,112 B, pinned; the pinned host allocator 539,824,135 B in use,
  estimate 539,885,568 (+0.01 %);
- steps 2-3: gathered at the end of forward 451,874,816 B, ``zero3_live_param_bytes``
  451,874,816 (exact); the step's peak 913,076,224 B, the estimate's 911,685,600 (-0.15 %;
  before the packed counting, 748,708,704: -18 %).

Dropping the loss matters: a loop that keeps it until the next forward (an earlier version of
this script) keeps the step's graph, and with it a view of every gathered ``Linear4bit`` weight
that bitsandbytes' ``MatMul4Bit.forward`` stores as a ctx attribute (``ctx.tensors = (None,
B)``, not ``save_for_backward``): 180,355,072 B more (the packed base once), peak 1,068,007,424.

Run on a GPU (deepspeed, bitsandbytes and peft importable):
    python benchmarks/gpu_qlora_offload.py
zerofit's figures for the same run (any machine, zerofit importable):
    python benchmarks/gpu_qlora_offload.py --estimate
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
SEQ = 512
BUCKETS = {
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "reduce_bucket_size": 50_000_000,
}


def report(**values) -> None:
    print("RESULT " + json.dumps(values), flush=True)


def ds_config() -> dict:
    zero = {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}, **BUCKETS}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
    }


def load_model(model_dir: str):
    """from_pretrained in 4-bit under a registered ZeRO-3 config; reports the GPU at load."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.integrations import is_deepspeed_zero3_enabled

    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    torch.cuda.reset_peak_memory_stats()
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, quantization_config=quantization, dtype=torch.bfloat16
    )
    torch.cuda.synchronize()
    report(
        stage="load",
        zero3=is_deepspeed_zero3_enabled(),
        allocated=torch.cuda.memory_allocated(),
        peak=torch.cuda.max_memory_allocated(),
        params_device=sorted({str(p.device) for p in model.parameters()}),
        param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
    )
    return model


def report_partitions(engine, optimizer) -> None:
    import torch

    frozen = trainable = packed = 0
    devices, pinned = set(), set()
    for name, param in engine.module.named_parameters():
        partition = param.ds_tensor
        size = partition.numel() * partition.element_size()
        if param.requires_grad:
            trainable += size
        else:
            frozen += size
        devices.add(str(partition.device))
        pinned.add(bool(partition.is_pinned()))
        if "base_layer.weight" in name:
            packed += param.ds_numel
    flat = optimizer.param_groups_fp16_flat_cpu_memory
    try:
        host = torch.cuda.memory.host_memory_stats()
        host = {key: value for key, value in host.items() if key.startswith("allocated_bytes")}
    except (AttributeError, RuntimeError) as e:
        host = {"error": str(e)}
    report(
        stage="init",
        allocated=torch.cuda.memory_allocated(),
        frozen_part_bytes=frozen,
        trainable_part_bytes=trainable,
        devices=sorted(devices),
        pinned=sorted(pinned),
        flat=[[b.numel() * b.element_size(), bool(b.is_pinned())] for b in flat],
        host=host,
        packed_linear=packed,
    )


def gathered_bytes(engine) -> int:
    parameters = engine.module.parameters()
    return sum(p.data.numel() * p.data.element_size() for p in parameters if p.data.is_cuda)


def run_steps(engine, steps: int = 3) -> None:
    import torch

    ids = torch.randint(0, SHAPE["vocab_size"], (1, SEQ), device="cuda")
    for step in range(steps):
        torch.cuda.reset_peak_memory_stats()
        loss = engine(input_ids=ids, labels=ids).loss
        torch.cuda.synchronize()
        forward = {"alloc": torch.cuda.memory_allocated(), "gathered": gathered_bytes(engine)}
        engine.backward(loss)
        torch.cuda.synchronize()
        backward = {"alloc": torch.cuda.memory_allocated(), "gathered": gathered_bytes(engine)}
        engine.step()
        # the loss holds the step's graph, and bitsandbytes' MatMul4Bit keeps a view of each
        # gathered 4-bit weight as a ctx attribute (``ctx.tensors = (None, B)``, no saved
        # tensor): a trainer drops the loss at the end of its step, and so does this loop
        del loss
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        report(stage="step", step=step, fwd=forward, bwd=backward, peak=peak)
    blocks = [
        block["size"]
        for segment in torch.cuda.memory._snapshot()["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated" and block["size"] >= 1_000_000
    ]
    report(stage="snapshot", total=sum(blocks), blocks=sorted(blocks, reverse=True))


def print_estimate() -> None:
    """zerofit's terms for this run: one rank on an H100, these buckets, r 16 all-linear."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from zerofit.memory import lora, pinned
    from zerofit.memory.estimate import TrainSetup, estimate_memory
    from zerofit.models.resolve import spec_from_config

    model = spec_from_config({**SHAPE, "model_type": "llama"}, "gpu-qlora-offload")
    setup = TrainSetup(
        stack="deepspeed", gpu="H100", stage=3, world_size=1, gpus_per_node=1,
        finetuning="qlora", lora_rank=16, lora_dropout=0.05, offload_param="cpu",
        seq_len=SEQ, gradient_checkpointing=True, optimizer="adamw_torch", buckets=BUCKETS,
    )
    held = lora.zero3_parameter_model(model, setup, 2)
    adapters = lora.adapter_tensor_sizes(model, 16, "all-linear")
    estimate = estimate_memory(model, setup)
    report(
        stage="estimate",
        load=estimate.phases["load"],
        packed_linear=lora.packed_linear_elements(model, 2),
        partition_bytes=pinned.zero3_partition_bytes(held, 1, 2, adapters),
        host_pinned=pinned.zero3_adapter_param_offload_host_bytes(held, setup, 2, adapters),
        live_params=lora.zero3_live_param_bytes(model, setup, 2, setup.bucket_sizes(2048)),
        step_peak=estimate.peak_bytes,
        peak_phase=estimate.phase,
    )


def main() -> None:
    if "--estimate" in sys.argv[1:]:
        print_estimate()
        return
    import deepspeed
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29711"), ("RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.set_device(0)
    config = ds_config()
    with tempfile.TemporaryDirectory(prefix="qlora-offload-") as model_dir:
        shape = AutoConfig.for_model("llama", use_cache=False, attn_implementation="sdpa", **SHAPE)
        torch.manual_seed(0)
        # saved before the ZeRO-3 config is registered: under it from_config would build the
        # random model inside zero.Init, partitioned, and save empty weights
        AutoModelForCausalLM.from_config(shape, dtype=torch.bfloat16).save_pretrained(model_dir)
        registered = HfDeepSpeedConfig(config)  # transformers reads it while it is alive
        assert registered.is_zero3()
        model = load_model(model_dir)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.05))
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.bfloat16)
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, optimizer, *_ = deepspeed.initialize(
        model=model, model_parameters=trainable, config=config
    )
    torch.cuda.synchronize()
    report_partitions(engine, optimizer)
    engine.module.train()
    run_steps(engine)


if __name__ == "__main__":
    main()
