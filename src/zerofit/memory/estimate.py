"""Per-GPU peak of ``torch.cuda.max_memory_allocated()`` for a DeepSpeed training step.

Pure arithmetic in bytes, no torch import. The peak is the maximum over the phases of a step
(step 2 onwards, when Adam's states exist), not a sum of everything:

- ``forward``  end of forward / start of backward: model states + stored activations + the fp32
  loss path over the full vocabulary (log_softmax, its grad and the grad it produces);
- ``backward`` gradient buckets allocated at the first grad hook + activations still held;
- ``step``     optimizer.step(): fp32 grad copy and the optimizer implementation's temporaries;
- ``reference`` (dpo/grpo with reference) the frozen model's forward without grad;
- ``rollout``  (grpo, transformers generate) generation with its KV cache and sampling logits;
- ``load``     (QLoRA under ZeRO-3) the whole 4-bit base on every GPU before
  ``deepspeed.initialize`` partitions it (``lora.zero3_qlora_load_bytes``).

Every other phase also holds cuBLAS's workspaces on a CUDA GPU (``cublas_workspace``,
``overheads.cublas_workspace_bytes``): torch takes them from the caching allocator.

What the GPU holds outside max_memory_allocated (CUDA context, allocator fragmentation, NCCL
buffers, a colocated vLLM's share) is computed in ``overheads`` and added by ``gpu_need_bytes``;
``fits`` compares that total plus a small safety margin with the GPU's memory.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from zerofit.memory import activations as act
from zerofit.memory import lora, losses
from zerofit.memory import overheads as oh
from zerofit.memory import states as st
from zerofit.memory.optimizers import host_step_temporary_bytes, resolve_optimizer

GIB = 1024**3
# the context before the model; overheads.cuda_context_bytes gives a training run's
CUDA_CONTEXT_BYTES = oh.CUDA_CONTEXT_BYTES
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class TrainSetup:
    """One training configuration on one rank's view. ``buckets=None``: zerofit's JSON sizes.

    ``stack`` defaults to ``accelerate`` here (a plain loop with torch's foreach AdamW, what the
    calibration runs used); ``Answers.stack`` defaults to ``hf``, what most users run, and the
    planner passes it through.
    """

    stage: int = 2
    world_size: int = 1
    gpus_per_node: int = 1
    # ZeRO++ at stage 3 (planning/options.py): none | hpz | hpz+qwz+qgz; hpZ's partition is a node
    zero_plus: str = "none"
    offload_optimizer: str = "none"
    offload_param: str = "none"
    precision: str = "bf16"
    gradient_checkpointing: bool = False
    micro_batch: int = 1
    seq_len: int = 2048
    # an encoder-decoder's target tokens per sequence (its decoder, final norm, LM head and loss
    # run on them; seq_len is the encoder's); None: as many as seq_len
    target_len: int | None = None
    grad_accum: int = 1
    attention: str = "sdpa"
    workload: str = "sft"
    num_generations: int = 8
    completion_len: int = 256
    reference_model: bool | None = None
    overlap_comm: bool = True
    # ZeRO-3's zero3_linear_wrap in place of F.linear (memory/lora.py
    # ``frozen_linears_save_inputs``); a user's JSON may turn it off
    memory_efficient_linear: bool = True
    buckets: dict | None = None
    # --- the training stack (see memory/optimizers.py and memory/losses.py for the sources)
    stack: str = "accelerate"  # hf | accelerate | deepspeed
    optimizer: str | None = None  # None: what the stack runs
    ds_optimizer_block: bool = False  # the DeepSpeed JSON has an ``optimizer`` block
    loss_kernel: str | None = None  # None: the stack's own (losses.loss_path)
    precompute_ref: bool = False  # dpo: reference log-probs computed before training
    # without DeepSpeed: the forward runs under torch.autocast (the HF Trainer's and accelerate's
    # bf16/fp16 mixed precision); False: a plain loop that computes in the weights' own dtype
    # (``compute_precision``), where peft's fp32 adapters then compute in fp32 (lora.py
    # ``lora_path_bytes``). DeepSpeed's bf16/fp16 engines cast the module and never autocast,
    # so under DeepSpeed it changes nothing.
    autocast: bool = True
    vllm_gpu_memory_utilization: float | None = None  # grpo: colocated vLLM's share of the GPU
    steps_per_generation: int | None = None  # grpo: None = grad_accum (TRL default)
    interconnect: str = "nvlink"  # intra-node link, sizes NCCL's channels
    # the GPU the step runs on (a hardware.CATALOG key): its compute capability sizes cuBLAS's
    # workspaces (overheads.cublas_workspace_bytes); None: no CUDA GPU (a CPU rank, as the CPU
    # probes run), so no cuBLAS
    gpu: str | None = None
    # the micro batch is padded to its longest sequence (an attention mask with zeros:
    # activations.padded_attention_bytes); False: equal-length rows, packed or padding-free, as
    # the calibration runs fed them (random ids, no attention_mask)
    padded: bool = False
    # stage 0 without DeepSpeed: the dtype the weights were loaded in (None: fp32, what TRL's
    # trainers load a model name in and what our recipes load; see ``weight_bytes``)
    weights_dtype: str | None = None
    # offload blocks' ``pin_memory`` (memory/pinned.py): on in zerofit's JSON
    # (configs/deepspeed_json.py) and DeepSpeed's default (runtime/zero/offload_config.py)
    pin_optimizer_offload: bool = True
    pin_param_offload: bool = True
    # --- adapters (memory/lora.py): full | lora | qlora, the adapters' rank, targets (all-linear,
    # attention or PEFT module names) and dropout; qlora's 4-bit storage dtype, "compute"
    # (bnb_4bit_quant_storage = the compute dtype: ZeRO-3 shards it) or "uint8" (the default)
    finetuning: str = "full"
    lora_rank: int = 16
    lora_targets: str = "all-linear"
    lora_dropout: float = 0.05
    quant_storage: str = "compute"

    def bucket_sizes(self, hidden_size: int) -> dict:
        """Bucket sizes in elements: explicit ones, else what zerofit writes, over DS defaults."""
        # DeepSpeed's own defaults (what the calibration runs used: no bucket keys in their JSON)
        from zerofit.memory.ds_defaults import deepspeed_default_buckets, ds_bucket_sizes

        if self.buckets is not None:
            return {**deepspeed_default_buckets(), **self.buckets}
        return {**deepspeed_default_buckets(), **ds_bucket_sizes(hidden_size, self.stage)}

    @property
    def own_target_len(self) -> int | None:
        """``target_len`` where it differs from ``seq_len``; None: the targets are as long as
        the inputs, the equal-length layer's count (``activations.LayerBatch``)."""
        return None if self.target_len == self.seq_len else self.target_len

    @property
    def uses_reference(self) -> bool:
        """A reference model is loaded (TRL: dpo always, grpo when beta > 0) unless its log-probs
        were precomputed (``DPOTrainer.__init__`` sets ``ref_model = None`` then)."""
        if self.precompute_ref:
            return False
        if self.reference_model is not None:
            return self.reference_model and self.workload in ("dpo", "grpo")
        return self.workload == "dpo"

    @property
    def without_deepspeed(self) -> bool:
        """Stage 0 of an accelerate / HF Trainer config is plain DDP (or one GPU): no DeepSpeed
        engine casts the weights or keeps a master copy. ``stack="deepspeed"`` is a script that
        calls ``deepspeed.initialize`` itself, so its stage 0 is DeepSpeed's (bf16 optimizer
        with an fp32 master)."""
        return self.stage == 0 and self.stack != "deepspeed"

    @property
    def weight_dtype(self) -> str:
        """The weights' dtype. DeepSpeed casts the module to the compute dtype
        (``deepspeed/runtime/engine.py:_configure_distributed_model``: ``module.bfloat16()`` /
        ``half()``). Without it the weights keep their load dtype: fp32 unless the user loaded
        them in bf16 (TRL 1.16 ``create_model_from_path`` defaults ``dtype`` to float32; plain
        ``from_pretrained`` in transformers 5 uses the checkpoint's dtype, "auto")."""
        if not self.without_deepspeed or self.precision == "fp32":
            return self.precision
        if self.weights_dtype is None and self.finetuning != "full":
            # adapters' bases are loaded in 16-bit by LLaMA-Factory, axolotl, ms-swift, torchtune
            # and the QLoRA recipes (torch_dtype=bfloat16): a frozen fp32 copy only costs memory
            return self.precision
        return self.weights_dtype or "fp32"

    @property
    def compute_precision(self) -> str:
        """The dtype the step computes its activations in: the precision, except in a loop
        without autocast and without DeepSpeed, which computes in the weights' dtype (bf16
        weights: bf16 activations; fp32 weights: an fp32 step whatever the precision says)."""
        if self.without_deepspeed and not self.autocast:
            return self.weight_dtype
        return self.precision

    @property
    def weight_bytes(self) -> int:
        """Element size of ``weight_dtype``."""
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def pins_offload(self) -> bool:
        """Some offload buffer is page-locked (an offloaded optimizer or parameters, pinned)."""
        return (self.offload_optimizer != "none" and self.pin_optimizer_offload) or (
            self.offload_param != "none" and self.pin_param_offload
        )

    def with_pinning(self, pin: bool) -> "TrainSetup":
        """This setup with every offload block's ``pin_memory`` set to ``pin``."""
        return dataclasses.replace(self, pin_optimizer_offload=pin, pin_param_offload=pin)

    @property
    def optimizer_impl(self) -> str:
        return resolve_optimizer(
            self.stack, self.optimizer, self.offload_optimizer, self.ds_optimizer_block
        )


