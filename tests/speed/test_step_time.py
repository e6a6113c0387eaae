"""The speed model's structure: each term moves the way DeepSpeed's execution says it must.

Run: .venv/bin/python -m pytest tests/speed/test_step_time.py -q   (<1 s)
"""

from __future__ import annotations

import dataclasses

import pytest

from zerofit.hardware import lookup
from zerofit.memory.estimate import TrainSetup
from zerofit.models.resolve import resolve_model
from zerofit.speed.device import CpuMeasurements, cpu_profile
from zerofit.speed.step_time import (
    compute_efficiency,
    estimate_step_time,
    ring_seconds,
    stage3_backward_gather_elements,
)

MODEL = resolve_model("qwen2.5-7b")
H100 = lookup("H100-SXM")
ONE_NODE = TrainSetup(stage=2, world_size=8, gpus_per_node=8, micro_batch=2, seq_len=2048)
TWO_NODES = dataclasses.replace(ONE_NODE, world_size=16)


def test_terms_add_up_and_rates_follow_from_the_total():
    step = estimate_step_time(ONE_NODE, MODEL, H100)
    assert sum(step.breakdown().values()) == pytest.approx(step.total_s, abs=1e-3)
    tokens = ONE_NODE.micro_batch * ONE_NODE.seq_len * ONE_NODE.grad_accum
    assert step.tokens_per_s_per_gpu == pytest.approx(tokens / step.total_s)
    assert 0.2 < step.mfu < 0.6


def test_offload_is_slower_than_none_at_equal_micro_batch():
    plain = estimate_step_time(ONE_NODE, MODEL, H100)
    offloaded = estimate_step_time(
        dataclasses.replace(ONE_NODE, offload_optimizer="cpu"), MODEL, H100
    )
    assert offloaded.cpu_optimizer_s > 0 and offloaded.offload_transfer_s > 0
    assert offloaded.gpu_optimizer_s == 0
    # the public rows say 2-14x (tests/data/step_times_public.md)
    assert 1.5 < offloaded.total_s / plain.total_s < 15


def test_zero3_is_slower_than_zero2_on_a_slow_inter_node_link():
    """Per micro step ZeRO-2 all-reduces the gradients (DeepSpeed 0.19's default
    ``use_multi_rank_bucket_allreduce``: two ring passes); ZeRO-3 reduce-scatters them and
    gathers the parameters twice, but for the 7 % that forward keeps for backward (the last
    layers and the head, within ``stage3_max_reuse_distance``). One micro step: ~2.93 buffers
    against 3 (the all-reduce, then the all-gather after the step); four: ~11.7 against 9. The
    real runs over a shaped network (tests/speed/test_shaped_network.py) measure the order."""
    single = estimate_step_time(TWO_NODES, MODEL, H100, inter_node_gbps=10)
    single3 = estimate_step_time(
        dataclasses.replace(TWO_NODES, stage=3), MODEL, H100, inter_node_gbps=10
    )
    assert single3.exposed_comm_s / single.exposed_comm_s == pytest.approx(2.93 / 3, rel=0.02)
    accumulating = dataclasses.replace(TWO_NODES, grad_accum=4)
    zero2 = estimate_step_time(accumulating, MODEL, H100, inter_node_gbps=10)
    zero3 = estimate_step_time(
        dataclasses.replace(accumulating, stage=3), MODEL, H100, inter_node_gbps=10
    )
    assert zero3.exposed_comm_s / zero2.exposed_comm_s == pytest.approx(11.7 / 9, rel=0.02)
    assert zero3.total_s > 1.25 * zero2.total_s


def test_zero3_is_near_zero2_inside_an_nvlink_node():
    """ms-swift's Qwen2.5-14B on 8 A800s: ZeRO-3 10.56 s against ZeRO-2 10.32 s per step."""
    busy = dataclasses.replace(ONE_NODE, micro_batch=1, seq_len=8192, grad_accum=2)
    zero2 = estimate_step_time(busy, MODEL, H100)
    zero3 = estimate_step_time(dataclasses.replace(busy, stage=3), MODEL, H100)
    # the gap is ZeRO-3's per-module hooks, not communication
    assert zero3.total_s == pytest.approx(zero2.total_s, rel=0.15)
    # measured 2 % apart: within the planner's near-tie band, ZeRO-3 not predicted faster
    assert zero3.total_s > 0.98 * zero2.total_s
    assert zero3.exposed_comm_s < 0.05 * zero3.total_s  # NVLink gathers hide under compute


