"""The planner's speed side: the network a plan assumes, the fastest fit it picks, and the
run's optimizer steps from the dataset size."""

from __future__ import annotations

import pytest
from memory_shapes import QWEN25_7B

from zerofit.errors import ZerofitError
from zerofit.hardware import lookup
from zerofit.planning.answers import Answers
from zerofit.planning.plan import plan
from zerofit.planning.planner import (
    NEAR_TIE,
    network_of,
    run_hours,
    run_optimizer_steps,
    sequences_per_epoch,
)


def test_the_network_is_the_catalogs_unless_the_answers_say_otherwise():
    h100, a100, rtx3090 = lookup("H100-SXM"), lookup("A100-80GB"), lookup("RTX3090")
    auto = network_of(Answers(), h100, 8)
    assert (auto.interconnect, auto.intra_node_gbps, auto.inter_node_gbps) == ("nvlink", 450, 100)
    assert auto.inter_source == "default"
    # PCIe on an NVLink part: its own PCIe generation at x16 (Gen5 on Hopper, Gen4 on Ampere)
    assert network_of(Answers(interconnect="pcie"), h100, 8).intra_node_gbps == 64
    assert network_of(Answers(interconnect="pcie"), a100, 8).intra_node_gbps == 32
    # an NVLink bridge joins two cards; with four the ring still crosses PCIe
    assert network_of(Answers(gpu="RTX3090", interconnect="nvlink"), rtx3090, 2).intra_node_gbps
    bridged = Answers(gpu="RTX3090", interconnect="nvlink")
    assert network_of(bridged, rtx3090, 4).intra_node_gbps == 32
    measured = network_of(Answers(intra_node_gbps=20.0, inter_node_gbps=25.0), h100, 8)
    assert (measured.intra_node_gbps, measured.inter_node_gbps) == (20.0, 25.0)
    assert (measured.intra_source, measured.inter_source) == ("given", "given")


def test_a_target_length_for_a_decoder_only_model_is_refused_in_one_line():
    """``target_len`` is an encoder-decoder's; plan and estimate refuse it for any other model
    instead of counting a length the model never sees."""
    from zerofit.planning.report import build_estimate_report

    answers = Answers(model="qwen2.5-0.5b", target_len=128)
    for run in (plan, build_estimate_report):
        with pytest.raises(ZerofitError) as refused:
            run(answers)
        assert refused.value.render() == (
            "target_len: applies to encoder-decoder models only (T5); qwen2.5-0.5b (qwen2) "
            "reads one sequence (fix: drop --target-len; a decoder-only model's prompt and "
            "answer are both in --seq-len)"
        )


def test_nvlink_on_a_card_without_it_is_refused_naming_the_fix():
    with pytest.raises(ZerofitError, match="interconnect: .*has no NVLink.*--interconnect pcie"):
        plan(Answers(gpu="L40S", gpus_per_node=2, interconnect="nvlink"), model=QWEN25_7B)


@pytest.mark.parametrize(
    "answers",
    [
        Answers(gpu="H100-SXM", seq_len=2048, host_ram_gib=512.0),
        Answers(gpu="A100-80GB", gpus_per_node=8, num_nodes=2, seq_len=4096, inter_node_gbps=10),
        Answers(gpu="L40S", gpus_per_node=4, seq_len=2048, host_ram_gib=512.0),
    ],
)
def test_the_plan_is_the_predicted_fastest_fit_up_to_a_near_tie(answers):
    p = plan(answers, model=QWEN25_7B)
    fitting = [a.step_time_s for a in p.alternatives if a.fits]
    assert p.fits and p.speed.step_time_s <= min(fitting) * (1 + NEAR_TIE) + 1e-9
    reasons = " ".join(d.reason for d in p.decisions)
    assert "s/step" in reasons


def test_a_slow_network_between_nodes_slows_the_step_and_the_plan_says_which_it_assumed():
    base = Answers(gpu="A100-80GB", gpus_per_node=8, num_nodes=2, seq_len=4096, stage=3)
    fast, slow = plan(base, model=QWEN25_7B), plan(base.replace(inter_node_gbps=10.0), QWEN25_7B)
    assert (fast.speed.inter_node_gbps, slow.speed.inter_node_gbps) == (100.0, 10.0)
    assert slow.speed.step_time_s > fast.speed.step_time_s
    exposed = [one.speed.time_breakdown["exposed_comm_s"] for one in (fast, slow)]
    assert exposed[1] > exposed[0]