@dataclass(frozen=True)
class MemoryEstimate:
    peak_bytes: int  # per-GPU max_memory_allocated()
    breakdown: dict[str, int]  # components of the peak phase; sums to peak_bytes
    phase: str  # which phase sets the peak
    phases: dict[str, int] = field(default_factory=dict)  # every phase's total
    cpu_bytes: int = 0  # host RAM for offload, per node
    context_bytes: int = CUDA_CONTEXT_BYTES
    allocator_bytes: int = 0  # caching-allocator fragmentation (overheads.py)
    nccl_bytes: int = 0  # NCCL communicator buffers per rank
    vllm_fraction: float = 0.0  # colocated vLLM's share of the GPU
    optimizer: str = "adamw_torch"  # the implementation that was assumed
    loss_path: str = "hf"
    activations_basis: str = "formula"  # activations.activations_basis

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def cpu_gib(self) -> float:
        return self.cpu_bytes / GIB

    def outside_bytes(self, capacity_gib: float) -> dict[str, int]:
        """What the GPU holds beyond max_memory_allocated, by term."""
        return {
            "allocator_fragmentation": self.allocator_bytes,
            "nccl_buffers": self.nccl_bytes,
            "cuda_context": self.context_bytes,
            "vllm_reserved": int(self.vllm_fraction * capacity_gib * GIB),
        }

    def gpu_need_bytes(self, capacity_gib: float) -> int:
        """Everything the GPU has to hold: the allocated peak plus every outside term."""
        return self.peak_bytes + sum(self.outside_bytes(capacity_gib).values())

    def breakdown_gib(self, capacity_gib: float | None = None) -> dict[str, float]:
        """Breakdown in GiB (rounded to 3 places), then the terms outside the peak, marked so."""
        out = {k: round(v / GIB, 3) for k, v in self.breakdown.items() if v}
        outside = self.outside_bytes(capacity_gib or 0.0)
        for name, value in outside.items():
            if value or name == "cuda_context":
                out[f"{name} (not in peak)"] = round(value / GIB, 3)
        return out

    def fits(
        self,
        capacity_gib: float,
        headroom: float = 1.0,
        safety_margin_gib: float = oh.DEFAULT_SAFETY_MARGIN_GIB,
    ) -> bool:
        """True when the allocated peak, every outside term and the safety margin stay within
        ``capacity_gib * headroom`` (headroom 1.0: the whole GPU; lower it to keep some free)."""
        need = self.gpu_need_bytes(capacity_gib) + safety_margin_gib * GIB
        return need <= capacity_gib * headroom * GIB


