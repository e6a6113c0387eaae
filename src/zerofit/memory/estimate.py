"""Per-GPU peak of ``torch.cuda.max_memory_allocated()`` for a DeepSpeed training step.

Pure arithmetic in bytes, no torch import. The peak is the maximum over the phases of a step
(step 2 onwards, when Adam's states exist), not a sum of everything:

- ``forward``  end of forward / start of backward: model states + stored activations + the fp32
  loss path over the full vocabulary (log_softmax, its grad and the grad it produces);
- ``backward`` gradient buckets allocated at the first grad hook + activations still held;
- ``step``     optimizer.step(): fp32 grad copy and AdamW's foreach temporary;
- ``reference`` (dpo/grpo with reference) the frozen model's forward without grad;
- ``rollout``  (grpo) generation with its KV cache and sampling logits.

The CUDA context (~0.5 GiB, not in max_memory_allocated) is reported separately.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from zerofit.memory import activations as act
from zerofit.memory import states as st

GIB = 1024 ** 3
CUDA_CONTEXT_BYTES = int(0.5 * GIB)   # measured: 0.514 GiB used on an H100 before the model existed
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# DeepSpeed's own defaults (what the calibration runs used: no bucket keys in their JSON).
DEEPSPEED_DEFAULT_BUCKETS = {
    "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000, "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 1_000_000_000,
    "sub_group_size": 1_000_000_000,
}


@dataclass(frozen=True)
class TrainSetup:
    """One training configuration on one rank's view. ``buckets=None``: zerofit's JSON sizes."""

    stage: int = 2
    world_size: int = 1
    gpus_per_node: int = 1
    offload_optimizer: str = "none"
    offload_param: str = "none"
    precision: str = "bf16"
    gradient_checkpointing: bool = False
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    attention: str = "sdpa"
    workload: str = "sft"
    num_generations: int = 8
    completion_len: int = 256
    reference_model: bool | None = None
    overlap_comm: bool = True
    buckets: dict | None = None

    def bucket_sizes(self, hidden_size: int) -> dict:
        """Bucket sizes in elements: explicit ones, else what zerofit writes, over DS defaults."""
        if self.buckets is not None:
            return {**DEEPSPEED_DEFAULT_BUCKETS, **self.buckets}
        from zerofit.memory.ds_defaults import ds_bucket_sizes
        return {**DEEPSPEED_DEFAULT_BUCKETS, **ds_bucket_sizes(hidden_size, self.stage)}

    @property
    def uses_reference(self) -> bool:
        if self.reference_model is not None:
            return self.reference_model and self.workload in ("dpo", "grpo")
        return self.workload == "dpo"


@dataclass(frozen=True)
class MemoryEstimate:
    peak_bytes: int                       # per-GPU max_memory_allocated()
    breakdown: dict[str, int]             # components of the peak phase; sums to peak_bytes
    phase: str                            # which phase sets the peak
    phases: dict[str, int] = field(default_factory=dict)   # every phase's total
    cpu_bytes: int = 0                    # host RAM for offload, per node
    context_bytes: int = CUDA_CONTEXT_BYTES

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def cpu_gib(self) -> float:
        return self.cpu_bytes / GIB

    def breakdown_gib(self) -> dict[str, float]:
        """Breakdown in GiB (rounded to 3 places), plus the CUDA context kept apart."""
        out = {k: round(v / GIB, 3) for k, v in self.breakdown.items() if v}
        out["cuda_context (not in peak)"] = round(self.context_bytes / GIB, 3)
        return out

    def fits(self, capacity_gib: float, headroom: float = 0.9) -> bool:
        """True when peak + CUDA context stay within ``capacity_gib * headroom``; the headroom
        absorbs allocator fragmentation (reserved exceeds allocated by a few GiB in practice)."""
        return self.peak_bytes + self.context_bytes <= capacity_gib * headroom * GIB


def estimate_memory(model, setup: TrainSetup) -> MemoryEstimate:
    """Predict the per-GPU peak and its breakdown for ``model`` trained as ``setup``."""
    s, b = setup, DTYPE_BYTES[setup.precision]
    buckets = s.bucket_sizes(model.hidden_size)
    seqs = s.micro_batch * (2 if s.workload == "dpo" else 1)          # dpo: chosen + rejected
    tokens = seqs * s.seq_len
    # grpo scores only completion tokens (logits_to_keep); sft/dpo score every position
    logit_tokens = seqs * s.completion_len if s.workload == "grpo" else tokens

    resident = st.resident_states(model, s, b, buckets)
    if s.uses_reference:
        ref_shard = math.ceil(model.params / s.world_size) if s.stage == 3 else model.params
        resident["reference_model"] = 0 if (s.stage == 3 and s.offload_param != "none") else ref_shard * b
    live = {"live_params": st.stage3_live_params(model, s, b, buckets)}

    stored = act.stored_activation_bytes(model, b, tokens, seqs, s.seq_len, s.attention,
                                         s.gradient_checkpointing)
    phases: dict[str, dict[str, int]] = {}
    phases["forward"] = {**resident, **live, "activations": stored,
                         "logits": act.logits_peak_bytes_per_token(model, b) * logit_tokens}
    if s.gradient_checkpointing:
        in_backward = stored + act.recompute_bytes(model, b, tokens, seqs, s.seq_len, s.attention)
    else:
        in_backward = stored + act.backward_temporaries_bytes(model, b, tokens)
    phases["backward"] = _merge(resident, live, st.backward_buffers(model, s, b, buckets),
                                {"activations": in_backward})
    phases["step"] = _merge(resident, st.step_buffers(model, s, b, buckets))
    if s.uses_reference:
        one_layer = act.layer_bytes_per_token(model, b, s.attention) * tokens
        phases["reference"] = {**resident, **live, "activations": one_layer,
                               "logits": (b + act.FP32) * model.vocab_size * logit_tokens}
    if s.workload == "grpo":
        phases["rollout"] = {**resident, **_rollout(model, s, b)}

    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    peak_phase = max(totals, key=totals.get)
    cpu = st.cpu_bytes_per_rank(model, s, b, buckets) * s.gpus_per_node
    if s.uses_reference and s.stage == 3 and s.offload_param == "cpu":
        cpu += math.ceil(model.params / s.world_size) * b * s.gpus_per_node
    return MemoryEstimate(totals[peak_phase], {k: v for k, v in phases[peak_phase].items() if v},
                          peak_phase, totals, cpu)


def _merge(*parts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0) + value
    return out


def _rollout(model, s: TrainSetup, b: int) -> dict[str, int]:
    """Generation of one generation batch (TRL: micro_batch x steps_per_generation completions).

    KV cache: batch x seq x layers x 2 (k, v) x kv_heads x head_dim; sampling keeps the last
    position's logits, their fp32 copy and the softmax probabilities; ZeRO-3 gathers the whole
    model for generation (ds3_gather_for_generation) when there is more than one rank.
    """
    batch = s.micro_batch * s.grad_accum
    kv = batch * s.seq_len * model.num_layers * 2 * model.num_kv_heads * model.head_dim * b
    prompt = max(1, s.seq_len - s.completion_len)
    prefill = act.layer_bytes_per_token(model, b, s.attention) * batch * prompt
    sampling = batch * model.vocab_size * (b + 2 * act.FP32)
    out = {"kv_cache": kv, "rollout": prefill + sampling}
    if s.stage == 3 and s.world_size > 1:
        out["gathered_params"] = model.params * b
    return out


def estimate_model_states(params: int, stage: int, world: int, k: int = 12) -> float:
    """The ZeRO paper's model-state bytes per GPU (2Ψ + 2Ψ + KΨ, partitioned by stage)."""
    return st.zero_paper_model_states(params, stage, world, k)