def test_pcie_inside_the_node_slows_a_multi_gpu_step():
    base = Answers(gpu="A100-80GB", gpus_per_node=8, seq_len=2048, stage=3)
    nvlink, pcie = plan(base, QWEN25_7B), plan(base.replace(interconnect="pcie"), QWEN25_7B)
    assert (nvlink.speed.interconnect, pcie.speed.interconnect) == ("nvlink", "pcie")
    assert pcie.speed.step_time_s > nvlink.speed.step_time_s


def test_sequences_per_epoch_follow_tokens_packing_or_padding():
    assert sequences_per_epoch(Answers(dataset_tokens=10_000), 1000) == 10
    assert sequences_per_epoch(Answers(dataset_tokens=10_001), 1000) == 11
    assert sequences_per_epoch(Answers(), 1000) is None
    # padded (the collators' default): one sample per sequence, whatever its length
    assert sequences_per_epoch(Answers(dataset_samples=300, avg_seq_len=100), 1000) == 300
    # packed: the samples' tokens fill sequences of seq_len; a longer sample is truncated
    packed = Answers(dataset_samples=300, avg_seq_len=100, padding=False)
    assert sequences_per_epoch(packed, 1000) == 30
    assert sequences_per_epoch(packed.replace(avg_seq_len=5000), 1000) == 300
    # grpo: each prompt gives num_generations completions
    grpo = Answers(workload="grpo", dataset_samples=100, num_generations=8, seq_len=1024)
    assert sequences_per_epoch(grpo, 1024) == 800


def test_the_runs_steps_and_hours():
    answers = Answers(dataset_tokens=2048 * 1000, epochs=2.5)
    # 1000 sequences, 16 per step: 63 steps an epoch (the last one partial), 2.5 epochs
    assert run_optimizer_steps(answers, 2048, 16) == 158
    assert run_hours(158, 3.6) == pytest.approx(0.158)
    assert run_hours(None, 3.6) is None and run_hours(10, None) is None


def test_plan_reports_the_run_time_from_the_dataset_size():
    p = plan(Answers(gpu="H100-SXM", seq_len=2048, dataset_tokens=2048 * 12_800), QWEN25_7B)
    assert p.speed.optimizer_steps == 12_800 // p.global_batch
    speed = p.speed
    assert speed.run_time_h == pytest.approx(
        speed.optimizer_steps * speed.step_time_s / 3600, rel=0.01
    )
    assert all(a.run_time_h is not None for a in p.alternatives)
    assert plan(Answers(gpu="H100-SXM", seq_len=2048), QWEN25_7B).speed.run_time_h is None


def test_grpo_plans_time_the_step_with_its_generation():
    p = plan(Answers(gpu="H100-SXM", workload="grpo", seq_len=1024, num_generations=4), QWEN25_7B)
    assert p.speed.step_time_s > 0 and p.speed.time_breakdown["generation_s"] > 0
    assert all(a.step_time_s is not None for a in p.alternatives)


def test_a_suggestions_fastest_fit_offers_zero_plus_on_the_nodes_it_spans():
    """``fastest_fit`` (what a suggestion quotes) searches the grid of the world it is given: on
    two nodes over a slow network ZeRO++'s int8 gathers and int4 gradients beat every plain
    option, and on one node ZeRO++ is never offered (it only pays across nodes)."""
    from zerofit.planning.options import all_options
    from zerofit.planning.planner import evaluate_grid, fastest_fit, fastest_of, plan_inputs

    gpu = lookup("A100-80GB")
    answers = Answers(
        gpu="A100-80GB",
        gpus_per_node=8,
        num_nodes=2,
        seq_len=2048,
        inter_node_gbps=10.0,
        host_ram_gib=1024.0,
    )
    inputs = plan_inputs(QWEN25_7B, answers, gpu, "bf16", 1)
    fit = fastest_fit(inputs)
    fitting = [c for c in evaluate_grid(inputs, all_options(2), [1]) if c.fits]
    assert fit.option == fastest_of(fitting).option
    assert fit.option.zero_plus == "hpz+qwz+qgz"
    one_node = fastest_fit(inputs.vary(world_size=8))
    assert one_node is not None and one_node.option.zero_plus == "none"