@dataclass(frozen=True)
class StepSizes:
    """The element sizes, token counts, buckets, loss path and optimizer one step of a setup is
    built from."""

    compute_bytes: int  # element size of the compute dtype (the precision)
    weight_bytes: int  # element size of the weights (TrainSetup.weight_dtype)
    # the residual stream's element size: without DeepSpeed, fp32 weights under autocast keep an
    # fp32 residual stream (activations.py); with it, the compute dtype
    residual_bytes: int
    buckets: dict
    sequences: int  # sequences in one forward
    tokens: int  # tokens in one forward
    logit_tokens: int  # tokens the loss scores over the vocabulary (losses.scored_tokens)
    loss_path: str  # losses.loss_path
    optimizer: str  # the optimizer implementation (optimizers.resolve_optimizer)


def step_sizes(model, setup: TrainSetup) -> StepSizes:
    """The sizes of one step of ``setup`` on ``model``."""
    compute_bytes = DTYPE_BYTES[setup.compute_precision]
    weight_bytes = setup.weight_bytes
    # dpo: TRL concatenates chosen + rejected into one forward (DPOTrainer concatenated inputs)
    sequences = setup.micro_batch * (2 if setup.workload == "dpo" else 1)
    tokens = sequences * setup.seq_len
    # an encoder-decoder scores its targets (T5ForConditionalGeneration: lm_head over the
    # decoder's output); None: as many as the inputs
    target_tokens = sequences * (setup.target_len or setup.seq_len)
    return StepSizes(
        compute_bytes=compute_bytes,
        weight_bytes=weight_bytes,
        residual_bytes=weight_bytes if setup.without_deepspeed else compute_bytes,
        buckets=setup.bucket_sizes(model.hidden_size),
        sequences=sequences,
        tokens=tokens,
        logit_tokens=losses.scored_tokens(
            setup.stack, setup.workload, target_tokens, sequences * setup.completion_len
        ),
        loss_path=losses.loss_path(setup.stack, setup.workload, setup.loss_kernel),
        optimizer=setup.optimizer_impl,
    )


@dataclass(frozen=True)
class ActivationBytes:
    """What the activations hold at each moment of a step, and the autocast weight copies."""

    stored: int  # saved by the forward for backward
    in_backward: int  # while the layers' backward runs: stored + recompute or temporaries
    last_layer: int  # the first layer's backward, at the end of backward
    casts: int  # autocast's copies of fp32 weights alive at the forward's end, inside autocast
    casts_in_backward: int  # those of them still saved in backward
    # those alive once the forward has left autocast (its cache emptied), at the loss's backward
    casts_after_forward: int


def activation_bytes(model, setup: TrainSetup, sizes: StepSizes) -> ActivationBytes:
    """Activations of one micro batch at the forward's end, through backward and at its end."""
    compute, residual = sizes.compute_bytes, sizes.residual_bytes
    tokens, sequences = sizes.tokens, sizes.sequences
    batch = act.LayerBatch(
        sequences, setup.seq_len, setup.attention, residual, setup.padded, setup.own_target_len
    )
    if lora.is_adapter(setup):
        return adapter_activation_bytes(model, setup, sizes, batch)
    stored = act.stored_activation_bytes(model, compute, batch, setup.gradient_checkpointing)
    # fp32 weights under autocast: autocast caches each weight's cast (a leaf that requires grad,
    # aten/src/ATen/autocast_mode.cpp: cached_cast) until the forward leaves autocast, which
    # empties the cache (torch/amp/autocast_mode.py: autocast.__exit__ calls
    # torch.clear_autocast_cache()); the casts the matmuls saved for backward outlive it
    casts = st.autocast_weight_bytes(model, compute) if sizes.weight_bytes > compute else 0
    if setup.gradient_checkpointing:
        recompute = act.recompute_bytes(model, compute, batch)
        # the first layer's backward: its recomputed layer and its own saved input (and the
        # padded batch's boolean mask, which that layer's recompute closure still holds)
        last_layer = recompute + residual * model.hidden_size * tokens
        if setup.padded:
            last_layer += act.padding_mask_bytes(sequences, setup.seq_len, setup.attention)
        # a checkpointed layer saves only its input, not its casts: after the forward only the
        # LM head's (outside the layers, saved by its matmul) is alive. In backward each layer's
        # recompute casts its weights again under the autocast state the checkpoint restores
        # (torch/utils/checkpoint.py: recompute_fn), and its matmuls save them for its backward
        lm_head = model.vocab_size * model.hidden_size * compute if casts else 0
        casts_in_backward = lm_head + st.layer_params(model) * compute if casts else 0
        return ActivationBytes(
            stored, stored + recompute, last_layer, casts, casts_in_backward, lm_head
        )
    temporaries = act.batch_backward_temporaries_bytes(model, compute, batch)
    one_layer = act.layer_batch_bytes(model, compute, batch)
    last_layer = one_layer + temporaries
    return ActivationBytes(stored, stored + temporaries, last_layer, casts, casts, casts)


