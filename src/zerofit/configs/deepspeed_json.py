"""build_zero_config(plan) -> the DeepSpeed JSON as a dict (DeepSpeed's own key names, verbatim).

Two flavours (``plan.answers.flavour``):

* ``explicit``: every number written out, for plain accelerate/DeepSpeed scripts. DeepSpeed asserts
  ``train_batch_size == micro × accumulation × world``, so all three are written from the plan,
  which keeps that identity by construction.
* ``auto``: ``"auto"`` where HF Trainer / TRL (through accelerate) fill the value from their
  arguments: batch sizes, accumulation, clipping, and the hidden-size based bucket sizes. A bucket
  is written as ``"auto"`` only when accelerate resolves it to the very number
  ``ds_bucket_sizes`` gives (stage 3); stage-1/2 buckets stay numeric, because "auto" there
  would become hidden² instead of the 5e8 the memory model counts.

Precision is explicit in both flavours: it is a memory decision of the plan, and a silent fp32
fallback ("auto" with a trainer run without ``--bf16``) would double the activations the plan
counted. With a mismatching trainer flag transformers stops with a clear message instead.

No ``optimizer``/``scheduler`` block: the script's own torch optimizer is used through accelerate.
A DeepSpeed optimizer block would force ``DummyOptim`` in user code and JIT-compile fused_adam.

Optimizer offload: accelerate 1.15 (``Accelerator._prepare_deepspeed``) swaps a client
``torch.optim.AdamW`` for DeepSpeed's ``DeepSpeedCPUAdam`` (same lr / weight decay, AdamW mode)
whenever ``offload_optimizer.device != "none"``, unless ``zero_force_ds_cpu_optimizer`` is false.
We keep DeepSpeed's default (true): DeepSpeedCPUAdam is the vectorised, multi-threaded CPU step
DeepSpeed's offload path is built and tested for; a torch AdamW stepping the fp32 master copy on the
CPU is several times slower and runs on DeepSpeed's "untested optimizer" path. The cost is a one-off
cpu_adam compilation (~80 s, cached) on first use.
"""
from __future__ import annotations

from typing import Any

from zerofit.memory.ds_defaults import ds_bucket_sizes
from zerofit.errors import ZerofitError

# What accelerate (Accelerator._prepare_deepspeed) and transformers' HfTrainerDeepSpeedConfig
# substitute for "auto" in these zero_optimization keys, given the model's hidden size.
AUTO_BUCKETS = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}

# DeepSpeed's fp16 dynamic loss scaling (its documented defaults, written out so users see them).
FP16_BLOCK = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
              "hysteresis": 2, "min_loss_scale": 1}


def build_zero_config(plan) -> dict[str, Any]:
    """The DeepSpeed config dict for ``plan`` (stage, offload, precision, batch arithmetic).

    Args:
        plan: a ``zerofit.plan.Plan``; ``plan.answers.flavour`` picks explicit numbers or "auto".
    """
    auto = plan.answers.flavour == "auto"
    ds: dict[str, Any] = {"_comment": _comment(plan, auto)}
    if auto:
        ds.update(train_batch_size="auto", train_micro_batch_size_per_gpu="auto",
                  gradient_accumulation_steps="auto", gradient_clipping="auto")
    else:
        ds.update(train_batch_size=plan.micro_batch * plan.grad_accum * plan.world_size,
                  train_micro_batch_size_per_gpu=plan.micro_batch,
                  gradient_accumulation_steps=plan.grad_accum,
                  gradient_clipping=1.0)
    if plan.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        ds["fp16"] = dict(FP16_BLOCK)
    ds["zero_optimization"] = build_zero_section(plan, auto)
    return ds


def build_zero_section(plan, auto: bool = False) -> dict[str, Any]:
    """The ``zero_optimization`` block alone."""
    stage = plan.stage
    zero: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return zero
    # overlap_comm hides gradient reduction behind backward; contiguous_gradients avoids
    # fragmentation from many small gradient tensors. Both cost only the buckets counted below.
    zero.update(overlap_comm=True, contiguous_gradients=True)
    for key, value in ds_bucket_sizes(plan.hidden_size, stage).items():
        resolves_same = key in AUTO_BUCKETS and AUTO_BUCKETS[key](plan.hidden_size) == value
        zero[key] = "auto" if auto and resolves_same else value
    nvme_path = plan.answers.nvme_path
    if plan.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_block(plan.offload_optimizer, nvme_path)
    if stage == 3:
        # offload_param exists only at stage 3 (DeepSpeed ignores it below; zerofit never writes it there).
        if plan.offload_param != "none":
            zero["offload_param"] = _offload_block(plan.offload_param, nvme_path)
        # Without this, save_model()/save_pretrained under ZeRO-3 writes near-empty weight files.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return zero


def _offload_block(device: str, nvme_path: str | None) -> dict[str, Any]:
    # pin_memory: page-locked host buffers for async full-bandwidth copies (needs enough memlock).
    block: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        if not nvme_path:
            raise ZerofitError("nvme_path", "offload to nvme needs a path", "pass --nvme-path /local_nvme")
        block["nvme_path"] = nvme_path
    return block


def _comment(plan, auto: bool) -> str:
    # DeepSpeed reads known top-level keys and ignores the rest, so a "_comment" key is safe at the top
    # level (inside zero_optimization it is not: that section is a pydantic model with extra="forbid").
    parts = [f"zerofit: ZeRO stage {plan.stage}", plan.precision]
    if plan.offload_optimizer != "none":
        parts.append(f"optimizer offload to {plan.offload_optimizer} (DeepSpeedCPUAdam)")
    if plan.stage == 3 and plan.offload_param != "none":
        parts.append(f"parameter offload to {plan.offload_param}")
    if auto:
        parts.append('"auto" values are filled by HF Trainer / TRL / accelerate from the training arguments')
    else:
        parts.append(f"train_batch_size = {plan.micro_batch} micro x {plan.grad_accum} accumulation x "
                     f"{plan.world_size} GPUs; for plain accelerate/DeepSpeed scripts")
    return "; ".join(parts)
