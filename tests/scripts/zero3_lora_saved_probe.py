"""What one forward of a peft LoRA model saves for backward, without and with DeepSpeed ZeRO-3.

    DS_ACCELERATOR=cpu python tests/scripts/zero3_lora_saved_probe.py CASES_JSON

One process, one rank over gloo. ``CASES_JSON`` is a JSON object: ``shape`` (a Qwen2 config's
fields), ``micro`` and ``seq`` (the batch), ``cases`` (a list of ``{"targets": [...] or
"all-linear", "dropout": p, "input_grads": bool}``). Per case a random-init fp32 Qwen2 gets peft
adapters (r 8); its forward is measured with torch's own ``F.linear`` (``plain``), then the same
model goes through ``deepspeed.initialize`` under ZeRO-3 and is measured again (``zero3``).
``deepspeed.initialize`` converts the model to ZeRO-3 parameters with ``zero.Init(module=...)``
(``parameter_offload.py:_convert_to_zero_parameters``), which replaces
``torch.nn.functional.linear`` with ``zero3_linear_wrap`` and never restores it
(``partition_parameters.py:_enable_mem_efficient_linear``): the plain forward of each case runs
with DeepSpeed's saved original (``InsertPostInitMethodToModuleSubClasses.linear_bk``) put back,
the ZeRO-3 one with the wrap. ``wrapped`` records that the wrap was in place.

Bytes: the distinct storages autograd saves (saved-tensor hooks), parameters excluded: each
parameter's storage as it is while the forward runs (ZeRO-3 gathers a parameter into a new
storage for its module's forward), and its ZeRO-3 partition. Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys


def _parameter_storages(model) -> set[int]:
    """The data pointers of every parameter's current storage and of its ZeRO-3 partition."""
    pointers = set()
    for param in model.parameters():
        pointers.add(param.untyped_storage().data_ptr())
        partition = getattr(param, "ds_tensor", None)
        if partition is not None:
            pointers.add(partition.untyped_storage().data_ptr())
    return pointers


def saved_bytes(model, run) -> int:
    """Bytes of the distinct non-parameter storages autograd saves while ``run()`` executes."""
    from torch.autograd.graph import saved_tensors_hooks

    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in _parameter_storages(model):
            saved[pointer] = storage.nbytes()
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(saved.values())


def build_model(shape: dict, case: dict):
    """A random-init fp32 Qwen2 of ``shape`` with peft adapters as ``case`` asks."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    model = AutoModelForCausalLM.from_config(config).train()
    lora = LoraConfig(r=8, target_modules=case["targets"], lora_dropout=case["dropout"])
    model = get_peft_model(model, lora)
    if case["input_grads"]:
        model.enable_input_require_grads()
    return model


def zero3_config() -> dict:
    """ZeRO-3 in fp32 (no bf16 block: the CPU probes run fp32), torch's AdamW so nothing
    compiles; the optimizer never steps here."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
        "steps_per_print": 1_000_000,
    }


def measure_case(shape: dict, ids, case: dict) -> dict:
    """The plain and ZeRO-3 saved bytes of one case."""
    import deepspeed
    import torch
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original
    model = build_model(shape, case)
    plain = saved_bytes(model, lambda: model(input_ids=ids))
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=trainable, config=zero3_config()
    )
    wrapped = torch.nn.functional.linear is zero3_linear_wrap
    zero3 = saved_bytes(engine.module, lambda: engine(input_ids=ids))
    engine.destroy()
    return {**case, "plain": plain, "zero3": zero3, "wrapped": wrapped}


def main() -> None:
    import deepspeed
    import torch

    spec = json.loads(sys.argv[1])
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="gloo")
    generator = torch.Generator().manual_seed(1234)
    shape = spec["shape"]
    ids = torch.randint(0, shape["vocab_size"], (spec["micro"], spec["seq"]), generator=generator)
    results = [measure_case(shape, ids, case) for case in spec["cases"]]
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