def adapter_activation_bytes(
    model, setup: TrainSetup, sizes: StepSizes, batch: act.LayerBatch
) -> ActivationBytes:
    """Activations with LoRA / QLoRA adapters: the full fine-tune's layer plus what the adapters
    and the frozen base change (lora.adapter_layer_delta_per_token, the final norm's
    adapter_final_delta_per_token, the first layer's input norm when its input needs no grad).

    While the layers' backward runs, the final norm's and the LM head's saved tensors are
    already freed. A layer's backward holds the grad coming in (one residual-stream tensor) and,
    at ``down_proj``, the frozen weight's input grad, the adapter's and their sum, while its own
    product is freed: two intermediate-width tensors beyond the saved ones (measured with the
    probe's storage tracker, tests/memory/test_lora.py)."""
    compute, residual, tokens = sizes.compute_bytes, sizes.residual_bytes, sizes.tokens
    h = model.hidden_size
    layer_delta = lora.adapter_layer_delta_per_token(model, setup, compute, residual) * tokens
    loss_path = sizes.loss_path
    final_delta = lora.adapter_final_delta_per_token(model, setup, residual, compute, loss_path)
    final = (act.final_bytes_per_token(model, compute, residual) + final_delta) * tokens
    first_layer = lora.first_layer_saving_per_token(model, setup) * tokens
    one_layer = act.one_layer_bytes(
        model, compute, batch.micro_batch, batch.seq_len, batch.attention, residual, batch.padded
    )
    temporaries = (residual * h + _mlp_backward_grads(model, setup) * compute
                   * model.intermediate_size) * tokens
    casts, casts_in_backward = _adapter_autocast_casts(model, setup, sizes)
    # the fused experts' folded weights, kept per layer, and their gradient in a layer's backward
    expert_bytes = _expert_weight_bytes(setup, sizes)
    experts = lora.fused_expert_weight_bytes(model, setup, expert_bytes)
    expert_grad = lora.fused_expert_gradient_bytes(model, setup, expert_bytes)
    stored = act.stored_activation_bytes(model, compute, batch, setup.gradient_checkpointing)
    stored += final_delta * tokens
    if not setup.gradient_checkpointing:
        stored += model.num_layers * (layer_delta + experts) - first_layer
        last_layer = one_layer + layer_delta - first_layer + temporaries + experts + expert_grad
        in_backward = stored - final + temporaries + expert_grad
        return ActivationBytes(stored, in_backward, last_layer, casts, casts_in_backward, casts)
    recompute = one_layer + layer_delta + temporaries + experts + expert_grad
    if residual == act.FP32:
        # fp32 norms: ``x.to(torch.float32)`` returns the layer's input itself, the checkpoint
        recompute -= act.FP32 * h * tokens
    last_layer = recompute + residual * h * tokens
    if setup.padded:
        last_layer += act.padding_mask_bytes(batch.micro_batch, batch.seq_len, batch.attention)
    in_backward = stored - final + recompute
    return ActivationBytes(stored, in_backward, last_layer, casts, casts_in_backward, casts)


def _expert_weight_bytes(setup: TrainSetup, sizes: StepSizes) -> int:
    """Element size of the experts' weights: DeepSpeed casts the module to the compute dtype,
    without it they keep their load dtype."""
    return sizes.weight_bytes if setup.without_deepspeed else sizes.compute_bytes


def _mlp_backward_grads(model, setup: TrainSetup) -> int:
    """Intermediate-width grads the MLP's backward holds beyond the saved activations. ``act_fn(
    gate) * up``'s backward makes two (one per operand) while the grad of its output is alive.
    When ``down_proj``'s ``lora_A`` saved that output (a targeted ``down_proj``), the output is
    freed by then and counted among the saved tensors: two beyond them. A frozen ``down_proj``
    saves no input: all three are beyond them (probed: tests/memory/test_lora.py)."""
    layer = lora.layer_linear_shapes(model)
    targets = lora.targeted_modules(model, setup.lora_targets)
    return 3 if "down_proj" in layer and "down_proj" not in targets else 2


