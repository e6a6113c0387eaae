"""Activation and logits bytes of a Hugging Face decoder (Qwen2/Llama family) training step.

Pure arithmetic derived from what autograd keeps alive in transformers' modeling code:
each term below names the op that saves the tensor. ``a`` is the element size of the compute
dtype (2 for bf16/fp16, 4 for fp32). ``r`` (``residual``, default ``a``) is the element size of
the residual stream: the compute dtype when the weights are in it (DeepSpeed casts them), 4 when
fp32 weights run under autocast (DDP / one GPU without DeepSpeed: the embedding, the RMSNorms and
the residual adds are not autocast ops, so the stream between layers stays fp32 while every
linear layer computes in ``a``). All functions return bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

FP32 = 4
# the memory-efficient sdpa kernel's alignment of a mask's last dimension: torch pads the
# converted [batch, 1, q, kv] mask to it and keeps the padded copy (aten/src/ATen/native/
# transformers/attention.cpp: preprocess_mask, mem_eff_alignment; 16 in torch 2.1-2.2, where
# the copy was padded after expanding to every head)
SDPA_MASK_ALIGNMENT = 8


@dataclass(frozen=True)
class NormLayout:
    """Where a decoder layer's RMSNorms sit, read from transformers' modeling code.

    ``pre``: norms whose output the attention / MLP projections take; ``post``: norms on the
    attention / MLP outputs before the residual add (their output is added, not saved); ``qk``:
    "head" when q and k are normalised per head before RoPE, "full" over the whole projected q
    and k; ``fp32_weight``: the weight multiplies the normalised tensor in fp32 (Gemma's
    ``output * (1.0 + self.weight.float())``, OLMo2's norm) so that fp32 tensor is what the
    multiply saves, where Llama's norm casts back to the input dtype first.
    """

    pre: int = 2
    post: int = 0
    qk: str = ""
    fp32_weight: bool = False


NORM_LAYOUTS = {
    # models/qwen3/modeling_qwen3.py:Qwen3Attention (q_norm / k_norm over head_dim)
    "qwen3": NormLayout(qk="head"),
    "qwen3_moe": NormLayout(qk="head"),
    # models/gemma/modeling_gemma.py:GemmaRMSNorm
    "gemma": NormLayout(fp32_weight=True),
    # models/gemma3/modeling_gemma3.py:Gemma3DecoderLayer: pre and post norms around attention
    # and MLP, q_norm / k_norm per head
    "gemma3_text": NormLayout(post=2, qk="head", fp32_weight=True),
    # models/olmo2/modeling_olmo2.py:Olmo2DecoderLayer: post norms only, q_norm / k_norm over the
    # projected q and k; the projections take the residual stream itself
    "olmo2": NormLayout(pre=0, post=2, qk="full", fp32_weight=True),
}
LLAMA_NORMS = NormLayout()
# model types whose decoder layer the formulas below were checked against, tensor by tensor,
# on transformers' own modules (tests/memory/test_activations.py). Every other architecture
# transformers can build is traced from its own modeling code (layer_trace.py); only what it
# cannot build (remote-code families) falls back to the Llama-style formulas.
FORMULA_LAYER_TYPES = ("llama", "mistral", "qwen2", "mixtral", *NORM_LAYOUTS)


def traced_layer(model, a: int, attention: str = "sdpa", residual: int | None = None):
    """The decoder layer traced from transformers' modeling code (``layer_trace.LayerTrace``) for
    an architecture without a formula here, or None (a formula family, no config.json to build
    it from, or an architecture transformers cannot build)."""
    if model.architecture in FORMULA_LAYER_TYPES or not getattr(model, "config_json", ""):
        return None
    from zerofit.memory.layer_trace import trace_decoder_layer

    return trace_decoder_layer(model.config_json, a, attention, residual or a)


def is_encoder_decoder(model) -> bool:
    """Whether ``model`` is an encoder-decoder (T5, BART), whose targets may be shorter than its
    inputs (``LayerBatch.target_len``): its config.json's ``is_encoder_decoder`` (what
    ``save_pretrained`` writes for T5, as it differs from ``PreTrainedConfig``'s default), else
    its config class's (transformers' ``CONFIG_MAPPING``, imported only then)."""
    config = json.loads(getattr(model, "config_json", "") or "{}")
    if "is_encoder_decoder" in config or "model_type" not in config:
        return bool(config.get("is_encoder_decoder", False))
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        return bool(getattr(CONFIG_MAPPING[config["model_type"]](), "is_encoder_decoder", False))
    except (ImportError, KeyError):  # no transformers, or a remote-code model type
        return False


def traced_encoder_decoder_layer(model, a: int, attention: str, residual: int | None = None):
    """An encoder-decoder's layer traced with source and target lengths apart
    (``layer_trace.EncoderDecoderTrace``), or None (no config.json, or not traceable)."""
    if not getattr(model, "config_json", ""):
        return None
    from zerofit.memory.layer_trace import trace_encoder_decoder_layer

    return trace_encoder_decoder_layer(model.config_json, a, attention, residual or a)


def activations_basis(model, a: int, attention: str = "sdpa", residual: int | None = None) -> str:
    """Where the layer's bytes come from: ``formula`` (closed form, checked against transformers'
    modules), ``traced`` (this architecture's modeling code, traced on fake tensors),
    ``traced_eager`` (traced; transformers has no kernel attention of the kind asked for this
    model, so it runs eager attention and keeps seq x seq scores; flash attention would not),
    ``traced_eager_only`` (the same, and the model has no flash attention either) or
    ``llama_shaped`` (neither: a Llama layer of the same shape)."""
    if model.architecture in FORMULA_LAYER_TYPES:
        return "formula"
    trace = traced_layer(model, a, attention, residual)
    if trace is None:
        return "llama_shaped"
    if trace.attention == "kernel" or attention == "eager":
        return "traced"
    return "traced_eager" if trace.flash else "traced_eager_only"


def layer_bytes_per_token(
    model, a: int, attention: str = "sdpa", residual: int | None = None
) -> int:
    """Bytes one decoder layer keeps for backward, per token (no checkpointing).

    RMSNorm (Llama: two per layer): ``x.to(float32)`` is saved by ``pow``/``mul`` (4h: an upcast
    copy, or the fp32 residual itself), the normalised ``.to(input_dtype)`` tensor by ``weight *``
    (r*h; 4h where the weight multiplies in fp32, see ``NormLayout``). The attention and MLP
    projections save their input (a*h each). Under autocast (fp32 residual) each projection
    casts that input itself: autocast caches only casts of leaf tensors that require grad, i.e.
    weights (``aten/src/ATen/autocast_mode.h:cached_cast``), so q, k and v each save their own
    copy, and so do gate and up: 3 + 2 copies instead of 1 + 1 (traced on CPU: tests/memory).
    Attention (sdpa / flash): q, k, v after RoPE (saved by the kernel), the kernel output (its
    memory is already (batch, seq, heads, dim), so ``transpose().contiguous()`` for ``o_proj``
    is a view, not a copy) and the fp32 logsumexp.
    GQA needs no ``repeat_kv`` copy because sdpa runs with ``enable_gqa`` when there is no mask.
    Qwen3, Gemma3 and OLMo2 also normalise q and k (``NORM_LAYOUTS``).
    Gated MLP: gate (saved by SiLU), SiLU out and up (both saved by ``*``), product (saved by
    down_proj): 4 tensors of the intermediate width.
    Architectures without these formulas use their traced layer (``traced_layer``).
    """
    trace = traced_layer(model, a, attention, residual)
    if trace is not None:
        return trace.per_token
    h, heads, kv, d = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim
    r = residual or a
    layout = NORM_LAYOUTS.get(model.architecture, LLAMA_NORMS)
    normalised = FP32 if layout.fp32_weight else r
    consumers = 3 + 2 if r != a else 1 + 1  # copies of the projections' inputs they save
    norms = (layout.pre + layout.post) * (FP32 + normalised) * h + consumers * a * h
    if attention == "eager":
        # matmul/softmax path: k and v are repeated to every head (saved by the two matmuls),
        # only the contiguous output copy is saved; the s*s terms are in eager_scores_bytes.
        attn = a * heads * d + 2 * a * heads * d + a * heads * d
    else:
        attn = a * (heads * d + 2 * kv * d) + a * heads * d + FP32 * heads
    if layout.qk:
        # each q / k norm saves its fp32 upcast (pow) and the normalised tensor (``weight *``);
        # its input is the projection's output (compute dtype), its output goes through RoPE
        # into the attention kernel, already counted
        attn += (FP32 + (FP32 if layout.fp32_weight else a)) * (heads + kv) * d
    return norms + attn + mlp_bytes_per_token(model, a)


def mlp_bytes_per_token(model, a: int) -> int:
    """Saved MLP tensors per token; MoE counts only the routed (active) experts."""
    if getattr(model, "num_experts", 0) and model.experts_per_token:
        k, i = model.experts_per_token, model.moe_intermediate_size or model.intermediate_size
        # router logits + softmax in fp32; per chosen expert, the token's gathered copy (saved by
        # the expert's gate/up matmul), the four gated-MLP tensors, and the expert's output,
        # saved by the multiply with its routing weight (transformers 5 MoE experts, traced)
        return FP32 * 2 * model.num_experts + k * (2 * a * model.hidden_size + 4 * a * i)
    return 4 * a * model.intermediate_size


def eager_scores_bytes(model, a: int, micro_batch: int, seq_len: int) -> int:
    """Eager attention's s*s tensors kept per layer: fp32 softmax output (saved by softmax)
    and its cast to the compute dtype (saved by the probs @ v matmul). In fp32 there is no cast:
    ``softmax(..., dtype=torch.float32).to(query.dtype)`` (transformers' models/llama/
    modeling_llama.py: ``eager_attention_forward``) returns the softmax output itself when the
    dtypes match (``Tensor.to`` aliases, aten/src/ATen/native/TensorConversions.cpp:
    ``to_will_alias``), so the matmul saves the tensor softmax already keeps."""
    cast = a if a != FP32 else 0
    return micro_batch * model.num_heads * seq_len * seq_len * (FP32 + cast)


def scores_bytes(
    model, a: int, micro_batch: int, seq_len: int, attention: str, residual: int | None = None
) -> int:
    """The seq x seq attention tensors one layer keeps: eager attention's (``eager_scores_bytes``,
    or what the traced layer keeps: Gemma2's soft-capping adds its tanh output), none for
    kernels (sdpa / flash keep only a per-token log-sum-exp)."""
    trace = traced_layer(model, a, attention, residual)
    if trace is not None:
        return (trace.scores * micro_batch + trace.shared_scores) * seq_len * seq_len
    if attention == "eager":
        return eager_scores_bytes(model, a, micro_batch, seq_len)
    return 0


def final_bytes_per_token(model, a: int, residual: int | None = None) -> int:
    """Final RMSNorm (fp32 input + normalised copy) and its output saved by lm_head."""
    layout = NORM_LAYOUTS.get(model.architecture, LLAMA_NORMS)
    normalised = FP32 if layout.fp32_weight else (residual or a)
    return (FP32 + normalised + a) * model.hidden_size


# Heads whose loss is ``torch.nn.CrossEntropyLoss`` on the logits as they come, in the compute
# dtype, with no ``.float()`` upcast (each class's forward: ``loss_fct = CrossEntropyLoss()``):
# DebertaV2ForMaskedLM (transformers/models/deberta_v2/modeling_deberta_v2.py) and
# T5ForConditionalGeneration (models/t5/modeling_t5.py), the models zerofit builds for these
# model types (models/resolve.py). Causal LMs go through ``self.loss_function``
# (transformers/loss/loss_utils.py: ForCausalLMLoss), which upcasts: GPT-2's, and BERT's and
# RoBERTa's too, which zerofit builds as BertLMHeadModel / RobertaForCausalLM (a user's
# BertForMaskedLM holds less than counted: the safe side).
LOSS_IN_COMPUTE_DTYPE = frozenset({"deberta-v2", "t5"})


def logits_peak_bytes_per_token(model, a: int) -> int:
    """Most bytes the loss path holds per scored token.

    ForCausalLMLoss upcasts logits with ``.float()`` and cross_entropy keeps the fp32
    log_softmax output. Forward holds logits (a*V) + fp32 copy + log_softmax (4V each); the
    start of backward holds the saved log_softmax, its incoming gradient and the gradient it
    produces (3 x 4V), which is the larger for every dtype. The heads of LOSS_IN_COMPUTE_DTYPE
    hold the same three in the compute dtype (3 x a V; forward's logits and log_softmax are
    2 x a V).
    """
    v = model.vocab_size
    if getattr(model, "architecture", "") in LOSS_IN_COMPUTE_DTYPE:
        return 3 * a * v
    backward = 3 * FP32 * v
    return max(logits_forward_bytes_per_token(model, a), backward)


def logits_forward_bytes_per_token(model, a: int) -> int:
    """What the loss path holds per scored token inside the forward, at ``log_softmax``: the
    logits (a V), their ``.float()`` copy (none when they are fp32 already) and the fp32
    log_softmax output (4V each); 2 x a V for LOSS_IN_COMPUTE_DTYPE (``logits_peak_bytes_per_
    token`` adds the backward's moment)."""
    v = model.vocab_size
    if getattr(model, "architecture", "") in LOSS_IN_COMPUTE_DTYPE:
        return 2 * a * v
    return a * v + (FP32 * v if a != FP32 else 0) + FP32 * v


def padded_attention_bytes(
    model,
    a: int,
    micro_batch: int,
    seq_len: int,
    attention: str,
    residual: int | None = None,
) -> int:
    """What one layer's sdpa attention saves on top when the micro batch is padded.

    A padded batch has zeros in its ``attention_mask``, so transformers builds a boolean
    ``[batch, 1, q, kv]`` mask (``masking_utils.sdpa_mask``; without zeros it skips the mask and
    sdpa runs ``is_causal``) and passes it to every layer. Two copies follow, per layer:
    - GQA: ``integrations/sdpa_attention.py:use_gqa_in_sdpa`` refuses ``enable_gqa`` when there
      is a mask (CUDA would fall back to the math kernel), so ``repeat_kv`` copies K and V to
      every head and the kernel saves the copies: 2 x (heads - kv_heads) x head_dim more per
      token than the unpadded layer;
    - torch's ``scaled_dot_product_attention`` (``aten/.../transformers/attention.cpp``:
      ``convert_boolean_attn_mask``) turns the boolean mask into an additive one in the query's
      dtype, a new tensor on every call, and the kernel keeps it for backward (the efficient and
      cuDNN kernels' ``attn_bias``, the CPU kernel's ``attn_mask``: torch's generated
      ``autograd/generated/Functions.h``, ``ScaledDotProduct*Backward0``); the efficient kernel
      first pads its last dimension to ``SDPA_MASK_ALIGNMENT`` (``preprocess_mask``).
      (transformers before 4.53 built one float mask in the model's dtype instead, which sdpa
      passes through without converting it.)
    Flash attention unpads instead (its varlen copies replace the padded q, k, v) and eager
    attention repeats K/V and adds one shared mask either way: neither saves more per layer.
    """
    if attention != "sdpa":
        return 0
    trace = traced_layer(model, a, attention, residual)
    if trace is not None and trace.attention == "eager":
        return 0  # transformers runs this class's eager attention (activations_basis)
    repeated = 2 * (model.num_heads - model.num_kv_heads) * model.head_dim * a
    kv_aligned = math.ceil(seq_len / SDPA_MASK_ALIGNMENT) * SDPA_MASK_ALIGNMENT
    mask = seq_len * kv_aligned * a
    return micro_batch * (seq_len * repeated + mask)


def padding_note(added_gib: float | None = None) -> str:
    """The note ``estimate`` and ``plan`` print for padded micro batches: what padding adds to
    the peak where it is known, and the flag for batches that are not padded."""
    what = (
        f"add {added_gib:.2f} GiB"
        if added_gib is not None
        else "are assumed, as the collators pad them"
    )
    return (
        f"note: padded micro batches {what} (sdpa keeps a mask copy and K/V repeated to every "
        "head in each layer); pass --no-padding if your batches are packed, padding-free or of "
        "equal length"
    )


def padding_mask_bytes(micro_batch: int, seq_len: int, attention: str) -> int:
    """transformers' boolean ``[batch, 1, q, kv]`` sdpa mask of a padded batch (1 byte an entry;
    flash attention takes the 2-D mask and builds none). Under checkpointing each layer's
    recompute closure holds it (``GradientCheckpointingLayer`` passes it as a keyword), so it
    lives until backward has passed the first layer."""
    return micro_batch * seq_len * seq_len if attention == "sdpa" else 0


def one_layer_bytes(
    model,
    a: int,
    micro_batch: int,
    seq_len: int,
    attention: str,
    residual: int | None = None,
    padded: bool = False,
) -> int:
    """Everything one decoder layer keeps for ``micro_batch`` sequences of ``seq_len`` tokens:
    per-token tensors plus the seq x seq scores where the attention keeps them, plus the mask
    copy and repeated K/V of a padded batch (``padded_attention_bytes``)."""
    per_token = layer_bytes_per_token(model, a, attention, residual) * micro_batch * seq_len
    one = per_token + scores_bytes(model, a, micro_batch, seq_len, attention, residual)
    if padded:
        one += padded_attention_bytes(model, a, micro_batch, seq_len, attention, residual)
    return one


@dataclass(frozen=True)
class LayerBatch:
    """What every decoder layer of a step runs on: ``micro_batch`` sequences of ``seq_len``
    tokens, through ``attention`` (an ``attn_implementation``), with the residual stream in
    ``residual`` bytes per element (None: the compute dtype's) and, if ``padded``, a padded
    batch's mask. ``target_len``: an encoder-decoder's target tokens per sequence (its decoder
    blocks, final norm and LM head run on them; ``seq_len`` is the encoder's); None: as many as
    ``seq_len``, counted as an equal-length layer."""

    micro_batch: int
    seq_len: int
    attention: str
    residual: int | None = None
    padded: bool = False
    target_len: int | None = None

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def target_tokens(self) -> int:
        """The tokens the final norm and the LM head see: the targets of an encoder-decoder."""
        return self.micro_batch * (self.target_len or self.seq_len)


def layer_batch_bytes(model, a: int, batch: LayerBatch) -> int:
    """``one_layer_bytes`` of ``batch``; with a ``target_len``, an encoder-decoder's layer traced
    with its source and target lengths apart (``traced_encoder_decoder_layer``: the encoder
    block over ``seq_len``, the decoder block over ``target_len``, cross-attention over both),
    plus a padded batch's sdpa extras at ``seq_len`` (the encoder's, the longer side)."""
    split = None
    if batch.target_len is not None:
        split = traced_encoder_decoder_layer(model, a, batch.attention, batch.residual)
    if split is None:
        return one_layer_bytes(
            model,
            a,
            batch.micro_batch,
            batch.seq_len,
            batch.attention,
            batch.residual,
            batch.padded,
        )
    one = split.layer_bytes(batch.micro_batch, batch.seq_len, batch.target_len)
    if batch.padded:
        one += padded_attention_bytes(
            model, a, batch.micro_batch, batch.seq_len, batch.attention, batch.residual
        )
    return one


def _one_layer_of(model, a: int, batch: LayerBatch) -> int:
    return layer_batch_bytes(model, a, batch)


def stored_activation_bytes(model, a: int, batch: LayerBatch, checkpointing: bool) -> int:
    """Bytes autograd holds at the end of the forward, excluding the logits/loss path."""
    layers = model.num_layers
    final = final_bytes_per_token(model, a, batch.residual) * batch.target_tokens
    if checkpointing:
        # non-reentrant checkpointing keeps only each layer's input hidden states (and the
        # padded batch's boolean mask, held by every layer's recompute closure); an
        # encoder-decoder with its own target length: the encoder block's input over the source
        # and the decoder block's over the targets (T5Block is a GradientCheckpointingLayer)
        held_tokens = batch.tokens
        if batch.target_len is not None:
            held_tokens += batch.target_tokens
        per_layer = (batch.residual or a) * model.hidden_size * held_tokens
        mask = 0
        if batch.padded:
            mask = padding_mask_bytes(batch.micro_batch, batch.seq_len, batch.attention)
        return layers * per_layer + final + mask
    return layers * _one_layer_of(model, a, batch) + final


def recompute_bytes(model, a: int, batch: LayerBatch) -> int:
    """One layer recomputed in backward under checkpointing, plus its gradient temporaries
    (grad of the hidden states in and out, and the widest MLP gradient)."""
    temporaries = batch_backward_temporaries_bytes(model, a, batch)
    return _one_layer_of(model, a, batch) + temporaries


def batch_backward_temporaries_bytes(model, a: int, batch: LayerBatch) -> int:
    """``backward_temporaries_bytes`` of ``batch``. An encoder-decoder with its own target
    length runs its decoder blocks' backward first, over the targets, while the gradient of the
    encoder's output (one source-long tensor in the compute dtype, the cross-attention's k and v
    input: ``T5Attention.forward`` with ``key_value_states``) sums what every decoder block
    sends it."""
    if batch.target_len is None:
        return backward_temporaries_bytes(model, a, batch.tokens, batch.residual)
    decoder = backward_temporaries_bytes(model, a, batch.target_tokens, batch.residual)
    return decoder + a * model.hidden_size * batch.tokens


def backward_temporaries_bytes(model, a: int, tokens: int, residual: int | None = None) -> int:
    """Gradients in flight inside one layer's backward: hidden in/out (in the residual stream's
    dtype) plus two of intermediate width."""
    h, i = model.hidden_size, model.intermediate_size
    return (2 * (residual or a) * h + 2 * a * i) * tokens
