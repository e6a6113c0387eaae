"""Training FLOPs of a decoder-only transformer, counted matmul by matmul from its shape.

A multiply-add is 2 FLOPs. Per token and layer the forward pass runs the attention projections
(q and o: hidden x heads*head_dim; k and v: hidden x kv_heads*head_dim), the MLP's matrices (the
active experts' under MoE), and attention's two sequence-long products (Q K^T and the weighted
sum of V), which a causal kernel computes for the lower triangle only where it skips the fully
masked blocks: flash-attention always, PyTorch's SDPA when given ``is_causal`` and no mask. SDPA
given a padded batch's mask and eager attention compute the whole square (``skips_masked_blocks``;
speed/step_time.py ``attention_skips_masked_blocks`` says which). The LM head is one hidden x
vocab matmul per token.
The backward pass costs twice the forward (the gradient with respect to each matmul's input and
to its weight, one forward's worth each); gradient checkpointing runs every layer's forward a
second time during backward (``torch.utils.checkpoint``: the checkpointed function is called again
in the backward), the LM head excluded.

Samples packed into one row (``sample_len``): where the attention kernel keeps each sample to
itself (flash-attention's varlen path, fed the samples' boundaries), the products cover the
diagonal blocks only, sum L_i^2 over the row's samples instead of seq_len^2 (see
``packed_attention_share``).

GPT-2, BERT / RoBERTa, DeBERTa-v2 and T5 are counted from their own modules instead
(``FAMILY_FORWARD_TERMS``): their matmuls differ from a Llama layer's (no gate, a head with a
transform, relative-position products, an encoder-decoder), and checked against torch's own FLOP
counter on the real modules (tests/speed/test_flops.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from zerofit.models.resolve import ModelSpec


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one optimizer step on one GPU, by phase."""

    forward: float
    backward: float
    recompute: float  # the checkpointed layers' second forward (0 without checkpointing)

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def attention_projection_params(model: ModelSpec) -> int:
    """Weights of one layer's q, k, v and o projections, from the head counts."""
    query_width = model.num_heads * model.head_dim
    key_value_width = model.num_kv_heads * model.head_dim
    return 2 * model.hidden_size * query_width + 2 * model.hidden_size * key_value_width


def mlp_params_per_token(model: ModelSpec) -> float:
    """Weights one token meets in one layer's MLP (gate/up/down; under MoE the router and the
    active experts only).

    Read from the exact active parameter count (models/resolve.py counts it from the family's
    formula or the meta-device module) less the embeddings and attention, so it follows the
    family's real MLP (gated or not, shared experts, router) without a per-family table. Norms
    and biases stay in it: under 0.1 % of a layer.
    """
    embedding = model.vocab_size * model.hidden_size
    untied_head = 0 if model.tie_embeddings else embedding
    layers_total = model.active_params - embedding - untied_head
    per_layer = layers_total / model.num_layers - attention_projection_params(model)
    if per_layer <= 0:  # a shape whose counts do not add up: fall back to a gated MLP
        return 3.0 * model.hidden_size * model.intermediate_size
    return per_layer


def packed_attention_share(seq_len: int, sample_len: int | None) -> float:
    """What share of a row's ``seq_len^2`` attention products a kernel that keeps packed samples
    apart computes, for samples of ``sample_len`` tokens on average (None: one sequence, 1).

    A row of n samples of L_i tokens (sum L_i = seq_len) runs sum L_i^2 products: the flash
    varlen kernel is given the samples' boundaries (``cu_seqlens``) and computes each sample's
    causal block alone, never the blocks across samples. With n = seq_len / E[L] samples,
    sum L_i^2 = seq_len x E[L^2] / E[L] >= seq_len x E[L]: ``sample_len / seq_len`` is exact for
    samples of one length and a lower bound otherwise (by E[L] + Var[L] / E[L]), the best the
    mean alone gives. A sample longer than the row is cut to it (the tokenizer's max_length).
    """
    if sample_len is None or sample_len >= seq_len:
        return 1.0
    return sample_len / seq_len


