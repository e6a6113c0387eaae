"""SpeedReport: one configuration's predicted speed, the run's length and the network both assume,
as ``plan`` and ``estimate`` report them.

Its own module so that the plan (``plan.py``) and the estimate report (``report.py``) hold the
same object, built by one function, without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerofit.planning.planner import Network
    from zerofit.speed.step_time import StepTime


@dataclass(frozen=True)
class SpeedReport:
    """Seconds per optimizer step and what they give (speed/step_time.py; GRPO's with its
    generation, speed/generation.py), the run's optimizer steps and hours when the dataset size
    is given (planner.run_optimizer_steps), and the network the step time assumes
    (planner.network_of). The defaults: nothing predicted (a preset's model-free plan)."""

    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    time_breakdown: dict[str, float] | None = None
    optimizer_steps: int | None = None
    run_time_h: float | None = None
    interconnect: str = ""  # the GPUs' link inside a node: nvlink | pcie
    intra_node_gbps: float = 0.0  # GB/s per GPU, one direction
    inter_node_gbps: float = 0.0  # Gbit/s per node

    def as_json(self, key_order: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The fields under their own names, in ``key_order`` (default: the fields' order)."""
        out: dict[str, Any] = {}
        for name in key_order or SPEED_FIELDS:
            value = getattr(self, name)
            out[name] = dict(value) if isinstance(value, dict) else value  # a copy, as asdict's
        return out


SPEED_FIELDS = tuple(item.name for item in fields(SpeedReport))


def build_speed_report(
    step: StepTime, optimizer_steps: int | None, network: Network
) -> SpeedReport:
    """The report of one predicted step, rounded as ``plan`` and ``estimate`` print it: the run's
    hours are ``optimizer_steps`` x the step's seconds (None without a dataset size)."""
    from zerofit.planning.planner import run_hours

    run_time_h = run_hours(optimizer_steps, step.total_s)
    return SpeedReport(
        step_time_s=round(step.total_s, 3),
        tokens_per_s_per_gpu=round(step.tokens_per_s_per_gpu, 1),
        mfu=round(step.mfu, 3),
        time_breakdown=step.breakdown(),
        optimizer_steps=optimizer_steps,
        run_time_h=None if run_time_h is None else round(run_time_h, 4),
        interconnect=network.interconnect,
        intra_node_gbps=network.intra_node_gbps,
        inter_node_gbps=network.inter_node_gbps,
    )
