"""Bytes of the loss path (LM head + loss) per implementation: what sits on top of the activations
at the start of backward, and what a reference model's no-grad forward needs.

Three paths, each derived from the code that runs at the pinned versions:
- ``hf``: transformers' ``ForCausalLMLoss`` (``transformers/loss/loss_utils.py``): full-vocabulary
  logits, ``.float()`` upcast, ``cross_entropy``'s fp32 log_softmax (see
  ``activations.logits_peak_bytes_per_token``).
- ``liger``: Liger's fused linear cross-entropy (linkedin/Liger-Kernel
  ``src/liger_kernel/ops/fused_linear_cross_entropy.py:fused_linear_cross_entropy_forward``): the
  logits never exist in full; one ``[chunk, V]`` tile at a time, with ``chunk =
  next_pow2(ceil(BT / ceil(V / H)))``, and the gradients of the input and of the LM-head weight
  computed in the forward (``zeros_like`` of each, so in the compute dtype).
- ``trl_fused``: TRL 1.16's fused LM head, which ``DPOTrainer`` and ``GRPOTrainer`` install on the
  policy and the reference (``trl/trainer/utils.py:add_fused_lm_head``) and which runs
  ``trl/kernels/chunked_logprob.py:ChunkedLogProbFunction``: ``[4096, 32768]`` tiles in the
  compute dtype, per-token fp32 statistics, and in backward fp32 accumulators for the gradients
  of the scored hidden states and of the whole LM-head weight, cast to the model dtype on return.
"""

from __future__ import annotations

import math

from zerofit.memory import activations as act

FP32 = 4
LOSS_KERNELS = ("hf", "liger")
# trl/kernels/chunked_logprob.py: TOKEN_CHUNK_SIZE;
# trl/trainer/utils.py: _CHUNKED_LOGPROB_CHUNK_SIZE
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768
# ChunkedLogProbFunction.forward: sum_exp, x_sum_exp, sq_sum_exp, z_sum, target_logit, plus the
# log-prob, entropy, log_z and three metric outputs DPOTrainer asks for: 11 fp32 values per token
TRL_FP32_PER_TOKEN = 11


def loss_path(stack: str, workload: str, loss_kernel: str) -> str:
    """Which loss implementation runs: TRL's trainers (stack ``hf``) use their fused head for DPO
    and GRPO (and refuse Liger's fused linear CE there); SFT takes the loss kernel asked for."""
    if stack == "hf" and workload in ("dpo", "grpo"):
        return "trl_fused"
    return "liger" if loss_kernel == "liger" else "hf"


def liger_chunk_rows(tokens: int, model) -> int:
    """Rows of one Liger logits tile: next_pow2(ceil(BT / ceil(V / H))), at most BT."""
    inc = math.ceil(model.vocab_size / model.hidden_size)
    rows = 1 << max(0, math.ceil(tokens / inc) - 1).bit_length()
    return min(rows, tokens)


def train_loss_bytes(path: str, model, a: int, tokens: int) -> int:
    """Most bytes the loss path holds for ``tokens`` scored tokens, beyond stored activations."""
    h, v = model.hidden_size, model.vocab_size
    if path == "liger":
        chunk = liger_chunk_rows(tokens, model)
        # grad_input + grad_weight (zeros_like, compute dtype) + one logits tile + fp32 loss_1d
        return tokens * h * a + v * h * a + chunk * v * a + FP32 * tokens
    if path == "trl_fused":
        tile = min(tokens, TRL_TOKEN_CHUNK) * min(v, TRL_VOCAB_CHUNK) * a
        saved_hidden = tokens * h * a  # hidden_states[mask]: a gathered copy
        grads = tokens * h * (FP32 + a) + v * h * (FP32 + a)  # fp32 accumulators + their casts
        return saved_hidden + grads + tile + TRL_FP32_PER_TOKEN * FP32 * tokens
    return act.logits_peak_bytes_per_token(model, a) * tokens


def reference_loss_bytes(path: str, model, a: int, tokens: int) -> int:
    """The reference model's no-grad loss path: TRL's fused head keeps one tile and the per-token
    statistics; a full-logits path keeps the logits and their fp32 log_softmax."""
    if path == "trl_fused":
        tile = min(tokens, TRL_TOKEN_CHUNK) * min(model.vocab_size, TRL_VOCAB_CHUNK) * a
        return tokens * model.hidden_size * a + tile + TRL_FP32_PER_TOKEN * FP32 * tokens
    return (a + FP32) * model.vocab_size * tokens