def forward_flops_per_sequence(
    model: ModelSpec,
    seq_len: int,
    decoder_len: int | None = None,
    sample_len: int | None = None,
    skips_masked_blocks: bool = True,
) -> dict[str, float]:
    """Forward FLOPs of one sequence of ``seq_len`` tokens, by term: the layers' matmuls, the
    attention products (causal for decoders) and the LM head. ``decoder_len``: an
    encoder-decoder's target length (T5; default ``seq_len``), ignored by other models.
    ``sample_len``: the mean length of the samples packed into the row when the attention
    kernel keeps them apart (``packed_attention_share``; None: one sequence); decoders only,
    whose products grow with seq_len^2 alone (the encoders and T5 are not packed so).
    ``skips_masked_blocks``: whether a decoder's attention kernel skips the blocks its causal
    mask hides (flash-attention; SDPA without a mask) and so computes half the square, or
    computes every block and masks afterwards (eager; SDPA given a padding mask): the whole
    square. Encoders and T5 compute the whole square either way."""
    family_terms = FAMILY_FORWARD_TERMS.get(model.architecture)
    if family_terms is not None:
        terms = family_terms(model, _config_fields(model), seq_len, decoder_len or seq_len)
        if model.architecture == "gpt2":
            terms["attention"] *= packed_attention_share(seq_len, sample_len)
            if not skips_masked_blocks:
                terms["attention"] *= 2  # _gpt2_terms counts the causal half
        return terms
    per_token_layer = 2.0 * (attention_projection_params(model) + mlp_params_per_token(model))
    query_width = model.num_heads * model.head_dim
    # Q K^T and P V: 2 FLOPs x seq x seq x width each, half of it where the kernel skips the
    # blocks the causal mask hides
    attention_per_layer = 2 * 2.0 * seq_len * seq_len * query_width
    if skips_masked_blocks:
        attention_per_layer /= 2
    attention_per_layer *= packed_attention_share(seq_len, sample_len)
    return {
        "layers": per_token_layer * seq_len * model.num_layers,
        "attention": attention_per_layer * model.num_layers,
        "lm_head": 2.0 * model.hidden_size * model.vocab_size * seq_len,
    }


def keep_lm_head_positions(terms: dict[str, float], positions: int, kept: int) -> dict[str, float]:
    """``terms`` (``forward_flops_per_sequence``) with the LM head run over ``kept`` of the
    ``positions`` it covers in each sequence, as a forward that slices the hidden states before
    the head does (transformers' ``logits_to_keep``, TRL's fused head): the head is the same
    matmul per position, so its FLOPs scale with the positions kept. ``terms`` itself when every
    position is kept."""
    if kept >= positions:
        return terms
    return {**terms, "lm_head": terms["lm_head"] * kept / positions}


def estimate_step_flops(
    model: ModelSpec,
    *,
    seq_len: int,
    sequences: int,
    gradient_checkpointing: bool = False,
    frozen_weights: bool = False,
    decoder_len: int | None = None,
    sample_len: int | None = None,
) -> StepFlops:
    """FLOPs of ``sequences`` sequences of ``seq_len`` tokens through forward and backward
    (an encoder-decoder's targets: ``decoder_len`` tokens, default ``seq_len``; packed samples
    of ``sample_len`` tokens that attend within themselves: ``forward_flops_per_sequence``).

    ``frozen_weights`` (LoRA, other adapters): the backward still computes every weight matmul's
    input gradient but not the frozen weights' gradients, so those matmuls cost one forward
    instead of two; attention's products have no weights and keep their two. The adapters' own
    matmuls are under 1 % and left out.
    """
    terms = forward_flops_per_sequence(model, seq_len, decoder_len, sample_len)
    return step_flops_from_terms(
        terms,
        sequences=sequences,
        gradient_checkpointing=gradient_checkpointing,
        frozen_weights=frozen_weights,
    )


def step_flops_from_terms(
    terms: dict[str, float],
    *,
    sequences: int,
    gradient_checkpointing: bool = False,
    frozen_weights: bool = False,
) -> StepFlops:
    """Forward, backward and recompute FLOPs of ``sequences`` sequences whose forward costs
    ``terms`` each (``forward_flops_per_sequence``): the phases ``estimate_step_flops`` adds up,
    for a caller that counted the terms under its own attention kernel."""
    forward = sum(terms.values()) * sequences
    weight_matmuls = (terms["layers"] + terms["lm_head"]) * sequences
    backward = 2.0 * forward - (weight_matmuls if frozen_weights else 0.0)
    recompute = 0.0
    if gradient_checkpointing:
        recompute = (terms["layers"] + terms["attention"]) * sequences
    return StepFlops(forward=forward, backward=backward, recompute=recompute)


