"""build_zero_config(plan) -> the DeepSpeed JSON as a dict (DeepSpeed's own key names, verbatim).

Two flavours (``plan.answers.flavour``):

* ``explicit``: every number written out, for plain accelerate/DeepSpeed scripts. DeepSpeed asserts
  ``train_batch_size == micro × accumulation × world``, so all three are written from the plan,
  which keeps that identity by construction. Precision is a plain ``true``.
* ``auto``: ``"auto"`` for every value the HF Trainer / TRL / accelerate fill from the user's own
  arguments, so the same file runs whatever ``--bf16``/``--fp16``/batch flags the user passes.
  The per-key decision, from the clients' code (transformers 5.x ``integrations/deepspeed.py``
  ``HfTrainerDeepSpeedConfig.trainer_config_process`` / ``trainer_config_finalize``; accelerate 1.x
  ``Accelerator._prepare_deepspeed`` and ``DeepSpeedPlugin.set_mixed_precision``):

  - ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``train_batch_size``,
    ``gradient_clipping``: ``fill_match`` from ``per_device_train_batch_size``,
    ``gradient_accumulation_steps``, ``max_grad_norm`` (Trainer); from the prepared DataLoader, the
    Accelerator's accumulation and 1.0 (accelerate).
  - ``fp16.enabled`` / ``bf16.enabled``: ``fill_match`` from ``args.fp16`` / ``args.bf16``
    (Trainer); from ``--mixed_precision`` (accelerate ``set_mixed_precision``). Both blocks are
    written, as in the HF docs' templates, fp16 with its dynamic loss-scaling knobs, so either flag
    works.
  - ``optimizer.params.{lr,betas,eps,weight_decay}`` (only with ``--optimizer-block``):
    ``fill_match`` from ``learning_rate``, ``adam_beta1/2``, ``adam_epsilon``, ``weight_decay``.
  - the hidden-size buckets (``reduce_bucket_size``, ``stage3_prefetch_bucket_size``,
    ``stage3_param_persistence_threshold``): filled from the model in ``trainer_config_finalize`` /
    ``_prepare_deepspeed``, not from the user's arguments. Written ``"auto"`` only where that fill
    equals what the memory model counted (stage 3); stage-1/2 buckets stay 5e8, because "auto"
    would turn them into hidden² and change the memory the plan promised.
  - ``stage3_gather_16bit_weights_on_model_save`` stays ``true``: accelerate fills "auto" with
    ``false``, which saves near-empty ZeRO-3 weights.

  The plan's precision is still the one the memory was counted for: the ``_comment`` names the
  flag to pass (``--bf16``); without it the clients train in fp32 (twice the activations).

Optimizer: no ``optimizer`` block by default, so the script's own torch optimizer is used through
accelerate / the Trainer. ``optimizer_block`` (``zerofit config --optimizer-block``) writes an AdamW
block for scripts that call ``deepspeed.initialize`` without an optimizer: explicit numbers are
``torch.optim.AdamW``'s defaults (set ``lr`` to yours), ``"auto"`` in the auto flavour. Without
optimizer offload it sets ``"torch_adam": true``: DeepSpeed then builds ``torch.optim.AdamW``
(``DeepSpeedEngine.get_optimizer_configuration``) instead of JIT-compiling ``fused_adam``, which
needs a CUDA toolchain at run time. With optimizer offload it is left out, so DeepSpeed uses its
``DeepSpeedCPUAdam`` (a torch optimizer there raises unless ``zero_force_ds_cpu_optimizer`` is
false).

Optimizer offload: accelerate 1.15 (``Accelerator._prepare_deepspeed``) swaps a client
``torch.optim.AdamW`` for DeepSpeed's ``DeepSpeedCPUAdam`` (same lr / weight decay, AdamW mode)
whenever ``offload_optimizer.device != "none"``, unless ``zero_force_ds_cpu_optimizer`` is false.
We keep DeepSpeed's default (true): DeepSpeedCPUAdam is the vectorised, multi-threaded CPU step
DeepSpeed's offload path is built and tested for; a torch AdamW stepping the fp32 master copy on the
CPU is several times slower and runs on DeepSpeed's "untested optimizer" path. The cost is a one-off
cpu_adam compilation (~80 s, cached) on first use.

ZeRO++ (``plan.zero_plus``, stage 3 across nodes; planning/options.py): the keys
``DeepSpeedZeroConfig`` reads (deepspeed/runtime/zero/config.py): ``zero_hpz_partition_size``
set to the GPUs of one node (the secondary partition of partition_parameters.py
``Init._partition_param_sec``; DeepSpeed's ZeRO++ tutorial sets it so), and for qwZ/qgZ
``zero_quantized_weights`` and ``zero_quantized_gradients``. The quantized paths run DeepSpeed's
quantizer op (op_builder/quantizer.py ``QuantizerBuilder``, CUDA kernels built at first use), and
qgZ's groups take a node to be every GPU the node shows (utils/groups.py
``_get_local_all_to_all_group``: ``device_count()``); the ``_comment`` says both. MiCS is never
written: DeepSpeed 0.19 refuses ``mics_shard_size`` (runtime/config.py
``_REMOVED_ZERO_CONFIG_KEYS``).
"""