def test_a_slow_network_makes_zero3_across_nodes_many_times_slower():
    """tests/data/step_times_public.md: ZeRO-3 across nodes on 10GbE is 3.5-22x slower (the
    more compute a step has, the less of the gathers' time is added to it)."""
    busy = dataclasses.replace(ONE_NODE, stage=3, micro_batch=1, seq_len=8192, grad_accum=2)
    one_node = estimate_step_time(busy, MODEL, H100)
    across = estimate_step_time(
        dataclasses.replace(busy, world_size=16), MODEL, H100, inter_node_gbps=10
    )
    assert across.total_s / one_node.total_s > 3.5
    assert across.exposed_comm_s > 0.8 * across.total_s


def test_checkpointing_adds_about_a_third_of_compute():
    plain = estimate_step_time(ONE_NODE, MODEL, H100)
    recomputed = estimate_step_time(
        dataclasses.replace(ONE_NODE, gradient_checkpointing=True), MODEL, H100
    )
    assert recomputed.recompute_s / plain.compute_s == pytest.approx(1 / 3, rel=0.1)
    # whole steps: the public rows see +11-26 %; the compute share of a step sets where it lands
    assert 1.1 < recomputed.total_s / plain.total_s < 1.4


def test_more_tokens_per_micro_step_raise_efficiency():
    for gpu in (H100, lookup("A100-80GB"), lookup("RTX4090")):
        rates = [compute_efficiency(gpu, tokens) for tokens in (64, 512, 4096, 32768)]
        assert rates == sorted(rates) and rates[0] < 0.7 * rates[-1]
    short = dataclasses.replace(ONE_NODE, micro_batch=1, seq_len=256)
    small = estimate_step_time(short, MODEL, H100)
    large = estimate_step_time(ONE_NODE, MODEL, H100)
    assert small.mfu < 0.5 * large.mfu  # the fixed costs weigh on short micro steps


def test_a_hopper_part_runs_at_its_own_balance_of_peak_and_bandwidth():
    """The Hopper curve was fitted on the H100 SXM; a part whose tensor peak is cut (H20: 148 of
    989 TFLOPs) or whose HBM is faster (H200) spends less of its step outside the matmuls, so
    it reaches more of its peak, never more than the matmuls' own measured rate."""
    from zerofit.speed.step_time import EFFICIENCY, HOPPER_MATMUL_EFFICIENCY

    tokens = 16384
    h100, h200, h20 = (
        compute_efficiency(lookup(key), tokens) for key in ("H100-SXM", "H200", "H20")
    )
    assert h100 == pytest.approx(EFFICIENCY["hopper"].at(tokens))
    assert compute_efficiency(lookup("H800"), tokens) == pytest.approx(h100)  # the same balance
    assert h100 < h200 < h20 < HOPPER_MATMUL_EFFICIENCY
    assert compute_efficiency(lookup("A100-80GB"), tokens) == EFFICIENCY["ampere"].at(tokens)


def test_gradient_accumulation_amortizes_the_optimizer_step():
    once = estimate_step_time(ONE_NODE, MODEL, H100)
    accumulated = estimate_step_time(dataclasses.replace(ONE_NODE, grad_accum=8), MODEL, H100)
    assert accumulated.gpu_optimizer_s == once.gpu_optimizer_s
    assert accumulated.total_s < 8 * once.total_s
    assert accumulated.tokens_per_s_per_gpu > once.tokens_per_s_per_gpu


def test_ring_moves_n_minus_one_over_n_of_the_buffer():
    assert ring_seconds(8e9, 1, 100) == 0
    assert ring_seconds(8e9, 8, 100) == pytest.approx(7 / 8 * 8e9 / 100e9)


def test_lora_communicates_and_steps_only_the_adapters():
    zero2 = dataclasses.replace(TWO_NODES, stage=2)
    full = estimate_step_time(zero2, MODEL, H100, inter_node_gbps=10)
    lora = estimate_step_time(
        zero2, MODEL, H100, inter_node_gbps=10, trainable_params=MODEL.params // 100
    )
    assert lora.exposed_comm_s < 0.05 * full.exposed_comm_s
    assert lora.gpu_optimizer_s == pytest.approx(full.gpu_optimizer_s / 100, rel=0.01)
    assert lora.compute_s < full.compute_s  # no weight gradients for the frozen weights


# --- ZeRO++ (planning/options.py zero_plus) ------------------------------------------------------
ZERO3_FOUR_NODES = TrainSetup(
    stage=3, world_size=32, gpus_per_node=8, micro_batch=1, seq_len=4096, grad_accum=4
)


def _comm(setup: TrainSetup, gbit: float = 100.0):
    from zerofit.speed.step_time import Links, communication_seconds

    links = Links(H100.link_gbps, gbit / 8)
    return communication_seconds(setup, MODEL, links, MODEL.params)