def _config_fields(model: ModelSpec) -> dict:
    """The config.json fields the model was read from (empty for a shape built in code)."""
    return json.loads(model.config_json) if model.config_json else {}


def _gpt2_terms(model: ModelSpec, config: dict, seq_len: int, decoder_len: int) -> dict:
    """GPT-2 (transformers models/gpt2/modeling_gpt2.py): ``GPT2Attention`` runs c_attn, a
    Conv1D of h x 3h (one addmm for q, k and v), and c_proj (h x h); ``GPT2MLP`` c_fc (h x
    n_inner, where n_inner None means 4h: ``GPT2Block``) and c_proj back; ``GPT2LMHeadModel``'s
    lm_head (h x vocab, tied to wte). Causal attention: the half a kernel that skips the masked
    blocks computes, as for the other decoders (``forward_flops_per_sequence`` doubles it for
    one that does not). The learned position embedding is a lookup."""
    hidden, inner = model.hidden_size, model.intermediate_size
    per_token_layer = 2.0 * (4 * hidden * hidden + 2 * hidden * inner)
    return {
        "layers": per_token_layer * seq_len * model.num_layers,
        "attention": 2 * 2.0 * seq_len * seq_len * hidden / 2 * model.num_layers,
        "lm_head": 2.0 * hidden * model.vocab_size * seq_len,
    }


def _bert_terms(model: ModelSpec, config: dict, seq_len: int, decoder_len: int) -> dict:
    """BERT and RoBERTa (models/bert/modeling_bert.py, models/roberta/modeling_roberta.py):
    ``BertSelfAttention`` query/key/value (h x heads*head_dim), ``BertSelfOutput`` dense (h x
    h), ``BertIntermediate`` (h x intermediate) and ``BertOutput`` back. Attention is
    bidirectional: the whole seq x seq products, no masked half to skip. The head is the
    masked-LM head over every token (``BertForMaskedLM`` / ``RobertaForMaskedLM``):
    ``BertPredictionHeadTransform`` / ``RobertaLMHead`` dense (h x h), then the decoder (h x
    vocab); a classification head is a few columns instead."""
    hidden, inner = model.hidden_size, model.intermediate_size
    width = model.num_heads * model.head_dim
    per_token_layer = 2.0 * (3 * hidden * width + width * hidden + 2 * hidden * inner)
    return {
        "layers": per_token_layer * seq_len * model.num_layers,
        "attention": 2 * 2.0 * seq_len * seq_len * width * model.num_layers,
        "lm_head": 2.0 * (hidden * hidden + hidden * model.vocab_size) * seq_len,
    }


def _deberta_position_span(config: dict) -> int:
    """``DisentangledSelfAttention.pos_ebd_size``: the position buckets when set, else the
    relative distance (``max_relative_positions``, which defaults to the positions' count)."""
    buckets = config.get("position_buckets", -1)
    if buckets and buckets > 0:
        return buckets
    distance = config.get("max_relative_positions", -1)
    return distance if distance and distance >= 1 else config.get("max_position_embeddings", 512)