def _adapter_autocast_casts(model, setup: TrainSetup, sizes: StepSizes) -> tuple[int, int]:
    """Autocast's compute-dtype copies of fp32 weights with adapters, at the forward's end and
    in backward. Autocast caches casts of leaf tensors that require grad
    (``aten/src/ATen/autocast_mode.cpp:cached_cast``): the adapters' stay until autocast exits.
    A frozen weight's cast is made per call and kept only as the matmul's saved tensor (its
    input's gradient needs it): every layer's without checkpointing; with it, the LM head's,
    and in backward also the recomputed layer's. A 4-bit base is dequantized per call instead
    (lora.dequantized_weight_bytes)."""
    compute = sizes.compute_bytes
    if setup.without_deepspeed and not setup.autocast:
        return 0, 0  # nothing is cast: every matmul runs in its operands' own dtype
    adapters = 0
    if setup.without_deepspeed and lora.adapter_element_bytes(setup, compute) > compute:
        if setup.precision != "fp32":
            trainable = lora.adapter_params(model, setup.lora_rank, setup.lora_targets)
            adapters = trainable * compute
    if sizes.weight_bytes <= compute or setup.finetuning == "qlora":
        return adapters, adapters
    if not setup.gradient_checkpointing:
        casts = adapters + st.autocast_weight_bytes(model, compute)
        return casts, casts
    lm_head = model.vocab_size * model.hidden_size * compute
    linear = sum(fan_in * fan_out for fan_in, fan_out in lora.layer_linear_shapes(model).values())
    return adapters + lm_head, adapters + lm_head + linear * compute


def estimate_memory(model, setup: TrainSetup) -> MemoryEstimate:
    """Predict the per-GPU peak and its breakdown for ``model`` trained as ``setup``;
    ZerofitError for a setup the training stack refuses (``lora.check_fused_expert_dropout``)."""
    lora.check_fused_expert_dropout(model, setup)
    sizes = step_sizes(model, setup)
    compute = sizes.compute_bytes
    resident = _resident_bytes(model, setup, sizes)
    live = {"live_params": _live_params(model, setup, sizes)}
    activations = activation_bytes(model, setup, sizes)
    backward, step = _gradient_buffers(model, setup, sizes)
    phases: dict[str, dict[str, int]] = {}
    phases["forward"] = _forward_phase(model, setup, sizes, resident, live, activations)
    phases["backward"] = _backward_phase(model, setup, resident, live, backward, activations)
    phases["step"] = _merge(resident, step)
    if setup.uses_reference:
        phases["reference"] = _reference_phase(model, setup, sizes, resident, live, activations)
    if setup.workload == "grpo" and not setup.vllm_gpu_memory_utilization:
        # with vLLM colocated, generation happens inside vLLM's own share (vllm_reserved)
        # TRL generates outside autocast (GRPOTrainer._generate_single_turn: torch.no_grad()
        # only), so without DeepSpeed generation runs in the weights' dtype
        phases["rollout"] = {**resident, **_rollout(model, setup, sizes.weight_bytes)}
    workspaces = oh.cublas_workspace_bytes(setup.gpu)
    if workspaces:
        # allocated at the first matmul of each thread and kept: every phase holds them
        for parts in phases.values():
            parts["cublas_workspace"] = workspaces
    load = lora.zero3_qlora_load_bytes(model, setup, compute)
    if load:
        # QLoRA under ZeRO-3: every GPU holds the whole 4-bit base before deepspeed.initialize
        # partitions it (before any matmul: no cuBLAS workspace yet)
        phases["load"] = load

    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    peak_phase = max(totals, key=totals.get)
    largest = _largest_free_range(
        model, setup, sizes, phases, peak_phase, {"backward": backward, "step": step}
    )
    return MemoryEstimate(
        totals[peak_phase],
        {name: value for name, value in phases[peak_phase].items() if value},
        peak_phase,
        totals,
        _host_bytes(model, setup, sizes),
        context_bytes=oh.cuda_context_bytes(setup.stage, deepspeed=not setup.without_deepspeed),
        allocator_bytes=oh.allocator_fragmentation_bytes(
            model, setup.gradient_checkpointing, largest
        ),
        nccl_bytes=oh.nccl_buffer_bytes(setup.world_size, setup.gpus_per_node, setup.interconnect),
        vllm_fraction=float(setup.vllm_gpu_memory_utilization or 0.0),
        optimizer=sizes.optimizer,
        loss_path=sizes.loss_path,
        activations_basis=act.activations_basis(
            model, compute, setup.attention, sizes.residual_bytes
        ),
    )


def _forward_phase(
    model,
    setup: TrainSetup,
    sizes: StepSizes,
    resident: dict,
    live: dict,
    activations: ActivationBytes,
) -> dict[str, int]:
    """The end of the forward and the start of its backward: the stored activations and the
    loss path's largest moment (``losses.train_loss_bytes``), with the autocast casts alive
    then. Autocast's cache is emptied when the forward leaves autocast, so the loss's backward
    holds only the casts saved for backward; where those are fewer (checkpointing), the moment
    inside autocast, every cached cast with the loss's forward tensors, may be the larger."""
    compute = sizes.compute_bytes
    loss_bytes = losses.train_loss_bytes(sizes.loss_path, model, compute, sizes.logit_tokens)
    loss_bytes -= _frozen_head_grad_bytes(model, setup, sizes)
    stored = {**resident, **live, "activations": activations.stored}
    at_loss = {**stored, "logits": loss_bytes}
    if activations.casts_after_forward:
        at_loss["autocast_weights"] = activations.casts_after_forward
    if activations.casts_after_forward == activations.casts:
        return at_loss
    in_autocast = {
        **stored,
        "logits": _loss_forward_bytes(model, sizes, loss_bytes),
        "autocast_weights": activations.casts,
    }
    return max(at_loss, in_autocast, key=lambda parts: sum(parts.values()))


def _loss_forward_bytes(model, sizes: StepSizes, loss_bytes: int) -> int:
    """What the loss path holds inside the forward: transformers' loss on the full logits
    (``activations.logits_forward_bytes_per_token``); the other paths' whole ``loss_bytes``,
    their forward and backward not told apart here (an upper bound)."""
    if sizes.loss_path != "hf":
        return loss_bytes
    per_token = act.logits_forward_bytes_per_token(model, sizes.compute_bytes)
    return per_token * sizes.logit_tokens