def test_hpz_gathers_across_nodes_once_per_step_then_inside_the_node():
    """hpZ: the first forward's all-gather crosses nodes; backward's and the later micro steps'
    forward gathers read the node's secondary shard over NVLink; the gradient reduce-scatter
    is the plain one."""
    from zerofit.speed.step_time import LINK_EFFICIENCY

    plain = _comm(ZERO3_FOUR_NODES)
    hpz = _comm(dataclasses.replace(ZERO3_FOUR_NODES, zero_plus="hpz"))
    network = 100 / 8 * LINK_EFFICIENCY
    world_gather = ring_seconds(MODEL.params * 2, 32, network)
    node_gather = ring_seconds(MODEL.params * 2, 8, H100.link_gbps * LINK_EFFICIENCY)
    assert plain.during_forward == pytest.approx(4 * world_gather)
    assert hpz.during_forward == pytest.approx(world_gather + 3 * node_gather)
    # ZeRO-3's backward gathers again what forward released (a 7B model: 93 %), with or
    # without hpZ; hpZ gathers it from the node's secondary shards
    released = stage3_backward_gather_elements(ZERO3_FOUR_NODES, MODEL)
    reduce_scatter = plain.during_backward / 4 - ring_seconds(released * 2, 32, network)
    node_regather = ring_seconds(released * 2, 8, H100.link_gbps * LINK_EFFICIENCY)
    assert hpz.during_backward == pytest.approx(4 * (node_regather + reduce_scatter))
    assert hpz.during_backward < plain.during_backward / 1.8


def test_hpz_backward_gathers_only_what_forward_released():
    """A model forward keeps gathered whole (under ~0.5B at DeepSpeed's reuse distance) needs
    no backward gather under hpZ either: backward is the gradient reduce-scatter alone."""
    small = resolve_model("qwen2.5-0.5b")
    setup = dataclasses.replace(ZERO3_FOUR_NODES, zero_plus="hpz")
    assert stage3_backward_gather_elements(setup, small) == 0
    from zerofit.speed.step_time import LINK_EFFICIENCY, Links, communication_seconds

    links = Links(H100.link_gbps, 100 / 8)
    comm = communication_seconds(setup, small, links, small.params)
    reduce_scatter = ring_seconds(small.params * 2, 32, 100 / 8 * LINK_EFFICIENCY)
    assert comm.during_backward == pytest.approx(4 * reduce_scatter)


def test_qwz_halves_the_gathers_and_qgz_cuts_inter_node_gradient_bytes_about_4x():
    hpz = _comm(dataclasses.replace(ZERO3_FOUR_NODES, zero_plus="hpz"))
    quantized = _comm(dataclasses.replace(ZERO3_FOUR_NODES, zero_plus="hpz+qwz+qgz"))
    assert quantized.during_forward == pytest.approx(hpz.during_forward / 2, rel=1e-3)
    one_micro = dataclasses.replace(ZERO3_FOUR_NODES, grad_accum=1)
    # over a slow network the reduce dominates backward: int4 over (N-1)/N vs bf16 over (W-1)/W
    slow_hpz = _comm(dataclasses.replace(one_micro, zero_plus="hpz"), gbit=10)
    slow_q = _comm(dataclasses.replace(one_micro, zero_plus="hpz+qwz+qgz"), gbit=10)
    ratio = slow_hpz.during_backward / slow_q.during_backward
    assert 4.5 < ratio < 5.5  # 2 B x 31/32 against 0.5 B x 3/4: 5.2x


def test_qwz_without_hpz_gathers_int8_across_the_world_every_time():
    """A user's file may quantize weights without the secondary partition: every gather still
    crosses nodes, in int8 (about half of plain ZeRO-3's bytes)."""
    plain = _comm(ZERO3_FOUR_NODES)
    qwz = _comm(dataclasses.replace(ZERO3_FOUR_NODES, zero_plus="qwz"))
    assert qwz.during_forward == pytest.approx(plain.during_forward / 2, rel=1e-3)
    assert plain.during_backward / 2 < qwz.during_backward < plain.during_backward


def test_zero_plus_changes_nothing_below_stage_3_and_pays_only_on_a_slow_network():
    stage2 = dataclasses.replace(ZERO3_FOUR_NODES, stage=2)
    assert _comm(dataclasses.replace(stage2, zero_plus="hpz")) == _comm(stage2)
    times = {
        zero_plus: estimate_step_time(
            dataclasses.replace(ZERO3_FOUR_NODES, zero_plus=zero_plus),
            MODEL,
            H100,
            inter_node_gbps=100,
        ).total_s
        for zero_plus in ("none", "hpz", "hpz+qwz+qgz")
    }
    assert times["hpz+qwz+qgz"] < times["hpz"] < times["none"]
    fast = [
        estimate_step_time(
            dataclasses.replace(ZERO3_FOUR_NODES, zero_plus=zero_plus),
            MODEL,
            H100,
            inter_node_gbps=3200,
        ).total_s
        for zero_plus in ("none", "hpz+qwz+qgz")
    ]
    assert fast[0] == pytest.approx(fast[1], rel=0.02)  # 8 NDR ports hide every gather


