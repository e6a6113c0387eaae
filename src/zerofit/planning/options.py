"""The planner's vocabulary: one training option (stage x offload x checkpointing, and on more
than one node ZeRO++) and the grid of options a plan searches.

An option is what makes two configurations of the same model and batch differ in memory and
speed, before the micro batch is chosen. The grid is every option DeepSpeed accepts; the user's
overrides narrow it.

ZeRO++ (``zero_plus``) is DeepSpeed's hierarchical ZeRO-3, read by its config class
``DeepSpeedZeroConfig`` (deepspeed/runtime/zero/config.py: ``zero_hpz_partition_size``,
``zero_quantized_weights``, ``zero_quantized_gradients``):

- ``hpz``: a secondary 16-bit copy of the parameters partitioned inside each node
  (partition_parameters.py ``Init._partition_param_sec``), so backward's all-gather stays on the
  node's link (``Init._all_gather`` switches to ``zero_param_process_group``);
- ``hpz+qwz+qgz``: also the weights all-gathered in int8 (``CUDAQuantizer.quantize``) and the
  gradients reduced by an int4 two-level all-to-all (runtime/comm/coalesced_collectives.py
  ``all_to_all_quant_reduce``) instead of a reduce-scatter.

It exists only at stage 3 and only pays across nodes (the qgZ path runs only when
``num_nodes > 1``: stage3.py ``__avg_scatter_grads``), so the grid offers it only there, with the
partition the size of a node (``zero_hpz_partition_size`` = GPUs per node, as DeepSpeed's ZeRO++
tutorial sets it). Parameters stay on the GPU: offloaded, the secondary copy would live on the
host (``Init.remote_device``) and the backward gather would start from there.

MiCS (``mics_shard_size``) is not an option: DeepSpeed 0.19 removed it and refuses a config that
names it (deepspeed/runtime/config.py ``_REMOVED_ZERO_CONFIG_KEYS``).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerofit.errors import ZerofitError
from zerofit.planning.answers import Answers

# ZeRO++ choices, the plain ZeRO-3 first
ZERO_PLUS = ("none", "hpz", "hpz+qwz+qgz")
# how labels and reasons name them
ZERO_PLUS_LABELS = {"hpz": "hpZ", "hpz+qwz+qgz": "hpZ/qwZ/qgZ"}


@dataclass(frozen=True)
class TrainingOption:
    """One ZeRO configuration to estimate: the stage, where the optimizer states and the
    parameters live, and whether activations are recomputed in backward."""

    stage: int
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme (stage 3 only)
    gradient_checkpointing: bool = False
    zero_plus: str = "none"  # none | hpz | hpz+qwz+qgz (stage 3, more than one node)

    @property
    def offloaded(self) -> bool:
        """Something lives off the GPU (optimizer states or parameters)."""
        return self.offload_optimizer != "none" or self.offload_param != "none"

    @property
    def hpz(self) -> bool:
        """ZeRO++'s secondary partition inside the node (``zero_hpz_partition_size`` > 1)."""
        return self.zero_plus.startswith("hpz")

    @property
    def quantized_comm(self) -> bool:
        """ZeRO++'s int8 weight all-gather and int4 gradient all-to-all (qwZ + qgZ)."""
        return "qwz" in self.zero_plus

    @property
    def zero_plus_label(self) -> str:
        """The label's suffix: ' + hpZ/qwZ/qgZ', or nothing for plain ZeRO."""
        label = ZERO_PLUS_LABELS.get(self.zero_plus)
        return f" + {label}" if label else ""


def _offloads_of_stage(stage: int) -> list[tuple[str, str]]:
    """(offload_optimizer, offload_param) pairs the planner tries at ``stage``: none; the
    optimizer on the CPU from stage 1; both on the CPU at stage 3 (nvme only when asked)."""
    offloads = [("none", "none")]
    if stage >= 1:
        offloads.append(("cpu", "none"))
    if stage == 3:
        offloads.append(("cpu", "cpu"))
    return offloads


def _zero_plus_of(stage: int, offload_param: str, num_nodes: int) -> tuple[str, ...]:
    """ZeRO++ choices at ``stage``: plain ZeRO, and across nodes with the parameters on the GPU
    also hpZ and hpZ with quantized communication (see the module docstring)."""
    if stage == 3 and offload_param == "none" and num_nodes > 1:
        return ZERO_PLUS
    return ("none",)


def all_options(num_nodes: int = 1) -> tuple[TrainingOption, ...]:
    """Every option the planner compares (the alternatives table), in the grid's order; on more
    than one node the stage-3 options with the parameters on the GPU also come with ZeRO++."""
    return tuple(
        TrainingOption(stage, offload_optimizer, offload_param, checkpointing, zero_plus)
        for stage in (0, 1, 2, 3)
        for offload_optimizer, offload_param in _offloads_of_stage(stage)
        for zero_plus in _zero_plus_of(stage, offload_param, num_nodes)
        for checkpointing in (False, True)
    )


def _user_offload(answers: Answers, stage: int) -> list[tuple[str, str]]:
    """The user's offload at ``stage``, or nothing when that stage cannot run it."""
    offload_optimizer = answers.offload_optimizer or "none"
    offload_param = answers.offload_param or "none"
    if answers.offload_optimizer is None and offload_param != "none":
        offload_optimizer = offload_param  # DeepSpeed offloads the optimizer with the parameters
    optimizer_ok = stage >= 1 or offload_optimizer == "none"
    param_ok = stage == 3 or offload_param == "none"
    return [(offload_optimizer, offload_param)] if optimizer_ok and param_ok else []


def allowed_options(answers: Answers) -> tuple[TrainingOption, ...]:
    """The options the user's overrides (stage, offload, checkpointing) leave, in grid order
    (with ZeRO++ where ``all_options`` has it: stage 3 on more than one node)."""
    options = []
    for stage in (0, 1, 2, 3):
        if answers.stage is not None and stage != answers.stage:
            continue
        offloads = _offloads_of_stage(stage)
        if answers.offload_optimizer or answers.offload_param:
            offloads = _user_offload(answers, stage)
        for offload_optimizer, offload_param in offloads:
            for zero_plus in _zero_plus_of(stage, offload_param, answers.num_nodes):
                for checkpointing in (False, True):
                    if answers.gradient_checkpointing not in (None, checkpointing):
                        continue
                    options.append(
                        TrainingOption(
                            stage, offload_optimizer, offload_param, checkpointing, zero_plus
                        )
                    )
    if not options:
        raise ZerofitError(
            "offload_param",
            f"offloading parameters needs ZeRO stage 3, not {answers.stage}",
            "use --stage 3 or --offload-param none",
        )
    return tuple(options)
