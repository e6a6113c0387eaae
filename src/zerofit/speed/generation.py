"""GRPO's generation time per optimizer step: TRL's rollout, as transformers or vLLM runs it.

TRL's GRPOTrainer generates once per ``steps_per_generation`` micro steps (default: the gradient
accumulation), every prompt of that many micro batches at once
(trl/trainer/grpo_trainer.py ``_prepare_inputs``: ``generate_every = steps_per_generation *
num_iterations``; ``_generate_single_turn``). Each rank generates its own share:
``micro_batch x steps_per_generation`` completions of ``completion_len`` tokens after prompts of
``seq_len - completion_len``. A round is:

- prefill: the prompts' forward, compute-bound, at the training step's efficiency curve. Under
  transformers the prompts are left-padded into one batch with its attention mask
  (grpo_trainer.py ``_generate_single_turn``: ``pad(..., padding_side="left")`` of the ids and
  of a ones mask, both handed to ``generate``), so attention's products are counted as the
  training step counts them on a padded batch (step_time.py ``attention_skips_masked_blocks``:
  the whole square under SDPA and eager). vLLM runs its own kernel on the unpadded prompts
  (vllm/v1/attention/backends/flash_attn.py ``FlashAttentionImpl.forward``:
  ``flash_attn_varlen_func`` with ``cu_seqlens_q`` and the causal flag): the causal half.
  Either engine runs the LM head over each prompt's last position only
  (``PREFILL_LOGITS_KEPT``);
- decode: ``completion_len`` steps, each reading every weight once and the KV cache of the whole
  batch (memory-bound: bytes over HBM bandwidth at ``DECODE_HBM_EFFICIENCY``), or the batch's
  matmuls when the batch is large enough to be compute-bound, plus the engine's fixed cost per
  step (transformers' eager loop launches every layer's kernels from Python; vLLM replays CUDA
  graphs);
- weights: under ZeRO-3 with transformers, TRL gathers every parameter once for the whole call
  (trl/models/utils.py ``_unwrap_model_for_generation``: ``deepspeed.zero.GatheredParameters(
  model.parameters())`` and ``remove_hooks`` while ``ds3_gather_for_generation`` is True, its
  default); with it False every forward, so every decode step, runs ZeRO-3's per-module
  all-gathers and hooks. With vLLM colocated, TRL pushes the trained weights into vLLM once per
  optimizer step (trl/generation/vllm_generation.py ``VLLMGeneration.sync_weights``: each
  parameter, gathered under ZeRO-3, into ``model.load_weights``);
- scoring: the reference model's log-probabilities of every completion when ``beta > 0``
  (``_generate_and_score_completions``), a no-grad forward over the generation batch, whatever
  engine generated it, through transformers with the batch's mask (``attention_mask =
  torch.cat([prompt_mask, completion_mask], dim=1)``: left-padded prompts, completions padded
  after their EOS): attention counted as the training step counts it, the LM head over the
  positions the trainer scores (``scored_logit_positions``: TRL's, the completion's).

Decode steps need no such rule: each feeds one query token per sequence, so SDPA gets
``is_causal`` False whatever the mask (integrations/sdpa_attention.py: ``q_length > 1``) and
every kernel reads the whole cache once: products linear in the context, as counted below
(``decode_step_seconds``).

Completions are taken to run to ``completion_len``: transformers' ``generate`` keeps stepping
until every sequence of the batch has ended, and a GRPO batch nearly always holds one that has
not. Fitted numbers are named below with the public rows they came from; the rest are datasheet
ratios.

Not modeled: what a DeepSpeed engine adds to generation on the same GPU. TRL 1.16's GRPO step
(tests/data/mem_h100_qwen2.5-0.5b.md) takes 5.53 s plain, 9.67 s under ZeRO-2 and 13.96 s under
ZeRO-3 on one H100; this model predicts 5.5, 5.5 and 6.0 s. benchmarks/ds_generate_overhead.py
on one H200 (same shape) found generation of the 64 x 256 batch 4.9-6.5 s plain, 6.4-7.5 s from a
ZeRO-2 engine's module and 7.8-9.1 s under ZeRO-3 with TRL's gather, and a training micro step
0.08 / 0.21 / 0.32 s. The training side of that gap is DeepSpeed's hooks, which step_time.py
now counts (``hook_seconds``, fitted on that run); the generation side has no mechanism found
yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zerofit.hardware import GpuSpec
from zerofit.memory.estimate import GIB, TrainSetup
from zerofit.models.resolve import ModelSpec
from zerofit.speed.device import DeviceProfile
from zerofit.speed.flops import (
    forward_flops_per_sequence,
    keep_lm_head_positions,
    step_flops_from_terms,
)

# Share of the HBM datasheet bandwidth a decode step's weight and KV reads reach, 0.85: a
# streaming kernel's usual fraction of the datasheet (between NCCL's 0.8 of a link,
# step_time.py LINK_EFFICIENCY, and STREAM's ~0.9 of HBM). Not fitted.
DECODE_HBM_EFFICIENCY = 0.85

# transformers' eager generate, per decode step beyond the reads: 11.5 ms for the loop itself
# (logits processors and sampling over the vocabulary, stopping criteria, the dynamic cache's
# bookkeeping) and 0.3 ms per decoder layer (its kernels launched from Python). Fitted by least
# squares on 8 rows measured on the project's lent H100 (tests/data/hf_generate_decode_h100.jsonl,
# benchmarks/hf_generate_decode.py: transformers 5.17 with TRL GRPO's sampling kwargs, 24-48
# layers, batch 1 and 32; median |error| 8 %). Out of sample: uncompiled transformers
# Llama-2-13B (40 layers) at batch 1 on an A100-80GB takes 35.71 ms per token
# (foundation-model-stack PR 69, scripts/hf_example.py); predicted 38.5 ms (+8 %).
HF_DECODE_STEP_S = 0.0115
HF_DECODE_S_PER_LAYER = 0.0003

# vLLM per decode step: it replays one CUDA graph, so no per-layer launch cost, but its
# scheduler, sampler and the detokenizer-free output path run on the CPU every step, ~3 ms
# (an assumption, not fitted: a 0.5B model's batch-1 decode in vLLM runs at a few hundred
# tokens/s, where its weight reads take 0.4 ms). Checked against vLLM decoding Llama-2-7B at
# batch 1 on an RTX A6000 (768 GB/s): 46.4 tokens/s measured
# (hamel.dev/notes/llm/inference/03_inference.html, 200 new tokens), 42 predicted (-9 %).
VLLM_STEP_S = 0.003

# ZeRO-3's hooks per decoder layer in each generation forward when TRL does not gather the
# weights first (``ds3_gather_for_generation`` False): every module's fetch starts its own
# all-gather and waits for it (partitioned_param_coordinator.py ``fetch_sub_module``), with no
# training step's GPU work to hide behind. 5 ms per layer, the per-layer hook cost once fitted
# on the Qwen README's ZeRO-3 training rows (qwen1-1.8b-full-seq*, qwen1-7b-full-seq*,
# qwen1-72b-lora-z3-seq*); the training step now counts its hooks per module and tensor
# (step_time.py ``hook_seconds``), whose single-GPU costs have no gathers to wait for.
# Checked against DeepSpeedExamples issue 718 (tests/speed/test_generation.py).
GENERATION_ZERO3_HOOK_S_PER_LAYER = 0.005

# TRL builds vLLM colocated with max_num_seqs = per_device_train_batch_size x TP x
# steps_per_generation (grpo_trainer.py ``VLLMGeneration(... max_num_seqs=...)``): the whole
# round in one wave when its KV cache fits vLLM's share of the GPU (``vllm_waves``).


@dataclass(frozen=True)
class GenerationTime:
    """Seconds of generation per optimizer step, by term."""

    engine: str  # transformers | vllm
    rounds: float  # generation rounds per optimizer step (grad_accum / steps_per_generation)
    tokens_per_round: int  # tokens one rank generates per round
    prefill_s: float
    decode_s: float
    weights_s: float  # ZeRO-3's gather for generation, or the weight sync into vLLM
    scoring_s: float  # the reference model's forward over the completions (beta > 0)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s + self.weights_s + self.scoring_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Generated tokens per second of prefill and decode on one GPU (a rollout's rate)."""
        generating = self.prefill_s + self.decode_s
        return 0.0 if generating <= 0 else self.rounds * self.tokens_per_round / generating