# --- DeepSpeed's hooks, PEFT's adapter path, the attention kernel ---------------------------------
SMALL = resolve_model("qwen2.5-0.5b")
H200 = lookup("H200")


def test_each_stage_counts_its_hooks_and_checkpointing_its_host_recompute():
    """ZeRO-2 hooks every trainable tensor's gradient, ZeRO-3 each module too, once per pass
    (forward, backward and checkpointing's recompute); ZeRO-1 only under overlap_comm.
    Checkpointing dispatches every layer's forward again (host time); a measured CPU device's
    rates already hold its host costs."""
    from zerofit.speed.step_time import (
        GRAD_HOOK_S_PER_TENSOR,
        RECOMPUTE_HOST_S_PER_LAYER,
        STAGE3_FETCH_S_PER_MODULE,
        gpu_profile,
        hook_seconds,
        recompute_host_seconds,
        trainable_tensors,
        zero3_hooked_modules,
    )

    plain = TrainSetup(stage=0)
    tensors, modules = 24 * 9 + 2, 24 * 13 + 6
    assert trainable_tensors(SMALL, plain, SMALL.params) == tensors
    assert zero3_hooked_modules(SMALL) == modules
    device = gpu_profile(H200)

    def hooks(stage: int, **fields) -> float:
        return hook_seconds(TrainSetup(stage=stage, **fields), SMALL, device, SMALL.params)

    assert hooks(0) == 0
    assert hooks(1, overlap_comm=False) == 0
    assert hooks(2) == pytest.approx(tensors * GRAD_HOOK_S_PER_TENSOR)
    assert hooks(1) == hooks(2)
    assert hooks(3) == pytest.approx(hooks(2) + 2 * modules * STAGE3_FETCH_S_PER_MODULE)
    assert hooks(3, gradient_checkpointing=True) == pytest.approx(
        hooks(2) + 3 * modules * STAGE3_FETCH_S_PER_MODULE
    )
    checkpointed = TrainSetup(stage=2, gradient_checkpointing=True)
    assert recompute_host_seconds(checkpointed, SMALL, device) == pytest.approx(
        24 * RECOMPUTE_HOST_S_PER_LAYER
    )
    assert recompute_host_seconds(TrainSetup(stage=2), SMALL, device) == 0
    measured = CpuMeasurements(
        matmul_tflops=1.0, memory_gbps=10.0, cpu_adam_params_per_s=1e8, link_gbits=1.0
    )
    assert recompute_host_seconds(checkpointed, SMALL, cpu_profile(measured)) == 0


def forward_called_modules(model) -> int:
    """Modules whose forward runs in one forward of ``model``: those ZeRO-3 fetches and releases
    (its pre-forward hook is the one parameter_offload.py registers on every module)."""
    import torch

    fired = []
    handles = [
        module.register_forward_pre_hook(lambda *_, name=name: fired.append(name))
        for name, module in model.named_modules()
    ]
    model(input_ids=torch.randint(0, 256, (1, 8)))
    for handle in handles:
        handle.remove()
    return len(fired)


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj,down_proj"])
def test_zero3_counts_the_modules_peft_runs_inside_each_adapter(targets):
    """ZeRO-3 hooks every module a forward calls; under LoRA, PEFT's base_layer, lora_dropout,
    lora_A and lora_B inside each adapted linear and its PeftModel wrapper are such modules
    (peft/tuners/lora/layer.py ``Linear.forward``): counted on a real peft model."""
    import peft
    import transformers

    from zerofit.models.resolve import spec_from_config
    from zerofit.speed.step_time import zero3_hooked_modules

    shape = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
    }
    spec = spec_from_config({"model_type": "qwen2", **shape}, "tiny-qwen2")
    config = transformers.Qwen2Config(**shape, use_cache=False)
    plain = transformers.Qwen2ForCausalLM(config)
    assert zero3_hooked_modules(spec) == forward_called_modules(plain)
    modules = targets if targets == "all-linear" else targets.split(",")
    adapted = peft.get_peft_model(
        transformers.Qwen2ForCausalLM(config), peft.LoraConfig(r=4, target_modules=modules)
    )
    setup = TrainSetup(stage=3, finetuning="lora", lora_targets=targets)
    assert zero3_hooked_modules(spec, setup) == forward_called_modules(adapted)
    assert zero3_hooked_modules(spec, TrainSetup(stage=3)) == zero3_hooked_modules(spec)