def _live_params(model, setup: TrainSetup, sizes: StepSizes) -> int:
    """ZeRO-3's gathered parameters (states.stage3_live_params); with adapters, they are
    gathered with their layer, and a sharded 4-bit base gathers its packed NF4 values, counted
    in DeepSpeed's elements, its LM head 16-bit weights (lora.zero3_live_param_bytes)."""
    if lora.is_adapter(setup):
        return lora.zero3_live_param_bytes(model, setup, sizes.compute_bytes, sizes.buckets)
    return st.stage3_live_params(model, setup, sizes.compute_bytes, sizes.buckets)


def _frozen_head_grad_bytes(model, setup: TrainSetup, sizes: StepSizes) -> int:
    """What the fused loss paths do not allocate for a frozen LM head (adapters that leave it
    out): TRL's head accumulates its weight's grad in fp32 and casts it only when the weight
    needs a grad (``trl/kernels/chunked_logprob.py`` ``ChunkedLogProbFunction.backward``:
    ``needs_input_grad``), Liger's ``grad_weight`` likewise (``losses.train_loss_bytes`` counts
    both for a trained head)."""
    if not lora.is_adapter(setup) or "lm_head" in lora.targeted_modules_names(setup.lora_targets):
        return 0
    head = model.vocab_size * model.hidden_size
    if sizes.loss_path == "trl_fused":
        return head * (act.FP32 + sizes.compute_bytes)
    if sizes.loss_path == "liger":
        return head * sizes.compute_bytes
    return 0


def _gradient_buffers(model, setup: TrainSetup, sizes: StepSizes) -> tuple[dict, dict]:
    """The buffers backward and the optimizer step add (states.py; lora.py for adapters)."""
    compute, weight_bytes, buckets = sizes.compute_bytes, sizes.weight_bytes, sizes.buckets
    if lora.is_adapter(setup):
        if setup.without_deepspeed:
            adapter_bytes = lora.adapter_element_bytes(setup, compute)
            trainable = lora.adapter_params(model, setup.lora_rank, setup.lora_targets)
            backward = {"gradients": trainable * adapter_bytes} if setup.grad_accum == 1 else {}
            step = lora.plain_adapter_step(model, setup, adapter_bytes, sizes.optimizer)
            return backward, step
        backward = lora.adapter_backward_buffers(model, setup, compute, buckets)
        step = lora.adapter_step_buffers(model, setup, compute, buckets, sizes.optimizer)
        return backward, step
    if setup.without_deepspeed:
        backward = st.plain_backward_buffers(model, setup, weight_bytes)
        step = st.plain_step_buffers(model, setup, weight_bytes, sizes.optimizer)
        return backward, step
    backward = st.backward_buffers(model, setup, compute, buckets)
    step = st.step_buffers(model, setup, compute, buckets, sizes.optimizer)
    return backward, step


def _resident_bytes(model, setup: TrainSetup, sizes: StepSizes) -> dict[str, int]:
    """What stays on the GPU for the whole step: the model states (states.py) and the
    reference model."""
    if lora.is_adapter(setup):
        # the reference is the policy with its adapters disabled: TRL's DPOTrainer / GRPOTrainer
        # given a PEFT model and no ref_model run it under ``use_adapter(..., None)`` /
        # ``disable_adapter()``, no second copy of the weights
        if setup.without_deepspeed:
            adapter_bytes = lora.adapter_element_bytes(setup, sizes.compute_bytes)
            return lora.plain_adapter_resident(model, setup, sizes.weight_bytes, adapter_bytes)
        return lora.adapter_resident_states(model, setup, sizes.compute_bytes, sizes.buckets)
    if setup.without_deepspeed:
        resident = st.plain_resident_states(model, setup, sizes.weight_bytes)
    else:
        resident = st.resident_states(model, setup, sizes.compute_bytes, sizes.buckets)
    if setup.uses_reference:
        # trl/models/utils.py:prepare_deepspeed: the reference keeps ZeRO-3 (sharded) only under
        # stage 3; any other stage is turned into stage 0, a full bit16 replica on every GPU.
        # Without DeepSpeed TRL loads it in the policy's dtype (GRPOTrainer/DPOTrainer __init__:
        # ``ref_model_init_kwargs.setdefault("dtype", self.model.dtype)``).
        sharded = setup.stage == 3
        reference = math.ceil(model.params / setup.world_size) if sharded else model.params
        offloaded = sharded and setup.offload_param != "none"
        resident["reference_model"] = 0 if offloaded else reference * sizes.weight_bytes
    return resident


