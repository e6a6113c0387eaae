"""Static key tables for `zerofit check` (no deepspeed/accelerate import at run time).

Each table maps a valid key to a type tag. tests/configs/test_check.py derives the same sets from the
installed DeepSpeed pydantic models (DeepSpeedZeroConfig, the offload and precision configs) and
accelerate's ClusterConfig / `accelerate launch` flags, and fails when they drift.
Tags: int, float, bool, str, path, dict, list, stage (0-3), device (none/cpu/nvme), any.
"""

from __future__ import annotations

# deepspeed.runtime.zero.config.DeepSpeedZeroConfig: field names and their aliases (populate_by_name).
ZERO = {
    "stage": "stage",
    "contiguous_gradients": "bool",
    "reduce_scatter": "bool",
    "reduce_bucket_size": "int",
    "use_multi_rank_bucket_allreduce": "bool",
    "allgather_partitions": "bool",
    "allgather_bucket_size": "int",
    "overlap_comm": "bool",
    "compute_grad_norm": "bool",
    "load_from_fp32_weights": "bool",
    "elastic_checkpoint": "bool",
    "offload_param": "dict",
    "offload_optimizer": "dict",
    "zenflow": "dict",
    "sub_group_size": "int",
    "cpu_offload_param": "bool",
    "cpu_offload_use_pin_memory": "bool",
    "cpu_offload": "bool",
    "prefetch_bucket_size": "int",
    "stage3_prefetch_bucket_size": "int",
    "param_persistence_threshold": "int",
    "stage3_param_persistence_threshold": "int",
    "model_persistence_threshold": "int",
    "stage3_model_persistence_threshold": "int",
    "max_live_parameters": "int",
    "stage3_max_live_parameters": "int",
    "max_reuse_distance": "int",
    "stage3_max_reuse_distance": "int",
    "gather_16bit_weights_on_model_save": "bool",
    "stage3_gather_16bit_weights_on_model_save": "bool",
    "module_granularity_threshold": "int",
    "stage3_module_granularity_threshold": "int",
    "use_all_reduce_for_fetch_params": "bool",
    "stage3_use_all_reduce_for_fetch_params": "bool",
    "allgather_sequential": "bool",
    "stage3_allgather_sequential": "bool",
    "stage3_gather_fp16_weights_on_model_save": "bool",
    "ignore_unused_parameters": "bool",
    "legacy_stage1": "bool",
    "round_robin_gradients": "bool",
    "parameter_alignment": "bool",
    "zero_hpz_partition_size": "int",
    "zero_quantized_weights": "bool",
    "zero_quantized_nontrainable_weights": "bool",
    "zero_quantized_gradients": "bool",
    "memory_efficient_linear": "bool",
    "pipeline_loading_checkpoint": "bool",
    "override_module_apply": "bool",
    "log_trace_cache_warnings": "bool",
    "enable_sanity_checks": "bool",
    "save_muon_momentum_buffer_in_memory": "bool",
    "leaf_module": "dict",
}
# deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadParamConfig
OFFLOAD_PARAM = {
    "device": "device",
    "nvme_path": "path",
    "buffer_count": "int",
    "buffer_size": "int",
    "max_in_cpu": "int",
    "pin_memory": "bool",
}
# deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig
OFFLOAD_OPTIMIZER = {
    "device": "device",
    "nvme_path": "path",
    "buffer_count": "int",
    "pin_memory": "bool",
    "pipeline_read": "bool",
    "pipeline_write": "bool",
    "fast_init": "bool",
    "ratio": "float",
    "super_offload": "bool",
    "cpuadam_cores_perc": "float",
}
# deepspeed.runtime.precision_config.DeepSpeedBF16Config / DeepSpeedFP16Config
BF16 = {
    "enabled": "bool",
    "immediate_grad_update": "bool",
    "check_grad_overflow": "bool",
    "bf16_master_weights_and_grads": "bool",
    "bf16_optimizer_states": "bool",
}
FP16 = {
    "enabled": "bool",
    "auto_cast": "bool",
    "loss_scale": "float",
    "initial_scale_power": "int",
    "loss_scale_window": "int",
    "hysteresis": "int",
    "consecutive_hysteresis": "bool",
    "min_loss_scale": "int",
    "fp16_master_weights_and_grads": "bool",
}

