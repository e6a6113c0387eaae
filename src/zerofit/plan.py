"""Plan: the resolved configuration (stage, offload, batch arithmetic) with a reason per decision.

CONTRACT (shared by builders, wizard, launch): the dataclass fields below are stable.
`plan(answers)` is implemented by the planner work; keep its signature.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .answers import Answers
from .hardware import GpuSpec


@dataclass(frozen=True)
class Decision:
    field: str        # e.g. "stage"
    value: Any
    reason: str       # one sentence


@dataclass(frozen=True)
class Alternative:
    stage: int
    offload_optimizer: str
    offload_param: str
    gradient_checkpointing: bool
    micro_batch: int
    peak_gib: float
    fits: bool


@dataclass(frozen=True)
class Plan:
    answers: Answers
    gpu: GpuSpec
    model_name: str
    params: int                 # total parameters
    hidden_size: int
    precision: str              # bf16 | fp16 | fp32
    world_size: int
    stage: int
    offload_optimizer: str      # none | cpu | nvme
    offload_param: str          # none | cpu | nvme
    gradient_checkpointing: bool
    micro_batch: int
    grad_accum: int
    global_batch: int           # micro_batch * grad_accum * world_size, always
    peak_gib: float             # predicted per-GPU peak of torch.cuda.max_memory_allocated()
    fits: bool
    breakdown_gib: dict[str, float] = field(default_factory=dict)
    cpu_gib: float = 0.0
    decisions: tuple[Decision, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    suggestions: tuple[str, ...] = ()  # what would fit, when nothing does


def plan(answers: Answers) -> Plan:
    """Resolve ``answers`` into the fastest configuration that fits, with reasons."""
    raise NotImplementedError("planner not implemented yet")