def generation_rounds(setup: TrainSetup) -> float:
    """Rounds per optimizer step: one every ``steps_per_generation`` micro steps."""
    steps = setup.steps_per_generation or setup.grad_accum
    return setup.grad_accum / steps


def completions_per_round(setup: TrainSetup) -> int:
    """Completions one rank generates at once: ``micro_batch x steps_per_generation``."""
    return setup.micro_batch * (setup.steps_per_generation or setup.grad_accum)


def kv_bytes_per_token(model: ModelSpec, element_bytes: int) -> int:
    """Keys and values of one token in every layer."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * element_bytes


@dataclass(frozen=True)
class DecodeBatch:
    """What one decode step works on: sequences, cached tokens each, and element sizes."""

    sequences: int
    context: float  # cached tokens per sequence
    weight_bytes: int
    kv_element_bytes: int


def decode_step_seconds(
    model: ModelSpec, gpu: GpuSpec | DeviceProfile, batch: DecodeBatch, efficiency: float
) -> float:
    """One decode step: the weights and the batch's KV cache read once, or the step's matmuls
    (``efficiency`` of the dense peak) when a large batch makes them take longer."""
    from zerofit.speed.step_time import as_device

    device = as_device(gpu)
    cache = batch.sequences * batch.context * kv_bytes_per_token(model, batch.kv_element_bytes)
    read = model.params * batch.weight_bytes + cache
    memory_s = read / (device.memory_gbps * 1e9 * DECODE_HBM_EFFICIENCY)
    attention = 4 * model.num_layers * model.num_heads * model.head_dim * batch.context
    flops = batch.sequences * (2 * model.active_params + attention)
    return max(memory_s, flops / (device.peak_tflops * 1e12 * efficiency))


def vllm_waves(
    setup: TrainSetup, model: ModelSpec, gpu: GpuSpec | DeviceProfile, sequences: int
) -> int:
    """Waves vLLM needs when its share of the GPU cannot cache every sequence at once (one
    wave on a device of unknown memory)."""
    from zerofit.speed.step_time import as_device

    device = as_device(gpu)
    if device.memory_gib is None:
        return 1
    share = (setup.vllm_gpu_memory_utilization or 0.0) * device.memory_gib * GIB
    kv_space = share - model.params * 2
    per_sequence = setup.seq_len * kv_bytes_per_token(model, 2)
    fits = int(kv_space // per_sequence) if kv_space > 0 else 1
    return math.ceil(sequences / max(1, min(sequences, fits)))


def forward_flops(
    model: ModelSpec,
    seq_len: int,
    sequences: int,
    skips_masked_blocks: bool,
    logits_kept: int | None = None,
) -> float:
    """FLOPs of a no-grad forward over ``sequences`` sequences of ``seq_len`` tokens, attention's
    products at the causal half or the whole square (flops.py ``skips_masked_blocks``), the LM
    head over the last ``logits_kept`` positions of each (None: every position)."""
    terms = forward_flops_per_sequence(model, seq_len, skips_masked_blocks=skips_masked_blocks)
    if logits_kept is not None:
        terms = keep_lm_head_positions(terms, seq_len, logits_kept)
    return step_flops_from_terms(terms, sequences=sequences).forward


# Logits a generation engine's prefill computes per sequence: the last position's only, the one
# the first new token is sampled from. transformers' ``generate`` passes ``logits_to_keep=1`` to
# every model whose forward takes it (generation/utils.py ``GenerationMixin.generate``, step 6:
# ``_supports_logits_to_keep``), and the decoder LMs' ``*ForCausalLM.forward`` slice the hidden
# states before ``lm_head`` (modeling_utils.py ``slice_logits_to_keep``). In transformers 5.24,
# 188 of the 196 classes AutoModelForCausalLM maps take it; the 8 that do not (xLSTM,
# ProphetNet, TrOCR, Whisper, MusicGen and MusicGen-Melody, Gemma 4's two assistants) are not
# GRPO policies and are counted as the rest. TRL's fused head keeps that signature
# (trl/trainer/utils.py ``add_fused_lm_head``: ``functools.wraps``, "generate validates its model
# kwargs against it"). vLLM computes the logits of each request's last scheduled token
# (vllm/v1/worker/gpu_model_runner.py ``_prepare_inputs``: ``logits_indices =
# query_start_loc[1:] - 1``; ``execute_model``: ``compute_logits(hidden_states[logits_indices])``).
PREFILL_LOGITS_KEPT = 1


def scored_logit_positions(setup: TrainSetup) -> int:
    """Positions per sequence whose logits GRPO's own forwards compute: the policy's loss
    forward and the old policy's and the reference's scoring. ``seq_len`` for other workloads.

    TRL's GRPOTrainer (stack ``hf``) projects the completion's positions only: 1.16's
    ``_get_per_token_logps_and_entropies`` labels only the last ``logits_to_keep =
    completion_ids.size(1)`` tokens (``labels[:, :-logits_to_keep] = -100``, padding too) and
    calls ``model(..., labels=labels, fused_lm_head=True)``, whose head
    (trl/trainer/utils.py ``add_fused_lm_head``) projects ``hidden_states[mask]``, the labelled
    positions, where Triton runs (CUDA, XPU: trl/kernels/chunked_logprob.py ``_use_triton``;
    elsewhere every position, not told apart here); 0.14-1.15 passed ``logits_to_keep=C + 1``,
    one position more. ``_compute_loss`` (the training forward) and the old-policy and reference
    scoring all go through it. The project's own recipe (stack ``accelerate``: recipes/grpo.py
    ``token_logprobs``) passes ``logits_to_keep=C + 1`` (transformers' causal LMs slice the
    hidden states before ``lm_head``). DeepSpeed-engine loops (OpenRLHF's ``Actor.forward``) take
    the whole ``logits`` and slice the completion afterwards: the head runs over every position
    (memory/losses.py ``scored_tokens`` counts the logits those keep, a smaller thing than what
    the head computes)."""
    if setup.workload != "grpo" or setup.stack == "deepspeed":
        return setup.seq_len
    if setup.stack == "accelerate":
        return min(setup.completion_len + 1, setup.seq_len)
    return min(setup.completion_len, setup.seq_len)


def estimate_generation_time(
    setup: TrainSetup,
    model: ModelSpec,
    gpu: GpuSpec | DeviceProfile,
    *,
    ring_gbps: float,
    gather_for_generation: bool = True,
) -> GenerationTime:
    """GRPO's generation seconds per optimizer step of ``setup``.

    ``gpu``: a catalog GPU or any device's ``DeviceProfile`` (its rates are read from the
    profile either way, as ``estimate_step_time`` does). ``ring_gbps``: what the job's ring
    collective reaches, GB/s (step_time.Links.ring_gbps), for ZeRO-3's gathers.
    ``gather_for_generation``: TRL's ``ds3_gather_for_generation``.
    """
    from zerofit.speed.step_time import as_device, attention_skips_masked_blocks, ring_seconds

    device = as_device(gpu)
    # the padded batches transformers runs: the kernel the training step runs (module docstring)
    skips_masked_blocks = attention_skips_masked_blocks(setup, model)

    rounds = generation_rounds(setup)
    sequences = completions_per_round(setup)
    prompt = max(1, setup.seq_len - setup.completion_len)
    vllm = bool(setup.vllm_gpu_memory_utilization)
    peak = device.peak_tflops * 1e12
    prefill_flops = forward_flops(
        model, prompt, sequences, vllm or skips_masked_blocks, PREFILL_LOGITS_KEPT
    )
    prefill_s = prefill_flops / (peak * device.efficiency.at(sequences * prompt))
    # vLLM loads the checkpoint in 16 bits; transformers generates with the training weights:
    # the compute dtype under DeepSpeed, the load dtype without it (TrainSetup.weight_bytes)
    batch = DecodeBatch(
        sequences=sequences,
        context=prompt + setup.completion_len / 2,  # the cache grows by a token per step
        weight_bytes=2 if vllm else setup.weight_bytes,
        kv_element_bytes=2 if vllm or setup.precision != "fp32" else 4,
    )
    step_s = decode_step_seconds(model, device, batch, device.efficiency.at(sequences))
    gathered = model.params * 2
    sharded = setup.stage == 3 and setup.world_size > 1
    gather_s = ring_seconds(gathered, setup.world_size, ring_gbps) if sharded else 0.0
    if vllm:
        waves = vllm_waves(setup, model, device, sequences)
        decode_s = rounds * setup.completion_len * (step_s + VLLM_STEP_S) * waves
        # sync_weights, once per optimizer step: every parameter gathered (ZeRO-3), then
        # written into vLLM's copy
        weights_s = gather_s + 2 * gathered / (device.memory_gbps * 1e9 * DECODE_HBM_EFFICIENCY)
    else:
        step_s += HF_DECODE_STEP_S + model.num_layers * HF_DECODE_S_PER_LAYER
        weights_s = rounds * gather_s if gather_for_generation else 0.0
        if not gather_for_generation and sharded:
            # every forward gathers each module and runs its hooks (partitioned_param_coordinator)
            per_forward = gather_s + model.num_layers * GENERATION_ZERO3_HOOK_S_PER_LAYER
            step_s += per_forward
            prefill_s += per_forward
        decode_s = rounds * setup.completion_len * step_s
    scoring_s = 0.0
    if setup.uses_reference:
        kept = scored_logit_positions(setup)
        scored = forward_flops(model, setup.seq_len, sequences, skips_masked_blocks, kept)
        tokens = setup.micro_batch * setup.seq_len  # scored in micro batches
        scoring_s = rounds * scored / (peak * device.efficiency.at(tokens))
    return GenerationTime(
        engine="vllm" if vllm else "transformers",
        rounds=rounds,
        tokens_per_round=sequences * setup.completion_len,
        prefill_s=rounds * prefill_s,
        decode_s=decode_s,
        weights_s=weights_s,
        scoring_s=scoring_s,
    )
