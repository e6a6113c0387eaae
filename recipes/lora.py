"""LoRA and QLoRA for the recipes (`--finetuning lora|qlora`), on peft and bitsandbytes.

- The base model is frozen; peft adds trainable low-rank adapters (A: r x in, B: out x r, B
  starting at zero) to the `--lora-targets` modules. QLoRA first loads the base in 4-bit NF4
  with double quantization (bitsandbytes), as TRL / PEFT / LLaMA-Factory / axolotl set it up.
- The reference of DPO and GRPO is the same model with its adapters disabled: no second copy of
  the weights, as TRL does (trl/trainer/dpo_trainer.py, DPOTrainer: `use_adapter(model, None)`
  from trl/trainer/utils.py, which enters peft's `PeftModel.disable_adapter()`).
- Checkpoints hold the adapter weights and the optimizer state, not the frozen base; the final
  model is the adapter (`adapter_config.json` + `adapter_model.safetensors`), or with
  `--merge-adapter` a full model with the adapter merged in.

peft, bitsandbytes and torch are imported inside the functions: a full fine-tune never loads them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile

from arguments import fail

# The attention projections by the names the common architectures give them (Llama, Qwen,
# Mistral, Gemma: q/k/v/o_proj; GPT-2: c_attn/c_proj inside `attn`; Falcon, BLOOM:
# query_key_value/dense inside `self_attention`): "attention" picks the linear layers that sit
# inside a module whose name says attention.
ATTENTION_WORDS = ("attn", "attention")


# ----------------------------------------------------------------------------- loading
def compute_dtype(accelerator):
    """The dtype QLoRA computes in and stores its 4-bit weights in: the run's mixed precision
    (accelerate takes it from the DeepSpeed JSON's bf16/fp16 block), else fp32."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
        str(accelerator.mixed_precision), torch.float32
    )


def frozen_base_dtype(accelerator):
    """The dtype a plain LoRA run loads its frozen base in: the run's compute dtype, as
    LLaMA-Factory, axolotl and ms-swift load an adapter's base and zerofit's memory model counts
    it (memory/estimate.py, TrainSetup.weight_dtype); an fp32 copy of weights that never update
    only costs 2 more bytes per parameter. Under DeepSpeed the engine casts the module to this
    dtype anyway (deepspeed/runtime/engine.py, _configure_distributed_model). The adapters
    get_peft_model adds are fp32 all the same (`autocast_adapter_dtype=True`, peft
    tuners_utils.py cast_adapter_dtype), what memory/lora.py (adapter_element_bytes) counts
    without DeepSpeed; DeepSpeed casts them to the compute dtype with the rest."""
    return compute_dtype(accelerator)


def quantization_config(dtype):
    """4-bit NF4 with double quantization, computing in `dtype`.

    `bnb_4bit_quant_storage=dtype` packs the 4-bit weights into tensors of the compute dtype, so
    DeepSpeed ZeRO-3 (and FSDP) can partition them like any 16-bit weight; with the default uint8
    storage ZeRO-3 leaves them whole on every GPU (peft docs/source/accelerate/deepspeed.md,
    "Use PEFT QLoRA and DeepSpeed with ZeRO3"; transformers BitsAndBytesConfig docstring)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=dtype,
    )


def load_quantized_model(args, tokenizer, accelerator, build_tiny_model):
    """`--model` loaded in 4-bit NF4 (bitsandbytes quantizes while from_pretrained loads), its
    embeddings, norms and LM head left in the compute dtype. Without `--model`, the tiny model
    is saved to a temporary directory first: quantization happens on load only.

    No `prepare_model_for_kbit_training`: it casts every non-quantized parameter to fp32
    (peft/utils/other.py), which TRL's trainers do not call (trl/trainer/sft_trainer.py,
    SFTTrainer.__init__: `get_peft_model`, `enable_input_require_grads`, adapters to bf16) and
    zerofit's memory model does not count (memory/lora.py, frozen_base_bytes: the rest of the
    base in 16-bit). add_adapters does the rest of its work: the base frozen by get_peft_model,
    gradient checkpointing and the inputs' gradients."""
    from transformers import AutoModelForCausalLM

    dtype = compute_dtype(accelerator)
    with contextlib.ExitStack() as stack:
        path = args.model
        if not path:
            path = stack.enter_context(tempfile.TemporaryDirectory(prefix="tiny-model-"))
            build_tiny_model(tokenizer, args.seed).save_pretrained(path)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path, quantization_config=quantization_config(dtype), dtype=dtype
            )
        except Exception as e:  # bitsandbytes without a usable backend, an unsupported layer
            fail(
                "finetuning",
                f"cannot load {args.model or 'the tiny model'} in 4-bit: {first_line(e)}",
                "use --finetuning lora, or a machine where bitsandbytes runs",
            )
    keep_training_layout_on_cpu(model)
    return model


