"""How a verdict is worded, for ``plan``, ``estimate`` and the wizard alike: what the GPU must
hold against its budget, the host RAM offload needs against the node's and where that number
comes from, and the caution for a fit too tight for a long run.

Numbers are GiB with one decimal; a verdict names both sides of every comparison it makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerofit.memory.overheads import FRAGMENTATION_AT_OOM_MEDIAN_GIB

if TYPE_CHECKING:
    from zerofit.planning.plan import Plan
    from zerofit.planning.planner import BudgetCheck, Candidate
    from zerofit.planning.report import EstimateReport


def gib(value: float) -> str:
    """``12.3 GiB``."""
    return f"{value:.1f} GiB"


def host_ram_words(ram_gib: float, source: str) -> str:
    """Where the host RAM number comes from: 'this node has 62.4 GiB', 'you gave 512.0 GiB' or
    'assumed 64.0 GiB; set --host-ram-gib'."""
    if source == "this node":
        return f"this node has {gib(ram_gib)}"
    if source == "given":
        return f"you gave {gib(ram_gib)}"
    return f"assumed {gib(ram_gib)}; set --host-ram-gib"


def host_need_words(cpu_gib: float, ram_gib: float, source: str) -> str:
    """'141.9 GiB of host RAM per node, you gave 64.0 GiB'."""
    return f"{gib(cpu_gib)} of host RAM per node, {host_ram_words(ram_gib, source)}"


def budget_verdict(check: BudgetCheck, emphatic: bool = False) -> str:
    """Why a configuration fits, or which budget it breaks, with both sides of each comparison.
    ``emphatic``: 'does NOT fit', as a command's own verdict line says it."""
    gpu = f"{gib(check.gpu_need_gib)} per GPU of {gib(check.budget_gib)}"
    host = host_need_words(check.cpu_gib, check.host_ram_gib, check.host_ram_source)
    does_not_fit = "does NOT fit" if emphatic else "does not fit"
    if check.fits:
        line = f"fits: needs {gpu} ({gib(check.spare_gib)} to spare)"
        return line + (f", and {host}" if check.cpu_gib > 0 else "")
    if check.gpu_fits:
        lead = "does NOT fit: " if emphatic else ""
        return f"{lead}fits on the GPU ({gpu}) but needs {host}"
    if check.host_fits:
        return f"{does_not_fit} on the GPU: needs {gpu}"
    return f"{does_not_fit}: needs {gpu} and {host}"


def tight_words(candidate: Candidate) -> str:
    """Why a candidate that fits was passed over: it leaves less than long runs lose."""
    return (
        f"fits with only {gib(candidate.spare_gib)} to spare, under the "
        f"{FRAGMENTATION_AT_OOM_MEDIAN_GIB} GiB that public OOM messages show long runs lose to "
        "fragmentation"
    )


def estimate_verdict(report: EstimateReport) -> str:
    """``zerofit estimate``'s verdict line; when only pinned offload buffers break the node's RAM,
    it says that unpinned ones fit and which flag writes them."""
    line = budget_verdict(report.budget_check(), emphatic=True)
    unpinned = report.cpu_gib_unpinned
    if report.fits_gpu and not report.fits_host and unpinned is not None:
        if unpinned <= report.host_ram_gib:
            line += (
                f"; with pin_memory false in the offload blocks (--no-pin-memory) it needs "
                f"{gib(unpinned)}, which fits"
            )
    return line


def plan_verdict(plan: Plan) -> str:
    """``zerofit plan``'s short verdict (its heading shows the GPU numbers beside it)."""
    if plan.fits:
        return "fits"
    if plan.failing_budget == "host":
        need = host_need_words(plan.cpu_gib, plan.host_ram_gib, plan.host_ram_source)
        return f"does NOT fit: fits on the GPU but needs {need}"
    if plan.failing_budget == "gpu":
        return "does NOT fit on the GPU"
    ram = host_ram_words(plan.host_ram_gib, plan.host_ram_source)
    return f"does NOT fit: neither the GPU nor the host RAM ({ram})"


def duration_words(hours: float) -> str:
    """'40 min', '5.7 h', '3.2 days (77 h)'."""
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} days ({hours:.0f} h)"


def step_time_words(
    step_time_s: float | None,
    tokens_per_s_per_gpu: float | None,
    mfu: float | None,
    workload: str,
) -> str:
    """'~1.93 s per optimizer step, 4,250 tokens/s per GPU, MFU 41%' (speed/step_time.py), or
    why there is no prediction."""
    if step_time_s is None or tokens_per_s_per_gpu is None or mfu is None:
        return f"not estimated for {workload} (generation time is not modeled)"
    return (
        f"~{step_time_s:.2f} s per optimizer step, {tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
        f"MFU {mfu:.0%}"
    )


def run_time_words(run_time_h: float | None, optimizer_steps: int | None) -> str | None:
    """'the run: 1,200 optimizer steps, ~5.7 h'; None without a dataset size or a step time."""
    if run_time_h is None or optimizer_steps is None:
        return None
    return f"the run: {optimizer_steps:,} optimizer steps, ~{duration_words(run_time_h)}"


def speed_words(plan: Plan) -> str:
    """The plan's predicted speed and, with a dataset size, the run's length, in one line."""
    speed = plan.speed
    line = "predicted: " + step_time_words(
        speed.step_time_s, speed.tokens_per_s_per_gpu, speed.mfu, plan.answers.workload
    )
    run = run_time_words(speed.run_time_h, speed.optimizer_steps)
    if run:
        line += f"; {run}"
    elif speed.step_time_s is not None:
        line += "; give --dataset-tokens (or --dataset-samples) for the run's time"
    return line


def network_words(plan: Plan) -> str:
    """The network the step times assume: 'NVLink 450 GB/s per GPU; 100 Gbit/s between nodes
    (assumed: set --inter-node-gbps or --cluster-facts)'."""
    speed = plan.speed
    link = "NVLink" if speed.interconnect == "nvlink" else "PCIe"
    words = f"{link} {speed.intra_node_gbps:g} GB/s per GPU"
    if plan.answers.num_nodes > 1:
        words += f"; {speed.inter_node_gbps:g} Gbit/s between nodes"
        if plan.answers.inter_node_gbps is None:
            words += " (assumed: set --inter-node-gbps or --cluster-facts)"
    return words


def plan_warning(plan: Plan) -> str | None:
    """The wizard's warning under a plan that does not fit; None when it fits."""
    if plan.fits:
        return None
    if plan.failing_budget == "host":
        return (
            f"warning: this plan fits on the GPU but needs {gib(plan.cpu_gib)} of "
            f"host RAM per node for offload ({plan.host_ram_source}: {gib(plan.host_ram_gib)}); "
            "the node will run out of memory. You may still accept it."
        )
    return (
        "warning: this plan is estimated NOT to fit in GPU memory; it will likely OOM. "
        "You may still accept it."
    )