def test_zero1_reduces_through_its_hooks_only_at_the_accumulation_boundary():
    """ZeRO-1's gradient hook does its bucket work only in the optimizer step's last micro step
    (stage_1_and_2.py ``reduce_ready_partitions_and_remove_grads``); ZeRO-2's in every one. So
    under accumulation ZeRO-1 pays the per-tensor cost once per step, ZeRO-2 once per micro
    step (measured on an H100: ZeRO-1's boundary backward +72 ms, the others +0)."""
    from zerofit.speed.step_time import exposed_hook_seconds, gpu_profile, hook_seconds

    device = gpu_profile(H200)
    zero1 = TrainSetup(stage=1, grad_accum=8, world_size=8, gpus_per_node=8)
    assert hook_seconds(zero1, SMALL, device, SMALL.params, boundary=False) == 0
    boundary = hook_seconds(zero1, SMALL, device, SMALL.params)
    assert boundary > 0
    zero0 = dataclasses.replace(zero1, stage=0)
    step_1 = estimate_step_time(zero1, SMALL, H200)
    step_0 = estimate_step_time(zero0, SMALL, H200)
    gpu_micro_step_s = (step_1.compute_s + step_1.recompute_s) / 8
    once = exposed_hook_seconds(zero1, SMALL, device, SMALL.params, gpu_micro_step_s)
    assert step_1.overhead_s - step_0.overhead_s == pytest.approx(once)
    zero2 = dataclasses.replace(zero1, stage=2)
    assert hook_seconds(zero2, SMALL, device, SMALL.params, boundary=False) == boundary


def test_the_hooks_hide_behind_long_micro_steps():
    """On one GPU the host runs ahead: long micro steps hide the hooks whole. Across ranks the
    coordinator holds the host to the gathers: a share of them stays, shrinking as the GPU's
    work grows."""
    from zerofit.speed.step_time import exposed_hook_seconds, gpu_profile, hook_seconds

    device = gpu_profile(H200)
    long_one = TrainSetup(stage=3, micro_batch=4, seq_len=8192)
    hooks = hook_seconds(long_one, SMALL, device, SMALL.params)
    assert exposed_hook_seconds(long_one, SMALL, device, SMALL.params, 2 * hooks) == 0
    eight = dataclasses.replace(long_one, world_size=8, gpus_per_node=8)
    shares = [
        exposed_hook_seconds(eight, SMALL, device, SMALL.params, gpu * hooks) / hooks
        for gpu in (0.0, 1.0, 9.0)
    ]
    assert shares == pytest.approx([1.0, 0.5, 0.1])


def test_lora_pays_peft_s_elementwise_adapter_path():
    """peft's ``lora_B(lora_A(dropout(x))) * scaling`` per targeted module is memory-bound work
    that grows with the tokens; without dropout it moves less."""
    from zerofit.speed.step_time import adapter_elementwise_seconds, gpu_profile

    device = gpu_profile(H100)
    lora = TrainSetup(stage=0, finetuning="lora", seq_len=4096)
    one = adapter_elementwise_seconds(lora, MODEL, device, 1)
    assert one > 0
    assert adapter_elementwise_seconds(lora, MODEL, device, 2) == pytest.approx(2 * one)
    no_dropout = dataclasses.replace(lora, lora_dropout=0.0)
    assert adapter_elementwise_seconds(no_dropout, MODEL, device, 1) < one
    assert adapter_elementwise_seconds(TrainSetup(stage=0), MODEL, device, 1) == 0


def test_flash_attention_3_speeds_hopper_attention_only():
    """FlashAttention-3 runs attention 1.5-2x FlashAttention-2's rate on Hopper; elsewhere (and
    under any other kernel) the step is unchanged."""
    long = TrainSetup(stage=3, world_size=4, gpus_per_node=4, seq_len=16384, grad_accum=4)
    fa3 = dataclasses.replace(long, attention="flash_attention_3")
    for gpu, faster in ((lookup("H20"), True), (lookup("A100-80GB"), False)):
        flash3 = estimate_step_time(fa3, MODEL, gpu).total_s
        flash2 = estimate_step_time(long, MODEL, gpu).total_s
        assert (flash3 < flash2) if faster else (flash3 == flash2)


def test_an_encoder_decoders_step_counts_its_decoder_over_the_targets():
    """``TrainSetup.target_len`` reaches the FLOPs (speed/flops.py ``decoder_len``): T5's
    compute time is its step FLOPs at that target length over the same rate, and targets as
    long as the inputs are the step without it."""
    from model_families import family_config_json

    from zerofit.models.resolve import spec_from_config
    from zerofit.speed.flops import estimate_step_flops

    t5 = spec_from_config(family_config_json("t5-v1.1"), "t5-v1.1")
    setup = TrainSetup(stage=2, micro_batch=4, seq_len=512)
    same = estimate_step_time(setup, t5, H100)
    short = estimate_step_time(dataclasses.replace(setup, target_len=128), t5, H100)
    flops = [
        estimate_step_flops(t5, seq_len=512, sequences=4, decoder_len=length).total
        for length in (None, 128)
    ]
    assert short.compute_s / same.compute_s == pytest.approx(flops[1] / flops[0], rel=1e-9)
    assert flops[1] < flops[0]
    assert estimate_step_time(dataclasses.replace(setup, target_len=512), t5, H100) == same