def _backward_phase(
    model,
    setup: TrainSetup,
    resident: dict,
    live: dict,
    backward: dict,
    activations: ActivationBytes,
) -> dict[str, int]:
    """The backward's peak: without DeepSpeed at one end of backward (``_plain_backward``);
    under ZeRO, the worst moment one parameter's grad adds to (states.backward_moments), each
    with the activations alive then."""
    if lora.is_adapter(setup):
        return _adapter_backward(model, setup, resident, live, backward, activations)
    if setup.without_deepspeed and backward:
        return _plain_backward(
            model,
            setup,
            resident,
            backward,
            (activations.in_backward, activations.last_layer),
            activations.casts_in_backward,
        )
    compute = DTYPE_BYTES[setup.compute_precision]
    phase = _merge(resident, live, backward, {"activations": activations.in_backward})
    if activations.casts_in_backward:
        phase["autocast_weights"] = activations.casts_in_backward
    activations_at = {"head": activations.stored, "layers": activations.in_backward, "end": 0}
    # at the end of backward ZeRO-3 has released every other gathered weight: only the
    # embedding being differentiated is still gathered
    embedding = model.vocab_size * model.hidden_size * compute
    live_at = {"end": {"live_params": min(live["live_params"], embedding)}}
    moments = [phase]
    for moment, extra in st.backward_moments(model, setup, compute).items():
        moment_live = live_at.get(moment, live)
        moments.append(
            _merge(resident, moment_live, backward, extra, {"activations": activations_at[moment]})
        )
    return max(moments, key=lambda parts: sum(parts.values()))


def _adapter_backward(
    model,
    setup: TrainSetup,
    resident: dict,
    live: dict,
    backward: dict,
    activations: ActivationBytes,
) -> dict[str, int]:
    """Backward with adapters: the frozen LM head and embedding make no gradient, so the peak is
    at the start of the layers' backward (every activation, the adapters' grads as they come)
    or at its end (the first layer's backward); QLoRA adds one dequantized weight
    (lora.dequantized_weight_bytes)."""
    compute = DTYPE_BYTES[setup.compute_precision]
    extra = {}
    tokens = setup.micro_batch * setup.seq_len * (2 if setup.workload == "dpo" else 1)
    dequantized = lora.dequantized_weight_peak_bytes(model, setup, compute, tokens)
    if dequantized:
        extra["dequantized_weight"] = dequantized
    if activations.casts_in_backward:
        extra["autocast_weights"] = activations.casts_in_backward
    start = _merge(resident, live, extra, {"activations": activations.in_backward})
    end = _merge(resident, live, backward, extra, {"activations": activations.last_layer})
    if not setup.without_deepspeed:
        start = _merge(start, backward)
    return max(start, end, key=lambda parts: sum(parts.values()))


def _reference_phase(
    model,
    setup: TrainSetup,
    sizes: StepSizes,
    resident: dict,
    live: dict,
    activations: ActivationBytes,
) -> dict[str, int]:
    """The frozen reference model's forward without grad (dpo, grpo with a reference)."""
    compute = sizes.compute_bytes
    one_layer = act.one_layer_bytes(
        model,
        compute,
        sizes.sequences,
        setup.seq_len,
        setup.attention,
        sizes.residual_bytes,
        setup.padded,
    )
    reference = {
        **resident,
        **live,
        "activations": one_layer,
        "logits": losses.reference_loss_bytes(sizes.loss_path, model, compute, sizes.logit_tokens),
    }
    if lora.is_adapter(setup):
        # the reference is the policy with its adapters disabled, run under no_grad: a layer's
        # tensors are freed before the head runs, so its largest moment is one or the other
        # (TRL's DPOTrainer with a peft model, probed in tests/memory/test_lora.py)
        head = reference.pop("logits")
        reference["activations"] = max(one_layer, head)
    if setup.workload == "dpo":
        # the policy forward ran first and its graph waits for backward (losses.py:
        # policy_held_bytes); GRPO scores the reference while generating, before the policy
        reference["policy_activations"] = activations.stored
        reference["policy_logits"] = losses.policy_held_bytes(
            sizes.loss_path, model, compute, sizes.logit_tokens
        )
    return reference


def _largest_free_range(
    model,
    setup: TrainSetup,
    sizes: StepSizes,
    phases: dict[str, dict[str, int]],
    peak_phase: str,
    buffers: dict[str, dict],
) -> int:
    """The allocator's worst unusable free range at the peak: blocks freed before the peak and
    split for smaller live tensors leave it, but requests smaller than it fill it, so only the
    leftover is lost (overheads.allocator_fragmentation_bytes)."""
    if peak_phase == "load":
        return 0  # the model is loaded before anything else is allocated and freed
    largest = max(
        (
            _largest_transient(name, model, setup, sizes, buffers, parts, phases[peak_phase])
            for name, parts in phases.items()
            if name != peak_phase
        ),
        default=0,
    )
    request = _largest_request(peak_phase, model, setup)
    return largest if request is None else min(largest, request)


def _host_bytes(model, setup: TrainSetup, sizes: StepSizes) -> int:
    """Host RAM for offload per node: every rank's buffers (states.cpu_bytes_per_rank), the CPU
    optimizer's step temporaries, and a reference model's parameters offloaded under ZeRO-3."""
    per_node = setup.gpus_per_node
    owned = math.ceil(model.params / setup.world_size)
    if lora.is_adapter(setup):
        return lora.adapter_host_bytes_per_rank(model, setup, sizes.compute_bytes) * per_node
    host = st.cpu_bytes_per_rank(model, setup, sizes.compute_bytes, sizes.buckets) * per_node
    if setup.offload_optimizer == "cpu":
        host += host_step_temporary_bytes(sizes.optimizer, owned) * per_node
    if setup.uses_reference and setup.stage == 3 and setup.offload_param == "cpu":
        host += owned * sizes.compute_bytes * per_node
    return host