from __future__ import annotations

from typing import Any

from zerofit.errors import ZerofitError
from zerofit.memory.ds_defaults import ds_bucket_sizes, hf_auto_bucket_sizes

# DeepSpeed's fp16 dynamic loss scaling (its documented defaults, written out so users see them;
# the HF docs' zero2/zero3 templates write the same block with "enabled": "auto").
FP16_BLOCK = {
    "enabled": True,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "initial_scale_power": 16,
    "hysteresis": 2,
    "min_loss_scale": 1,
}
# torch.optim.AdamW's own defaults (torch/optim/adamw.py), for the explicit optimizer block.
ADAMW_DEFAULTS = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


def build_zero_config(plan) -> dict[str, Any]:
    """The DeepSpeed config dict for ``plan`` (stage, offload, precision, batch arithmetic).

    Args:
        plan: a ``zerofit.plan.Plan``; ``plan.answers.flavour`` picks explicit numbers or "auto".
    """
    auto = plan.answers.flavour == "auto"
    ds: dict[str, Any] = {"_comment": _comment(plan, auto)}
    if auto:
        ds.update(
            train_batch_size="auto",
            train_micro_batch_size_per_gpu="auto",
            gradient_accumulation_steps="auto",
            gradient_clipping="auto",
        )
    else:
        ds.update(
            train_batch_size=plan.micro_batch * plan.grad_accum * plan.world_size,
            train_micro_batch_size_per_gpu=plan.micro_batch,
            gradient_accumulation_steps=plan.grad_accum,
            gradient_clipping=1.0,
        )
    if auto:
        # Both blocks "auto": the Trainer's --bf16/--fp16 or accelerate's --mixed_precision decide.
        ds["fp16"] = dict(FP16_BLOCK, enabled="auto")
        ds["bf16"] = {"enabled": "auto"}
    elif plan.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        ds["fp16"] = dict(FP16_BLOCK)
    if plan.answers.optimizer_block:
        ds["optimizer"] = build_optimizer_block(plan, auto)
    ds["zero_optimization"] = build_zero_section(plan, auto)
    return ds


def build_optimizer_block(plan, auto: bool = False) -> dict[str, Any]:
    """The DeepSpeed ``optimizer`` block (AdamW): "auto" params, or torch AdamW's defaults."""
    params: dict[str, Any] = {k: "auto" for k in ADAMW_DEFAULTS} if auto else dict(ADAMW_DEFAULTS)
    if plan.offload_optimizer == "none":
        params["torch_adam"] = True  # torch.optim.AdamW instead of JIT-compiled fused_adam
    return {"type": "AdamW", "params": params}