# Samples packed into 16k-token rows, 4k tokens each on average (TRL's packing / padding_free,
# ms-swift's --packing): only flash-attention's varlen kernel keeps them apart.
PACKED = TrainSetup(
    stage=3,
    world_size=4,
    gpus_per_node=4,
    seq_len=16384,
    grad_accum=4,
    gradient_checkpointing=True,
    attention="flash_attention_2",
)


def test_packed_samples_shrink_the_attention_under_flash_attention_only():
    """``sample_len`` reaches the FLOPs (speed/flops.py) under flash-attention 2 and 3, which
    run each sample's block alone; SDPA and eager compute the whole row (a dense block mask),
    padded rows hold one sample each, and no sample length is the step as before."""
    from zerofit.speed.flops import estimate_step_flops

    whole = estimate_step_time(PACKED, MODEL, H100)
    assert estimate_step_time(PACKED, MODEL, H100, sample_len=None) == whole
    assert estimate_step_time(PACKED, MODEL, H100, sample_len=16384) == whole
    packed = estimate_step_time(PACKED, MODEL, H100, sample_len=4096)
    flops = [
        estimate_step_flops(
            MODEL, seq_len=16384, sequences=1, gradient_checkpointing=True, sample_len=length
        )
        for length in (None, 4096)
    ]
    ratio = flops[1].total / flops[0].total
    assert ratio < 0.95
    computed = [(step.compute_s + step.recompute_s) for step in (whole, packed)]
    assert computed[1] / computed[0] == pytest.approx(ratio, rel=1e-9)
    assert packed.total_s < whole.total_s
    for unchanged in (
        dataclasses.replace(PACKED, attention="sdpa"),
        dataclasses.replace(PACKED, attention="eager"),
        dataclasses.replace(PACKED, padded=True),
    ):
        plain = estimate_step_time(unchanged, MODEL, H100)
        assert estimate_step_time(unchanged, MODEL, H100, sample_len=4096) == plain


def test_flash_attention_3_saves_on_the_packed_attention_only():
    """FlashAttention-3's faster attention (``attention_kernel_savings``) saves a share of the
    products the step runs: on packed samples a quarter of the row's, so a quarter of the
    saving (forward, backward and recompute alike)."""
    flash3 = dataclasses.replace(PACKED, attention="flash_attention_3")
    saving_whole = (
        estimate_step_time(PACKED, MODEL, H100).compute_s
        - estimate_step_time(flash3, MODEL, H100).compute_s
    )
    saving_packed = (
        estimate_step_time(PACKED, MODEL, H100, sample_len=4096).compute_s
        - estimate_step_time(flash3, MODEL, H100, sample_len=4096).compute_s
    )
    assert saving_packed == pytest.approx(saving_whole * 4096 / 16384, rel=1e-9)


def test_packed_answers_reach_the_step_time():
    """From the answers: ``--no-padding`` with ``--dataset-samples`` and ``--avg-seq-len`` give
    the speed model the packed samples' length (planner.py ``packed_sample_len``); without
    ``padding`` false, or for GRPO, the step is the one without it."""
    from zerofit.planning.answers import Answers
    from zerofit.planning.options import TrainingOption
    from zerofit.planning.planner import build_setup, plan_inputs, step_time_of

    option = TrainingOption(stage=3, gradient_checkpointing=True)
    base = dict(
        gpu="H100-SXM",
        gpus_per_node=4,
        seq_len=16384,
        attention="flash_attention_2",
        dataset_samples=10_000,
        host_ram_gib=1024.0,
    )

    def step_of(**answers):
        inputs = plan_inputs(MODEL, Answers(**base, **answers), H100, "bf16", 4)
        return step_time_of(inputs, build_setup(inputs, option, 1, 4))

    plain = step_of(padding=False)
    packed = step_of(padding=False, avg_seq_len=4096)
    setup = build_setup(
        plan_inputs(MODEL, Answers(**base, padding=False), H100, "bf16", 4), option, 1, 4
    )
    assert packed == estimate_step_time(setup, MODEL, H100, sample_len=4096)
    assert packed.total_s < plain.total_s
    assert step_of(avg_seq_len=4096) == step_of()  # padding unsaid: one sample per row
    assert step_of(padding=True, avg_seq_len=4096) == step_of(padding=True)
    grpo = dict(workload="grpo", padding=False)
    assert step_of(**grpo, avg_seq_len=4096) == step_of(**grpo)


# One micro step of two 8k-token rows: attention is a sizeable share of the FLOPs there.
LONG_ROWS = TrainSetup(
    stage=2, world_size=8, gpus_per_node=8, micro_batch=2, seq_len=8192, grad_accum=2
)