def _largest_transient(
    phase: str,
    model,
    setup: TrainSetup,
    sizes: StepSizes,
    buffers: dict[str, dict],
    parts: dict,
    peak_parts: dict,
) -> int:
    """The biggest single short-lived tensor of ``phase`` (a phase other than the peak's sizes
    the allocator's worst unusable free range, see overheads.py). Of backward's buffers, one the
    peak phase still holds (``peak_parts``) was not freed before the peak, so it is skipped."""
    hidden, vocab, compute = model.hidden_size, model.vocab_size, sizes.compute_bytes
    path, logit_tokens = sizes.loss_path, sizes.logit_tokens
    if phase in ("forward", "reference"):
        if path == "hf":
            return act.FP32 * vocab * logit_tokens  # the fp32 logits / log_softmax tensor
        if path == "trl_logps":
            return compute * vocab * logit_tokens  # the compute-dtype logits
        # the LM-head grad accumulator
        return vocab * hidden * (act.FP32 if path == "trl_fused" else compute)
    if setup.without_deepspeed and phase in ("backward", "step"):
        # per-parameter .grad tensors and foreach temporaries: the biggest is one weight's
        return st.largest_param(model) * setup.weight_bytes
    if phase == "backward":
        backward = buffers["backward"]
        # ZeRO-1/2's grads_in_partition ("gradients") lives on into the step until its fp32
        # copy exists (stage_1_and_2.py: step, ``self.averaged_gradients[i] = None`` after
        # ``flat_grad_partition.to(fp32)``): when the step is the peak it is no free range
        candidates = {
            "comm_buckets": backward.get("comm_buckets", 0) // 2,
            "gradients": backward.get("gradients", 0),
            "tied_embedding_grad": backward.get("tied_embedding_grad", 0),
        }
        return max((size for name, size in candidates.items() if name not in peak_parts), default=0)
    if phase == "step":
        step = buffers["step"]
        if "grad_norm_fp64" in step:
            return step["grad_norm_fp64"]  # one parameter's slice in fp64, the largest request
        if "optimizer_step_temp" in step:
            return max(step.get("fp32_grads", 0), step["optimizer_step_temp"])
        # fp32_grads holds the flattened bit16 copy and the fp32 copy: the fp32 one is the larger
        return step.get("fp32_grads", 0) * act.FP32 // (act.FP32 + compute)
    return max(parts.get("kv_cache", 0) // max(1, model.num_layers), parts.get("rollout", 0) // 2)


def _plain_backward(
    model,
    setup: TrainSetup,
    resident: dict,
    backward: dict,
    activations: tuple[int, int],
    casts: int,
) -> dict[str, int]:
    """Backward without DeepSpeed: autograd creates each ``.grad`` when that weight's gradient
    is ready, from the LM head down, while the saved activations are freed layer by layer from
    the top. With equal layers, grads-so-far + activations-left is linear in the layers done, so
    its maximum is at an end: the start (the LM head's grad + every activation, ``activations[0]``)
    or the end (every grad + the first layer's backward, ``activations[1]``)."""
    head = model.vocab_size * model.hidden_size * setup.weight_bytes
    start = _merge(resident, {"gradients": head, "activations": activations[0]})
    if casts:
        start["autocast_weights"] = casts
    end = _merge(resident, backward, {"activations": activations[1]})
    if model.tie_embeddings:
        # the embedding's own grad and its out-of-place sum with the LM head's (states.py:
        # backward_moments) before ``.grad`` takes the sum
        end["tied_embedding_sum"] = 2 * head
    return max(start, end, key=lambda parts: sum(parts.values()))


def _largest_request(phase: str, model, setup: TrainSetup) -> int | None:
    """The biggest single allocation the peak phase makes, where it is known to be small: an
    optimizer step without DeepSpeed allocates per parameter (foreach lists, one tensor each,
    ``torch/optim/adam.py:_multi_tensor_adam``), so it can use any free range down to one
    weight's size. ``None``: the phase makes large flat requests (DeepSpeed's partitions,
    logits) that a split range may not hold."""
    if setup.without_deepspeed and phase == "step":
        return st.largest_param(model) * setup.weight_bytes
    return None


def _merge(*parts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0) + value
    return out


def _rollout(model, setup: TrainSetup, element_bytes: int) -> dict[str, int]:
    """Generation of one generation batch (TRL: micro_batch x steps_per_generation completions,
    ``steps_per_generation`` defaulting to gradient_accumulation_steps in ``GRPOConfig``), its
    tensors ``element_bytes`` wide.

    KV cache: batch x seq x layers x 2 (k, v) x kv_heads x head_dim; sampling keeps the last
    position's logits, their fp32 copy and the softmax probabilities; ZeRO-3 gathers the whole
    model for generation (ds3_gather_for_generation) when there is more than one rank.
    """
    batch = setup.micro_batch * (setup.steps_per_generation or setup.grad_accum)
    kv = (
        batch
        * setup.seq_len
        * model.num_layers
        * 2
        * model.num_kv_heads
        * model.head_dim
        * element_bytes
    )
    prompt = max(1, setup.seq_len - setup.completion_len)
    # left-padded prompts of a padded batch: the prefill's layer repeats K/V and copies the mask
    prefill = act.one_layer_bytes(
        model, element_bytes, batch, prompt, setup.attention, padded=setup.padded
    )
    sampling = batch * model.vocab_size * (element_bytes + 2 * act.FP32)
    out = {"kv_cache": kv, "rollout": prefill + sampling}
    if setup.stage == 3 and setup.world_size > 1:
        out["gathered_params"] = model.params * element_bytes
    return out


def estimate_model_states(params: int, stage: int, world: int, k: int = 12) -> float:
    """The ZeRO paper's model-state bytes per GPU (2Ψ + 2Ψ + KΨ, partitioned by stage)."""
    return st.zero_paper_model_states(params, stage, world, k)
