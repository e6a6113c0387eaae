"""What check knows that no library states in a form it can read: data, each with its source.

Everything else (keys, aliases, value types, removed and deprecated forms, enums, launchers) is
read from the installed DeepSpeed and accelerate at run time.
"""

from __future__ import annotations

# What transformers' HfTrainerDeepSpeedConfig fills for "auto" (integrations/deepspeed.py:
# trainer_config_process / trainer_config_finalize call fill_match on these paths).
HF_FILLED = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "optimizer.params.lr",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "optimizer.params.weight_decay",
        "scheduler.params.warmup_min_lr",
        "scheduler.params.warmup_max_lr",
        "scheduler.params.warmup_num_steps",
        "scheduler.params.total_num_steps",
        "fp16.enabled",
        "bf16.enabled",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
    }
)

# What accelerate fills for "auto" (Accelerator._prepare_deepspeed config_kwargs and
# DeepSpeedPlugin.set_mixed_precision); batch sizes need a DataLoader passed to prepare().
ACCELERATE_FILLED = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "fp16.enabled",
        "bf16.enabled",
        "optimizer.params.lr",
        "optimizer.params.weight_decay",
        "scheduler.params.warmup_min_lr",
        "scheduler.params.warmup_max_lr",
        "scheduler.params.warmup_num_steps",
        "scheduler.params.total_num_steps",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    }
)

# Sections DeepSpeed reads with its pydantic config models, which drop "auto" values before
# validating (deepspeed/runtime/config_utils.py DeepSpeedConfigModel.__init__, strict=False).
DROPS_AUTO = ("zero_optimization.", "bf16.", "bfloat16.", "fp16.")

# transformers HfTrainerDeepSpeedConfig.trainer_config_process: fill_match() raises when a value
# that is not "auto" differs from these TrainingArguments ("ds X=.. vs hf Y=..").
TRAINER_MATCH = {
    "train_micro_batch_size_per_gpu": "--per_device_train_batch_size {v}",
    "gradient_accumulation_steps": "--gradient_accumulation_steps {v}",
    "train_batch_size": "world x per-device batch x accumulation = {v}",
    "gradient_clipping": "--max_grad_norm {v}",
    "bf16.enabled": "{flag}--bf16",
    "fp16.enabled": "{flag}--fp16",
    "optimizer.params.lr": "--learning_rate {v}",
    "optimizer.params.eps": "--adam_epsilon {v}",
    "optimizer.params.weight_decay": "--weight_decay {v}",
}

# Values a client would put where "auto" stands, for DeepSpeed's whole-config run (any valid
# value serves: only validity is checked there); other "auto" keys get 1.
AUTO_STAND_IN = {
    "gradient_clipping": 1.0,
    "fp16.enabled": False,
    "bf16.enabled": False,
    "optimizer.params.lr": 1e-5,
    "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0,
    "scheduler.params.warmup_min_lr": 0,
    "scheduler.params.warmup_max_lr": 1e-5,
    "scheduler.params.warmup_num_steps": 1,
    "scheduler.params.total_num_steps": 10,
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
}

# Next to deepspeed_config_file these make accelerate launch refuse the YAML (the list is local
# to accelerate utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks, as env names).
DS_FILE_CONFLICTS = frozenset(
    {
        "zero_stage",
        "offload_optimizer_device",
        "offload_param_device",
        "offload_optimizer_nvme_path",
        "offload_param_nvme_path",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "zero3_save_16bit_model",
    }
)

# YAML deepspeed_config key -> the zero_optimization path DeepSpeedPlugin writes it to (local
# to accelerate utils/dataclasses.py DeepSpeedPlugin.__post_init__ `plugin_to_config_mapping`).
PLUGIN_TO_ZERO = {
    "zero_stage": ("stage",),
    "offload_optimizer_device": ("offload_optimizer", "device"),
    "offload_param_device": ("offload_param", "device"),
    "offload_optimizer_nvme_path": ("offload_optimizer", "nvme_path"),
    "offload_param_nvme_path": ("offload_param", "nvme_path"),
}
# deepspeed_config keys DeepSpeedPlugin converts with str_to_bool at start-up.
PLUGIN_BOOL_KEYS = ("zero3_init_flag", "zero3_save_16bit_model")

# Nested YAML sections whose keys become `accelerate launch` arguments, and the prefix accelerate
# adds (commands/launch.py `_validate_launch_command`: fsdp_/fp8_/dynamo_ prefixes).
NESTED_LAUNCH_SECTIONS = {
    "deepspeed_config": "",
    "fsdp_config": "fsdp_",
    "fp8_config": "fp8_",
    "dynamo_config": "dynamo_",
    "megatron_lm_config": "",
    "mpirun_config": "",
}
# Legacy top-level keys ClusterConfig.process_config converts before building the config.
ACCELERATE_LEGACY_KEYS = frozenset({"fp16", "dynamo_backend"})

# The training setup next to the configs (check/training.py): how each stack names its loading.
# LLaMA-Factory's own keys (hparams/model_args.py, finetuning_args.py); it sets
# bnb_4bit_quant_storage to the compute dtype itself for 4-bit (model_utils/quantization.py,
# configure_quantization: "crucial for fsdp+qlora").
LLAMAFACTORY_KEYS = frozenset({"quantization_bit", "finetuning_type", "lora_target", "stage"})
# TRL's ModelConfig fields (trl/trainer/model_config.py), read by get_quantization_config and
# get_peft_config (trl/trainer/utils.py): bnb_4bit_compute_dtype is ModelConfig.dtype there.
TRL_KEYS = frozenset(
    {"use_peft", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_storage", "use_bnb_nested_quant"}
)
# zerofit's recipes: --finetuning qlora sets the quant storage, and ZeRO-3 gathering on save.
RECIPE_SCRIPTS = frozenset({"sft.py", "dpo.py", "grpo.py"})
# Pre-quantized checkpoints ZeRO-3 can partition: bitsandbytes 4-bit, with a float quant storage
# (any other quant_method, GPTQ, AWQ, ..., is refused by LLaMA-Factory under ZeRO-3).
PARTITIONABLE_QUANT_METHODS = frozenset({"bitsandbytes"})
# Spellings of a dtype in YAMLs and flags -> torch's name.
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float": "float32",
    "float32": "float32",
    "uint8": "uint8",
}