def test_padded_sdpa_and_eager_count_the_whole_attention_square():
    """Attention's products count the causal half where the kernel skips the masked blocks
    (flash-attention; SDPA without a mask: unchanged from before) and the whole square where it
    computes them (SDPA given a padded batch's mask; eager, padded or not), in the forward,
    backward and checkpointing's recompute alike (speed/step_time.py
    ``attention_skips_masked_blocks``)."""
    from zerofit.speed.flops import estimate_step_flops, forward_flops_per_sequence

    def compute_s(attention, padded, checkpointing=False):
        setup = dataclasses.replace(
            LONG_ROWS, attention=attention, padded=padded, gradient_checkpointing=checkpointing
        )
        step = estimate_step_time(setup, MODEL, H100)
        return step.compute_s + step.recompute_s

    half = forward_flops_per_sequence(MODEL, 8192)
    whole = forward_flops_per_sequence(MODEL, 8192, skips_masked_blocks=False)
    added = 2 * (whole["attention"] - half["attention"])  # two sequences per micro step
    for checkpointing, passes in ((False, 3), (True, 4)):
        skipping = compute_s("sdpa", False, checkpointing)
        flops = estimate_step_flops(
            MODEL, seq_len=8192, sequences=2, gradient_checkpointing=checkpointing
        )
        ratio = (flops.total + passes * added) / flops.total
        assert compute_s("sdpa", True, checkpointing) / skipping == pytest.approx(ratio)
        assert compute_s("eager", False, checkpointing) == compute_s("sdpa", True, checkpointing)
        assert compute_s("eager", True, checkpointing) == compute_s("sdpa", True, checkpointing)
        assert compute_s("flash_attention_2", True, checkpointing) == skipping
    assert ratio > 1.05
    # the default setup (SDPA, unpadded) is the step as counted before: the causal half
    default = estimate_step_time(LONG_ROWS, MODEL, H100)
    assert default == estimate_step_time(
        dataclasses.replace(LONG_ROWS, attention="flash_attention_2", padded=True), MODEL, H100
    )
    flash3 = dataclasses.replace(LONG_ROWS, attention="flash_attention_3")
    assert estimate_step_time(flash3, MODEL, H100) == estimate_step_time(
        dataclasses.replace(flash3, padded=True), MODEL, H100
    )


def test_padding_answers_reach_the_attention_count():
    """From the answers: ``padding`` (or, unsaid, the collators' padding of micro batches of two
    or more: planner.py ``pads_batches``) makes SDPA's step count the whole attention square;
    eager counts it whole and flash-attention half either way."""
    from zerofit.planning.answers import Answers
    from zerofit.planning.options import TrainingOption
    from zerofit.planning.planner import build_setup, plan_inputs, step_time_of

    option = TrainingOption(stage=2)
    base = dict(gpu="H100-SXM", gpus_per_node=8, seq_len=8192, host_ram_gib=1024.0)

    def step_of(micro_batch=2, **answers):
        inputs = plan_inputs(MODEL, Answers(**base, **answers), H100, "bf16", 8)
        return step_time_of(inputs, build_setup(inputs, option, micro_batch, 2))

    padded, unpadded = step_of(padding=True), step_of(padding=False)
    assert padded.compute_s > 1.05 * unpadded.compute_s
    assert step_of() == padded  # two sequences per micro batch: the collator pads them
    assert step_of(micro_batch=1) == step_of(micro_batch=1, padding=False)
    assert step_of(attention="eager", padding=False) == step_of(attention="eager", padding=True)
    assert step_of(attention="eager", padding=False).compute_s == padded.compute_s
    flash = dict(attention="flash_attention_2")
    assert step_of(**flash, padding=True) == step_of(**flash, padding=False) == unpadded