def build_zero_section(plan, auto: bool = False) -> dict[str, Any]:
    """The ``zero_optimization`` block alone."""
    stage = plan.stage
    zero: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return zero
    # overlap_comm hides gradient reduction behind backward; contiguous_gradients avoids
    # fragmentation from many small gradient tensors. Both cost only the buckets counted below.
    zero.update(overlap_comm=True, contiguous_gradients=True)
    auto_resolves_to = hf_auto_bucket_sizes(plan.hidden_size)
    for key, value in ds_bucket_sizes(plan.hidden_size, stage).items():
        resolves_same = auto_resolves_to.get(key) == value
        zero[key] = "auto" if auto and resolves_same else value
    nvme_path = plan.answers.nvme_path
    pin = plan.pin_memory
    if plan.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_block(plan.offload_optimizer, nvme_path, pin)
    if stage == 3:
        # offload_param exists only at stage 3 (DeepSpeed ignores it below; zerofit never writes
        # it there).
        if plan.offload_param != "none":
            zero["offload_param"] = _offload_block(plan.offload_param, nvme_path, pin)
        # Without this, save_model()/save_pretrained under ZeRO-3 writes near-empty weight files.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        zero.update(build_zero_plus_keys(plan))
    return zero


def build_zero_plus_keys(plan) -> dict[str, Any]:
    """ZeRO++'s keys for the plan's ``zero_plus`` (none: no key, DeepSpeed's defaults)."""
    zero_plus = plan.zero_plus
    if zero_plus == "none":
        return {}
    keys: dict[str, Any] = {"zero_hpz_partition_size": plan.answers.gpus_per_node}
    if "qwz" in zero_plus:
        keys["zero_quantized_weights"] = True
    if "qgz" in zero_plus:
        keys["zero_quantized_gradients"] = True
    return keys


def _offload_block(device: str, nvme_path: str | None, pin: bool) -> dict[str, Any]:
    # pin_memory: page-locked host buffers for async full-bandwidth copies (needs enough memlock);
    # the planner turns it off only when the node's RAM holds the buffers unpinned but not pinned
    block: dict[str, Any] = {"device": device, "pin_memory": pin}
    if device == "nvme":
        if not nvme_path:
            raise ZerofitError(
                "nvme_path", "offload to nvme needs a path", "pass --nvme-path /local_nvme"
            )
        block["nvme_path"] = nvme_path
    return block


def _comment(plan, auto: bool) -> str:
    # DeepSpeed reads known top-level keys and ignores the rest, so a "_comment" key is safe at the
    # top level (inside zero_optimization it is not: that section is a pydantic model with
    # extra="forbid").
    parts = [f"zerofit: ZeRO stage {plan.stage}", plan.precision]
    if plan.offload_optimizer != "none":
        parts.append(f"optimizer offload to {plan.offload_optimizer} (DeepSpeedCPUAdam)")
    if plan.stage == 3 and plan.offload_param != "none":
        parts.append(f"parameter offload to {plan.offload_param}")
    zero_plus = plan.zero_plus
    if plan.stage == 3 and zero_plus != "none":
        parts.append(_zero_plus_comment(zero_plus, plan.answers.gpus_per_node))
    if plan.answers.optimizer_block:
        parts.append(
            "AdamW optimizer block" + ("" if auto else " (torch defaults: set lr to yours)")
        )
    if auto:
        flag = {"bf16": "--bf16", "fp16": "--fp16"}.get(plan.precision)
        parts.append(
            '"auto" values are filled by HF Trainer / TRL / accelerate from the '
            "training arguments"
            + (
                f"; pass {flag} (accelerate launch: --mixed_precision {plan.precision}), "
                "the precision this plan was sized for"
                if flag
                else ""
            )
        )
    else:
        parts.append(
            f"train_batch_size = {plan.micro_batch} micro x {plan.grad_accum} accumulation x "
            f"{plan.world_size} GPUs; for plain accelerate/DeepSpeed scripts"
        )
    return "; ".join(parts)


def _zero_plus_comment(zero_plus: str, gpus_per_node: int) -> str:
    """What ZeRO++ does here and what it needs, for the ``_comment``."""
    text = (
        f"ZeRO++ hpZ: a second copy of the parameters sharded over each node's {gpus_per_node} "
        "GPUs, so backward gathers inside the node"
    )
    if "qwz" in zero_plus:
        text += (
            "; qwZ/qgZ: int8 weight gathers and int4 gradient all-to-all, built from DeepSpeed's "
            "quantizer CUDA op at first use, with every GPU a node shows in the job"
        )
    return text
