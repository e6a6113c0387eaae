"""Training FLOPs of a decoder-only transformer, counted matmul by matmul from its shape.

A multiply-add is 2 FLOPs. Per token and layer the forward pass runs the attention projections
(q and o: hidden x heads*head_dim; k and v: hidden x kv_heads*head_dim), the MLP's matrices (the
active experts' under MoE), and attention's two sequence-long products (Q K^T and the weighted
sum of V), which a causal kernel computes for the lower triangle only (flash-attention and
PyTorch's SDPA skip the fully masked blocks). The LM head is one hidden x vocab matmul per token.
The backward pass costs twice the forward (the gradient with respect to each matmul's input and
to its weight, one forward's worth each); gradient checkpointing runs every layer's forward a
second time during backward (``torch.utils.checkpoint``: the checkpointed function is called again
in the backward), the LM head excluded.
"""

from __future__ import annotations

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


def forward_flops_per_sequence(model: ModelSpec, seq_len: int) -> dict[str, float]:
    """Forward FLOPs of one sequence of ``seq_len`` tokens, by term: the layers' matmuls, the
    causal attention products and the LM head."""
    per_token_layer = 2.0 * (attention_projection_params(model) + mlp_params_per_token(model))
    query_width = model.num_heads * model.head_dim
    # Q K^T and P V: 2 FLOPs x seq x seq x width each, half of it under the causal mask
    attention_per_layer = 2 * 2.0 * seq_len * seq_len * query_width / 2
    return {
        "layers": per_token_layer * seq_len * model.num_layers,
        "attention": attention_per_layer * model.num_layers,
        "lm_head": 2.0 * model.hidden_size * model.vocab_size * seq_len,
    }


def estimate_step_flops(
    model: ModelSpec,
    *,
    seq_len: int,
    sequences: int,
    gradient_checkpointing: bool = False,
    frozen_weights: bool = False,
) -> StepFlops:
    """FLOPs of ``sequences`` sequences of ``seq_len`` tokens through forward and backward.

    ``frozen_weights`` (LoRA, other adapters): the backward still computes every weight matmul's
    input gradient but not the frozen weights' gradients, so those matmuls cost one forward
    instead of two; attention's products have no weights and keep their two. The adapters' own
    matmuls are under 1 % and left out.
    """
    terms = forward_flops_per_sequence(model, seq_len)
    forward = sum(terms.values()) * sequences
    weight_matmuls = (terms["layers"] + terms["lm_head"]) * sequences
    backward = 2.0 * forward - (weight_matmuls if frozen_weights else 0.0)
    recompute = 0.0
    if gradient_checkpointing:
        recompute = (terms["layers"] + terms["attention"]) * sequences
    return StepFlops(forward=forward, backward=backward, recompute=recompute)


def six_n_flops(params: int, tokens: int) -> float:
    """The usual estimate of training FLOPs, 6 x parameters x tokens (Kaplan et al. 2020)."""
    return 6.0 * params * tokens
