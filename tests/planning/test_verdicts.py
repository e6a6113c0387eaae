"""One wording of a verdict for plan, estimate and the wizard: both sides of each comparison,
and where the host RAM number comes from.

Run: .venv/bin/python -m pytest tests/planning/test_verdicts.py -q   (~2 s)
"""

from __future__ import annotations

import pytest

from zerofit.planning.answers import Answers
from zerofit.planning.planner import BudgetCheck
from zerofit.planning.verdicts import (
    budget_verdict,
    estimate_verdict,
    host_ram_words,
    plan_verdict,
    plan_warning,
)


def check(gpu_fits: bool, host_fits: bool, cpu_gib: float = 138.7) -> BudgetCheck:
    return BudgetCheck(
        gpu_fits=gpu_fits,
        host_fits=host_fits,
        gpu_need_gib=26.1,
        budget_gib=44.4,
        spare_gib=18.3,
        cpu_gib=cpu_gib,
        host_ram_gib=64.0,
        host_ram_source="given",
    )


@pytest.mark.parametrize(
    "source, words",
    [
        ("this node", "this node has 62.4 GiB"),
        ("given", "you gave 62.4 GiB"),
        ("assumed", "assumed 62.4 GiB; set --host-ram-gib"),
    ],
)
def test_the_host_ram_says_where_it_comes_from(source, words):
    assert host_ram_words(62.4, source) == words


def test_a_verdict_names_the_budget_that_fails_with_both_numbers():
    gpu = "26.1 GiB per GPU of 44.4 GiB"
    host = "138.7 GiB of host RAM per node, you gave 64.0 GiB"
    assert budget_verdict(check(True, True, cpu_gib=0.0)) == (
        f"fits: needs {gpu} (18.3 GiB to spare)"
    )
    assert budget_verdict(check(True, True)) == f"fits: needs {gpu} (18.3 GiB to spare), and {host}"
    assert budget_verdict(check(True, False)) == f"fits on the GPU ({gpu}) but needs {host}"
    assert budget_verdict(check(False, True)) == f"does not fit on the GPU: needs {gpu}"
    assert budget_verdict(check(False, False)) == f"does not fit: needs {gpu} and {host}"
    # a command's own verdict line stresses the negative
    assert budget_verdict(check(True, False), emphatic=True).startswith("does NOT fit: fits on")
    assert budget_verdict(check(False, True), emphatic=True).startswith("does NOT fit on the GPU")


def test_plan_estimate_and_wizard_word_one_verdict_alike():
    """Qwen2.5-7B on one L40S with the optimizer on the CPU and 64 GiB of RAM: the GPU holds it,
    the node's RAM does not. plan, estimate and the wizard all say so, with the same numbers."""
    from zerofit.planning.plan import plan
    from zerofit.planning.report import build_estimate_report

    answers = Answers(
        model="qwen2.5-7b",
        gpu="L40S",
        seq_len=2048,
        host_ram_gib=64.0,
        stage=2,
        offload_optimizer="cpu",
        gradient_checkpointing=True,
        micro_batch=1,
        global_batch=1,
    )
    planned, report = plan(answers), build_estimate_report(answers)
    assert planned.fits == report.fits is False and report.fits_gpu and not report.fits_host
    assert planned.gpu_need_gib == pytest.approx(report.gpu_need_gib, abs=0.01)
    need = f"{report.cpu_gib:.1f} GiB of host RAM per node, you gave 64.0 GiB"
    assert plan_verdict(planned) == f"does NOT fit: fits on the GPU but needs {need}"
    assert estimate_verdict(report).startswith("does NOT fit: fits on the GPU (")
    assert estimate_verdict(report).endswith(f"but needs {need}")
    warning = plan_warning(planned)
    assert warning and f"needs {report.cpu_gib:.1f} GiB of host RAM" in warning
    assert "given: 64.0 GiB" in warning
    assert plan_warning(plan(answers.replace(host_ram_gib=512.0))) is None


def test_estimate_names_the_unpinned_need_when_only_that_fits():
    """Qwen2.5-32B, ZeRO-3 with the optimizer on the CPU, 600 GiB of RAM: pinned buffers round
    up past it (memory/pinned.py), unpinned ones fit, and the verdict names the flag."""
    from zerofit.planning.report import build_estimate_report

    answers = Answers(
        model="qwen2.5-32b",
        gpu="H100-NVL",
        stage=3,
        offload_optimizer="cpu",
        gradient_checkpointing=True,
        host_ram_gib=600.0,
    )
    report = build_estimate_report(answers)
    assert report.cpu_gib_unpinned < 600.0 < report.cpu_gib
    line = estimate_verdict(report)
    assert f"(--no-pin-memory) it needs {report.cpu_gib_unpinned:.1f} GiB, which fits" in line
    assert "--no-pin-memory" not in estimate_verdict(
        build_estimate_report(answers.replace(host_ram_gib=400.0))
    )