def _deberta_v2_terms(model: ModelSpec, config: dict, seq_len: int, decoder_len: int) -> dict:
    """DeBERTa-v2/v3 (models/deberta_v2/modeling_deberta_v2.py). Per layer:
    ``DisentangledSelfAttention`` query/key/value_proj (h x heads*head_dim), ``DebertaV2SelfOutput``
    (h x h) and the BERT-like MLP. With ``relative_attention`` its ``disentangled_attention_bias``
    projects the 2*span relative embeddings (``pos_ebd_size``) through query_proj and key_proj
    (both when ``share_att_key``, else pos_key_proj for c2p and pos_query_proj for p2c), once per
    forward, and multiplies them with q (c2p) and k (p2c): seq x 2*span products per head beside
    q k^T and p v. The first layer's optional ``ConvLayer`` (Conv1d, ``conv_kernel_size``), the
    embedding projection when ``embedding_size`` differs from h, and the masked-LM head
    (``LegacyDebertaV2OnlyMLMHead`` when ``legacy``: dense h x embedding_size and a decoder;
    else ``DebertaV2LMPredictionHead``: dense h x h and the tied embedding) complete it."""
    hidden, inner, layers = model.hidden_size, model.intermediate_size, model.num_layers
    width = model.num_heads * model.head_dim
    embedding = config.get("embedding_size") or hidden
    per_token_layer = 2.0 * (3 * hidden * width + hidden * hidden + 2 * hidden * inner)
    matmuls = per_token_layer * seq_len * layers
    products = 2 * 2.0 * seq_len * seq_len * width * layers
    if config.get("relative_attention", False):
        positions = 2 * _deberta_position_span(config)
        kinds = config.get("pos_att_type") or []
        if isinstance(kinds, str):  # DebertaV2Config.__post_init__ splits "p2c|c2p"
            kinds = [kind.strip() for kind in kinds.lower().split("|")]
        relative = [kind for kind in kinds if kind in ("c2p", "p2c")]
        projections = 2 if config.get("share_att_key", False) else len(relative)
        matmuls += 2.0 * positions * hidden * width * projections * layers
        products += 2.0 * seq_len * positions * width * len(relative) * layers
    if config.get("conv_kernel_size", 0) > 0:
        groups = config.get("conv_groups", 1)
        matmuls += 2.0 * hidden * hidden // groups * config["conv_kernel_size"] * seq_len
    if embedding != hidden:
        matmuls += 2.0 * embedding * hidden * seq_len
    transform = embedding if config.get("legacy", True) else hidden
    head = hidden * transform + transform * model.vocab_size
    return {"layers": matmuls, "attention": products, "lm_head": 2.0 * head * seq_len}


def _t5_terms(model: ModelSpec, config: dict, seq_len: int, decoder_len: int) -> dict:
    """T5 (models/t5/modeling_t5.py): ``seq_len`` tokens through ``num_layers`` encoder blocks,
    ``decoder_len`` through ``num_decoder_layers`` decoder blocks (default: as many). Each
    ``T5Attention`` runs q, k, v (d_model x heads*d_kv) and o back; the decoder's
    ``T5LayerCrossAttention`` takes q from its own tokens and k, v from every encoder token. The
    FF is ``T5DenseActDense`` (wi, wo: d_model x d_ff) or, for a ``gated-`` feed_forward_proj,
    ``T5DenseGatedActDense`` (wi_0, wi_1, wo). Every attention product is whole: the relative
    position bias enters sdpa as a float mask (``sdpa_attention.create_position_bias_mask``, the
    decoder's causal part included), so no kernel skips the masked half. The LM head
    (``T5ForConditionalGeneration.lm_head``, d_model x vocab) scores the decoder's tokens."""
    hidden, width = model.hidden_size, model.num_heads * model.head_dim
    encoder_layers = model.num_layers
    decoder_layers = config.get("num_decoder_layers") or encoder_layers
    gated = str(config.get("feed_forward_proj", "relu")).split("-")[0] == "gated"
    feed_forward = (3 if gated else 2) * hidden * model.intermediate_size
    attention_weights = 4 * hidden * width
    encoder = 2.0 * (attention_weights + feed_forward) * seq_len * encoder_layers
    # the cross-attention's q and o run on the decoder's tokens, its k and v on the encoder's
    cross_weights_per_pair = 2 * hidden * width  # (q, o) or (k, v)
    decoder_per_token = attention_weights + cross_weights_per_pair + feed_forward
    decoder = 2.0 * decoder_per_token * decoder_len * decoder_layers
    cross_key_value = 2.0 * cross_weights_per_pair * seq_len * decoder_layers
    products = 2 * 2.0 * width * (
        seq_len * seq_len * encoder_layers
        + (decoder_len * decoder_len + decoder_len * seq_len) * decoder_layers
    )
    return {
        "layers": encoder + decoder + cross_key_value,
        "attention": products,
        "lm_head": 2.0 * hidden * model.vocab_size * decoder_len,
    }


# model types counted from their own modules; every other one is a decoder counted above
FAMILY_FORWARD_TERMS: dict[str, Callable[[ModelSpec, dict, int, int], dict]] = {
    "gpt2": _gpt2_terms,
    "bert": _bert_terms,
    "roberta": _bert_terms,
    "deberta-v2": _deberta_v2_terms,
    "t5": _t5_terms,
}


def six_n_flops(params: int, tokens: int) -> float:
    """The usual estimate of training FLOPs, 6 x parameters x tokens (Kaplan et al. 2020)."""
    return 6.0 * params * tokens