def test_a_model_without_sdpa_counts_the_eager_attention_transformers_runs():
    """transformers loads a class without ``_supports_sdpa`` (Gemma2: sdpa cannot soft-cap) with
    eager attention where sdpa is the default (modeling_utils.py
    ``_check_and_adjust_attn_implementation`` -> ``get_correct_attn_implementation``), so an
    unpadded sdpa step computes the whole square, as the memory model's trace says
    (``activations_basis``: traced_eager). A traced class that has sdpa (Phi-3) keeps the
    causal half, as does flash-attention on both."""
    pytest.importorskip("transformers")
    from memory_shapes import TINY_DECODER
    from transformers import AutoConfig, AutoModelForCausalLM

    from zerofit.memory.activations import activations_basis
    from zerofit.models.resolve import spec_from_config
    from zerofit.speed.step_time import attention_skips_masked_blocks

    # special token ids inside the tiny vocabulary, so that the trace can build the embedding
    tiny = dict(TINY_DECODER, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    setup = dataclasses.replace(LONG_ROWS, micro_batch=1)  # unpadded: sdpa would skip
    for model_type, loaded in (("gemma2", "eager"), ("phi3", "sdpa")):
        config = AutoConfig.for_model(model_type, **tiny)
        assert AutoModelForCausalLM.from_config(config).config._attn_implementation == loaded
        model = spec_from_config({"model_type": model_type, **tiny}, f"tiny-{model_type}")
        basis = activations_basis(model, 2, "sdpa")
        assert basis == ("traced_eager" if loaded == "eager" else "traced")
        assert attention_skips_masked_blocks(setup, model) == (loaded == "sdpa")

        def step_of(model=model, **changes):
            return estimate_step_time(dataclasses.replace(setup, **changes), model, H100)

        whole = step_of(attention="eager")
        half = step_of(attention="flash_attention_2")
        assert half.compute_s < whole.compute_s
        assert step_of() == (whole if loaded == "eager" else half)
        assert step_of(padded=True) == whole
    # a formula family (sdpa and flash in every class) is never traced for it: unchanged
    assert attention_skips_masked_blocks(setup, MODEL) == attention_skips_masked_blocks(setup)


def test_grpo_under_trl_trains_the_lm_head_over_the_completion_only():
    """TRL's GRPO loss forward projects the completion's positions only (grpo_trainer.py
    ``_compute_loss``: ``logits_to_keep = completion_ids.size(1)``, through its fused head): its
    forward and backward count the head over ``completion_len`` positions. The project's recipe
    (stack ``accelerate``) keeps one position more (``logits_to_keep=C + 1``), and SFT and DPO
    keep every position on any stack: their steps are unchanged."""
    from zerofit.speed.flops import estimate_step_flops, forward_flops_per_sequence

    grpo = dataclasses.replace(
        ONE_NODE, workload="grpo", seq_len=1024, completion_len=256, stack="hf"
    )
    trl = estimate_step_time(grpo, MODEL, H100)
    recipe = estimate_step_time(dataclasses.replace(grpo, stack="accelerate"), MODEL, H100)
    head_per_position = forward_flops_per_sequence(MODEL, 1024)["lm_head"] / 1024
    one_more_position = grpo.micro_batch * grpo.grad_accum
    rate = H100.bf16_tflops * 1e12 * compute_efficiency(H100, grpo.micro_batch * 1024)
    extra_s = 3 * one_more_position * head_per_position / rate  # forward + backward's two
    assert recipe.compute_s - trl.compute_s == pytest.approx(extra_s)
    assert recipe.recompute_s == trl.recompute_s  # recompute never reruns the head

    for workload in ("sft", "dpo"):
        hf = dataclasses.replace(ONE_NODE, workload=workload, stack="hf")
        step = estimate_step_time(hf, MODEL, H100)
        assert step == estimate_step_time(dataclasses.replace(hf, stack="accelerate"), MODEL, H100)
    sft = estimate_step_time(dataclasses.replace(ONE_NODE, stack="hf"), MODEL, H100)
    flops = estimate_step_flops(MODEL, seq_len=2048, sequences=ONE_NODE.micro_batch)
    sft_rate = H100.bf16_tflops * 1e12 * compute_efficiency(H100, ONE_NODE.micro_batch * 2048)
    expected_s = (flops.forward + flops.backward) * ONE_NODE.grad_accum / sft_rate
    assert sft.compute_s == pytest.approx(expected_s, rel=1e-9)


def test_an_older_deepspeed_pays_less_per_zero3_module_and_nothing_else_changes():
    """ZeRO-3's per-module host cost follows the DeepSpeed release (0.12's hooks measured at
    half of 0.19's on one CPU host); ZeRO-2 has no module hooks, so its step is the same; a
    release with no measurement is refused in one line."""
    from zerofit.speed.step_time import STAGE3_FETCH_S_PER_MODULE, gpu_profile

    old, current = gpu_profile(H100, "0.12"), gpu_profile(H100)
    assert current.stage3_fetch_s_per_module == STAGE3_FETCH_S_PER_MODULE
    assert old.stage3_fetch_s_per_module == pytest.approx(STAGE3_FETCH_S_PER_MODULE * 29 / 60)
    assert dataclasses.replace(old, stage3_fetch_s_per_module=0.0) == dataclasses.replace(
        current, stage3_fetch_s_per_module=0.0
    )
    small = resolve_model("qwen2.5-0.5b")
    zero3 = TrainSetup(stage=3, world_size=1, gpus_per_node=1, micro_batch=1, seq_len=256)
    assert estimate_step_time(zero3, small, old).total_s < estimate_step_time(
        zero3, small, current
    ).total_s
    zero2 = dataclasses.replace(zero3, stage=2)
    assert estimate_step_time(zero2, small, old).total_s == pytest.approx(
        estimate_step_time(zero2, small, current).total_s
    )
    with pytest.raises(ValueError, match="deepspeed_version '0.9'"):
        gpu_profile(H100, "0.9")