def keep_training_layout_on_cpu(model) -> None:
    """On a CPU with AVX512-BF16, bitsandbytes repacks a 4-bit weight into an inference-only
    layout the first time its layer runs in eval mode without gradients (bitsandbytes
    nn/modules.py, Linear4bit.forward: `_convert_weight_packed_for_cpu`), and a later training
    forward then fails in `matmul_4bit` ("a view of a leaf Variable ... in-place operation",
    seen after GRPO's generate here). The layers keep the layout they train with."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def checkpointing_kwargs(accelerator) -> dict:
    """Non-reentrant checkpointing, except for PEFT under ZeRO-3, which needs the reentrant
    kind: TRL forces it there (trl/trainer/dpo_trainer.py, DPOTrainer.__init__, "PEFT + DeepSpeed
    ZeRO-3 requires reentrant checkpointing", huggingface/trl issue 2514)."""
    plugin = accelerator.state.deepspeed_plugin
    zero3 = plugin is not None and plugin.zero_stage == 3
    return {"use_reentrant": zero3}


def first_line(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__


# ----------------------------------------------------------------------------- adapters
def resolve_targets(model, targets: str):
    """--lora-targets as peft's `target_modules`: "all-linear" as is (peft then skips the
    output head), "attention" as the names of the linear layers inside attention modules, or
    the given names, each checked against the model's modules."""
    import torch

    if targets == "all-linear":
        return targets
    from transformers.pytorch_utils import Conv1D

    # bitsandbytes' Linear4bit is a torch Linear too; GPT-2's linear layers are Conv1D
    linear_kinds = (torch.nn.Linear, Conv1D)
    leaves = {
        name: module for name, module in model.named_modules() if isinstance(module, linear_kinds)
    }
    if targets == "attention":
        names = sorted({name.rsplit(".", 1)[-1] for name in leaves if inside_attention(name)})
        if not names:
            fail(
                "lora_targets",
                "found no linear layer inside an attention module of this model",
                "name the modules, e.g. --lora-targets q_proj,v_proj",
            )
        return names
    names = [name.strip() for name in targets.split(",")]
    short = {name.rsplit(".", 1)[-1] for name in leaves}
    missing = [name for name in names if name not in short and name not in leaves]
    if missing:
        known = ", ".join(sorted(short))
        fail(
            "lora_targets", f"the model has no linear layer {missing[0]!r}", f"use some of {known}"
        )
    return names


def inside_attention(name: str) -> bool:
    """Whether a module's dotted name sits inside a module whose name says attention."""
    parents = name.lower().split(".")[:-1]
    return any(word in part for part in parents for word in ATTENTION_WORDS)


def add_adapters(args, model, accelerator):
    """The model with peft LoRA adapters on `--lora-targets`; only the adapters train.

    With gradient checkpointing the inputs of the checkpointed blocks must require gradients, or
    the reentrant kind (the one ZeRO-3 + PEFT needs) returns outputs without a graph and the
    adapters inside get none: `enable_input_require_grads` (transformers modeling_utils.py,
    PreTrainedModel.enable_input_require_grads), which TRL calls for every PEFT model with
    checkpointing (trl/trainer/sft_trainer.py, SFTTrainer.__init__)."""
    from peft import LoraConfig, get_peft_model

    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=checkpointing_kwargs(accelerator)
        )
    config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=resolve_targets(model, args.lora_targets),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    if args.gradient_checkpointing:
        model.enable_input_require_grads()
    if args.finetuning == "qlora":
        cast_adapters_to_16_bit(model, accelerator)
    return model


def cast_adapters_to_16_bit(model, accelerator) -> None:
    """A 4-bit model's adapters in bf16 when the run computes in 16-bit, as the QLoRA paper
    trains them and TRL casts them after get_peft_model (trl/trainer/sft_trainer.py,
    dpo_trainer.py, grpo_trainer.py: `param.data.to(torch.bfloat16)` for every trainable
    parameter of a quantized model); peft's get_peft_model had upcast them to fp32
    (`autocast_adapter_dtype=True`). bf16 under fp16 too, as TRL: accelerate's fp16 GradScaler
    refuses fp16 gradients. An fp32 run keeps them fp32, what memory/lora.py
    (adapter_element_bytes: the compute dtype) counts for it."""
    import torch

    if compute_dtype(accelerator) == torch.float32:
        return
    for param in trainable_parameters(model):
        param.data = param.data.to(torch.bfloat16)


def trainable_parameters(model) -> list:
    """What the optimizer updates: every parameter of a full fine-tune, the adapters of LoRA."""
    return [param for param in model.parameters() if param.requires_grad]


def is_peft_model(model) -> bool:
    """Whether `model` (unwrapped) is a peft model; False without importing peft."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def as_reference(accelerator, model):
    """The context in which `model` computes reference log-probs: its adapters disabled (the
    base model), as TRL's DPOTrainer and GRPOTrainer do (trl/trainer/utils.py, use_adapter with
    adapter_name None: `model.disable_adapter()`). A separate reference model needs nothing."""
    unwrapped = accelerator.unwrap_model(model)
    if is_peft_model(unwrapped):
        return unwrapped.disable_adapter()
    return contextlib.nullcontext()


def describe(args) -> str:
    """The fine-tuning method as the start-up line names it."""
    if args.finetuning == "full":
        return "full fine-tune"
    return f"{args.finetuning} r={args.lora_rank} on {args.lora_targets}"


# ----------------------------------------------------------------------------- checkpoints
def adapter_only_checkpoints(accelerator, model) -> tuple[dict, dict]:
    """(save_state kwargs, load_state kwargs) that keep the frozen base out of checkpoints.

    DeepSpeed: `save_checkpoint(exclude_frozen_parameters=True)` and
    `load_checkpoint(load_module_strict=False)`, what transformers' Trainer passes for a PEFT
    model (transformers/trainer.py, Trainer._save_optimizer_and_scheduler and
    deepspeed_load_checkpoint in _load_from_checkpoint). Otherwise accelerate saves the model's
    whole state dict: a save hook drops the frozen tensors (Accelerator.register_save_state_pre_hook
    gets the weights it is about to write) and the load is not strict (accelerate
    checkpointing.py, load_accelerator_state passes the kwargs to load_model / load_state_dict)."""
    if accelerator.state.deepspeed_plugin is not None:
        return {"exclude_frozen_parameters": True}, {"load_module_strict": False}
    unwrapped = accelerator.unwrap_model(model)
    trainable = {name for name, param in unwrapped.named_parameters() if param.requires_grad}

    def keep_trainable(models, weights, output_dir):
        # the keys are the unwrapped model's (accelerate saves DDP's module without `module.`)
        for state in weights:
            for key in [key for key in state if key.removeprefix("module.") not in trainable]:
                del state[key]

    accelerator.register_save_state_pre_hook(keep_trainable)
    return {}, {"strict": False}


# ----------------------------------------------------------------------------- final model
def save_final_adapter(accelerator, model, tokenizer, output_dir: str, merge: bool) -> str:
    """output_dir/final: the adapter (peft's save_pretrained), or the merged full model.

    Under ZeRO-3 every parameter is a partition (an empty tensor on the module), and peft's
    save_pretrained on the module writes empty adapters (huggingface/trl issue 4416, deepspeedai/
    DeepSpeed issue 4295: "adapter_model.bin 519K", shapes torch.Size([0])): the 16-bit weights
    are gathered first. The adapter only: DeepSpeed's
    `_zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`, as transformers'
    Trainer.save_model does for a PEFT model under ZeRO-3; merged: accelerate's get_state_dict
    (every weight, gathered). Both are collectives: every rank calls this."""
    unwrapped = accelerator.unwrap_model(model)
    plugin = accelerator.state.deepspeed_plugin
    if merge:
        state_dict = accelerator.get_state_dict(model)
    elif plugin is not None and plugin.zero_stage == 3:
        state_dict = model._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)
    else:
        state_dict = accelerator.get_state_dict(model)
    final = os.path.join(output_dir, "final")
    if accelerator.is_main_process:
        tmp = os.path.join(output_dir, ".tmp-final")
        shutil.rmtree(tmp, ignore_errors=True)
        if merge:
            config = unwrapped.peft_config["default"]
            merged = merge_lora_weights(state_dict, config.lora_alpha / config.r)
            unwrapped.get_base_model().save_pretrained(tmp, state_dict=merged)
        else:
            unwrapped.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()
    return final


PEFT_PREFIX = "base_model.model."


def merge_lora_weights(state_dict: dict, scaling: float) -> dict:
    """A peft LoRA model's full state dict as the plain model's: each adapted weight becomes
    W + scaling x (B @ A), computed in fp32 and stored in W's dtype (peft/tuners/lora/layer.py,
    Linear.get_delta_weight: B @ A x scaling), and the names lose peft's wrapping
    (`base_model.model.` in front, `.base_layer` inside)."""
    merged = {}
    for key, tensor in state_dict.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix(PEFT_PREFIX)
        if ".base_layer." in name:
            module = key.rsplit(".base_layer.", 1)[0]
            name = name.replace(".base_layer.", ".")
            down = state_dict.get(f"{module}.lora_A.default.weight")
            up = state_dict.get(f"{module}.lora_B.default.weight")
            if key.endswith(".weight") and down is not None and up is not None:
                delta = up.float() @ down.float() * scaling
                tensor = (tensor.float() + delta.reshape(tensor.shape)).to(tensor.dtype)
        merged[name] = tensor
    return merged