# Top level: DeepSpeedConfig reads these by name (deepspeed/runtime/config.py and its constants);
# sections without a table here are only checked to be mappings.
DS_TOP = {
    "train_batch_size": "int",
    "train_micro_batch_size_per_gpu": "int",
    "gradient_accumulation_steps": "int",
    "gradient_clipping": "float",
    "steps_per_print": "float",
    "wall_clock_breakdown": "bool",
    "memory_breakdown": "bool",
    "dump_state": "bool",
    "disable_python_gc": "bool",
    "prescale_gradients": "bool",
    "gradient_predivide_factor": "float",
    "communication_data_type": "any",
    "sparse_gradients": "bool",
    "disable_allgather": "bool",
    "zero_allow_untested_optimizer": "bool",
    "zero_force_ds_cpu_optimizer": "bool",
    "dataloader_drop_last": "bool",
    "seq_parallel_communication_data_type": "any",
    "zero_optimization": "dict_or_bool",
    "bf16": "dict",
    "bfloat16": "dict",
    "fp16": "dict",
    "amp": "dict",
    "optimizer": "dict",
    "scheduler": "dict",
    "activation_checkpointing": "dict",
    "flops_profiler": "dict",
    "tensorboard": "dict",
    "wandb": "dict",
    "csv_monitor": "dict",
    "comet": "dict",
    "comms_logger": "dict",
    "autotuning": "dict",
    "checkpoint": "dict",
    "data_types": "dict",
    "aio": "dict",
    "elasticity": "dict",
    "pipeline": "dict",
    "data_efficiency": "dict",
    "compression_training": "dict",
    "curriculum_learning": "dict",
    "hybrid_engine": "dict",
    "compile": "dict",
    "tensor_parallel": "dict",
    "torch_autocast": "dict",
    "timers": "dict",
    "nebula": "dict",
    "weight_quantization": "dict",
    "expert_parallel": "dict",
}
DS_SECTIONS = {
    "zero_optimization": ZERO,
    "zero_optimization.offload_param": OFFLOAD_PARAM,
    "zero_optimization.offload_optimizer": OFFLOAD_OPTIMIZER,
    "bf16": BF16,
    "bfloat16": BF16,
    "fp16": FP16,
}

# Values transformers' HfTrainerDeepSpeedConfig fills for "auto" (accelerate fills a subset).
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

# accelerate.commands.config.config_args.ClusterConfig fields (BaseConfig's included).
ACCELERATE_KEYS = {
    "compute_environment": "str",
    "distributed_type": "str",
    "mixed_precision": "str",
    "use_cpu": "bool",
    "debug": "bool",
    "num_processes": "int_or_minus1",
    "machine_rank": "int",
    "num_machines": "int",
    "gpu_ids": "any",
    "main_process_ip": "str",
    "main_process_port": "int",
    "rdzv_backend": "str",
    "same_network": "bool",
    "main_training_function": "str",
    "enable_cpu_affinity": "bool",
    "fp8_config": "dict",
    "deepspeed_config": "dict",
    "fsdp_config": "dict",
    "parallelism_config": "dict",
    "megatron_lm_config": "dict",
    "mpirun_config": "dict",
    "downcast_bf16": "any",
    "tpu_name": "str",
    "tpu_zone": "str",
    "tpu_use_cluster": "bool",
    "tpu_use_sudo": "bool",
    "command_file": "str",
    "commands": "list",
    "tpu_vm": "list",
    "tpu_env": "list",
    "dynamo_config": "dict",
}
# Keys of the YAML's deepspeed_config that `accelerate launch` understands (its --flags).
ACCELERATE_DS_KEYS = {
    k: "any"
    for k in (
        "deepspeed_config_file",
        "zero_stage",
        "offload_optimizer_device",
        "offload_param_device",
        "offload_optimizer_nvme_path",
        "offload_param_nvme_path",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "zero3_init_flag",
        "zero3_save_16bit_model",
        "deepspeed_multinode_launcher",
        "deepspeed_hostfile",
        "deepspeed_exclusion_filter",
        "deepspeed_inclusion_filter",
        "deepspeed_moe_layer_cls_names",
    )
}
# Next to deepspeed_config_file these raise in DeepSpeedPlugin._deepspeed_config_checks.
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
# accelerate.utils.constants.DEEPSPEED_MULTINODE_LAUNCHERS (the first is accelerate's default).
DS_MULTINODE_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm")
DISTRIBUTED_TYPES = (
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
    "MULTI_HPU",
    "MULTI_NEURON",
)
MIXED_PRECISIONS = ("no", "fp16", "bf16", "fp8")
