"""The planner's vocabulary: one training option (stage x offload x checkpointing) and the grid
of options a plan searches.

An option is what makes two configurations of the same model and batch differ in memory and
speed, before the micro batch is chosen. The grid is every option DeepSpeed accepts; the user's
overrides narrow it.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerofit.errors import ZerofitError
from zerofit.planning.answers import Answers


@dataclass(frozen=True)
class TrainingOption:
    """One ZeRO configuration to estimate: the stage, where the optimizer states and the
    parameters live, and whether activations are recomputed in backward."""

    stage: int
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme (stage 3 only)
    gradient_checkpointing: bool = False

    @property
    def offloaded(self) -> bool:
        """Something lives off the GPU (optimizer states or parameters)."""
        return self.offload_optimizer != "none" or self.offload_param != "none"


def _offloads_of_stage(stage: int) -> list[tuple[str, str]]:
    """(offload_optimizer, offload_param) pairs the planner tries at ``stage``: none; the
    optimizer on the CPU from stage 1; both on the CPU at stage 3 (nvme only when asked)."""
    offloads = [("none", "none")]
    if stage >= 1:
        offloads.append(("cpu", "none"))
    if stage == 3:
        offloads.append(("cpu", "cpu"))
    return offloads


def all_options() -> tuple[TrainingOption, ...]:
    """Every option the planner compares (the alternatives table), in the grid's order."""
    return tuple(
        TrainingOption(stage, offload_optimizer, offload_param, checkpointing)
        for stage in (0, 1, 2, 3)
        for offload_optimizer, offload_param in _offloads_of_stage(stage)
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
    """The options the user's overrides (stage, offload, checkpointing) leave, in grid order."""
    options = []
    for stage in (0, 1, 2, 3):
        if answers.stage is not None and stage != answers.stage:
            continue
        offloads = _offloads_of_stage(stage)
        if answers.offload_optimizer or answers.offload_param:
            offloads = _user_offload(answers, stage)
        for offload_optimizer, offload_param in offloads:
            for checkpointing in (False, True):
                if answers.gradient_checkpointing not in (None, checkpointing):
                    continue
                options.append(
                    TrainingOption(stage, offload_optimizer, offload_param, checkpointing)
                )
    if not options:
        raise ZerofitError(
            "offload_param",
            f"offloading parameters needs ZeRO stage 3, not {answers.stage}",
            "use --stage 3 or --offload-param none",
        )
    return tuple(options)
