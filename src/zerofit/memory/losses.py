"""Bytes of the loss path (LM head + loss) per implementation: what sits on top of the activations
at the start of backward, and what a reference model's no-grad forward needs.

Four paths, each derived from the code that runs at the pinned versions (or, for
``trl_logps``, at the TRL versions that ran it):
- ``hf``: transformers' ``ForCausalLMLoss`` (``transformers/loss/loss_utils.py``): full-vocabulary
  logits, ``.float()`` upcast, ``cross_entropy``'s fp32 log_softmax (see
  ``activations.logits_peak_bytes_per_token``).
- ``liger``: Liger's fused linear cross-entropy (linkedin/Liger-Kernel
  ``src/liger_kernel/ops/fused_linear_cross_entropy.py:fused_linear_cross_entropy_forward``): the
  logits never exist in full; one ``[chunk, V]`` tile at a time, with ``chunk =
  next_pow2(ceil(BT / ceil(V / H)))``, and the gradients of the input and of the LM-head weight
  computed in the forward (``zeros_like`` of each, so in the compute dtype).
- ``trl_fused``: TRL 1.16's fused LM head, which ``SFTTrainer``, ``DPOTrainer`` and ``GRPOTrainer``
  install (``trl/trainer/utils.py:add_fused_lm_head``; ``sft_trainer.py:SFTTrainer.__init__``
  asks it for log-probs, entropy and top-1 hits, and ``compute_loss`` takes the SFT loss from its
  log-probs unless a ``compute_loss_func`` or label smoothing needs the logits) and which runs
  ``trl/kernels/chunked_logprob.py:ChunkedLogProbFunction``: one ``[4096, 32768]`` buffer in the
  compute dtype (``trl_tile_bytes``), per-token fp32 statistics, and in backward fp32
  accumulators for the gradients of the scored hidden states and of the whole LM-head weight,
  cast to the model dtype on return.

- ``trl_logps``: TRL's per-token log-probs before its fused head, what ``GRPOTrainer`` ran
  from 0.14 to 1.15 (``_get_per_token_logps``: ``model(..., logits_to_keep=C + 1).logits``, then
  ``logits / temperature`` from 0.16, then ``trl/trainer/utils.py:selective_log_softmax``, which
  for bf16/fp16 logits loops ``F.log_softmax(row_logits)`` over the batch rows in the compute
  dtype: no fp32 copy). Forward ends holding the logits and the rows' log-softmax, a + a bytes
  per vocabulary entry; the division adds one more copy for a moment, and backward stacks the
  rows' gradients (``unbind``) into one more: 3 x a at most.

Which path the ``hf`` stack assumes: GRPO on the ``hf`` stack is TRL's trainer (ms-swift and
open-r1 subclass or call it), so ``trl_logps``, the larger of TRL's two paths. For SFT and DPO:
full logits, unless the user says
``--loss-kernel trl_fused``. The ``hf`` stack is the Trainer and everything built on it, and most
of it still materialises the whole logits in fp32: the HF Trainer's own SFT loss
(``ForCausalLMLoss``), LLaMA-Factory's and ms-swift's SFT through it, TRL's SFTTrainer before
1.16, and for DPO (``[2B, T, V]``):
- LLaMA-Factory ``src/llamafactory/train/dpo/trainer.py:CustomDPOTrainer.concatenated_forward``:
  ``model(**batch).logits.to(torch.float32)``, then ``get_batch_logps`` takes
  ``logits.log_softmax(-1)`` and gathers; the fp32 logits are returned (``chosen_logits``,
  ``rejected_logits``) and held by ``get_batch_loss_metrics`` while the reference forward runs.
  Its labels are popped before the forward, so Liger's fused linear CE (which acts only when
  labels are passed) does not apply to DPO there either.
- TRL before its fused head (0.7-0.11 ``DPOTrainer.concatenated_forward`` / ``get_batch_logps``,
  what alignment-handbook and SimPO run), and axolotl's DPO through those trainers: full logits
  and ``log_softmax`` over the vocabulary.
Only TRL >= 1.16 runs the fused head, and only in its own SFT/DPO/GRPO trainers; zerofit cannot
tell which of these the user runs, and the promise is "will not OOM", so the default is the path
that holds the most and the fused one is an explicit choice.
"""

from __future__ import annotations

import math

from zerofit.memory import activations as act

FP32 = 4
LOSS_KERNELS = ("hf", "liger", "trl_fused", "trl_logps")
# trl/kernels/chunked_logprob.py: TOKEN_CHUNK_SIZE;
# trl/trainer/utils.py: _CHUNKED_LOGPROB_CHUNK_SIZE
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768
# ChunkedLogProbFunction.forward: sum_exp, x_sum_exp, sq_sum_exp, z_sum, target_logit, plus the
# log-prob, entropy, log_z and three metric outputs DPOTrainer asks for: 11 fp32 values per token
# (SFTTrainer asks for fewer outputs; a few bytes per token either way)
TRL_FP32_PER_TOKEN = 11


def loss_path(stack: str, workload: str, loss_kernel: str | None) -> str:
    """Which loss implementation runs (see the module docstring for each stack's default;
    ``loss_kernel=None`` means that default).

    ``trl_fused`` is TRL >= 1.16's SFT/DPO/GRPO head and is taken only when asked; ``trl_logps``
    is TRL's DPO/GRPO log-prob code before it, no SFT loss. Liger's fused
    linear CE replaces the loss of SFT and of TRL's GRPO (``use_liger_loss``); DPO stays on full
    logits with it: TRL 1.16 refuses ``fused_linear_cross_entropy`` in DPO
    (``DPOTrainer.__init__``) and LLaMA-Factory's DPO forward passes no labels, so Liger's patched
    forward returns the full logits.
    """
    if loss_kernel is None:
        return "trl_logps" if (stack == "hf" and workload == "grpo") else "hf"
    if loss_kernel == "trl_fused" or (loss_kernel == "trl_logps" and workload != "sft"):
        return loss_kernel
    if loss_kernel == "liger" and workload != "dpo":
        return "liger"
    return "hf"


def scored_tokens(stack: str, workload: str, tokens: int, completion_tokens: int) -> int:
    """Tokens whose vocabulary-wide logits the loss path materialises.

    SFT and DPO score every position. GRPO scores the completions only where the code slices
    before the LM head: TRL's GRPOTrainer (0.14-1.15 passed ``logits_to_keep`` = completion + 1
    to the model; 1.16 labels the completion only and its fused head projects those positions,
    ``_get_per_token_logps_and_entropies``), and our recipe (``recipes/grpo.py:token_logprobs``)
    passes ``logits_to_keep`` = completion + 1. A loop on DeepSpeed's own engine scores the whole
    sequence: OpenRLHF's
    ``openrlhf/models/actor.py:Actor.forward`` casts ``output["logits"]`` of every position to
    fp32 before ``log_probs_from_logits`` and keeps the last ``num_actions`` only afterwards, as
    DeepSpeed-Chat's ``gather_log_probs(logits[:, :-1, :], seq[:, 1:])`` does.
    """
    if workload != "grpo" or stack == "deepspeed":
        return tokens
    return completion_tokens


def liger_chunk_rows(tokens: int, model) -> int:
    """Rows of one Liger logits tile: next_pow2(ceil(BT / ceil(V / H))), at most BT."""
    inc = math.ceil(model.vocab_size / model.hidden_size)
    rows = 1 << max(0, math.ceil(tokens / inc) - 1).bit_length()
    return min(rows, tokens)


def trl_tile_bytes(a: int, tokens: int) -> int:
    """TRL's fused head's matmul buffer: ``mm_buf = torch.empty((min(N, TOKEN_CHUNK_SIZE),
    chunk_size))`` in the compute dtype (``ChunkedLogProbFunction.forward`` and ``backward``), as
    wide as the vocabulary chunk whatever the vocabulary (a 32,000-token one gets 32,768)."""
    return min(tokens, TRL_TOKEN_CHUNK) * TRL_VOCAB_CHUNK * a


def train_loss_bytes(path: str, model, a: int, tokens: int) -> int:
    """Most bytes the loss path holds for ``tokens`` scored tokens, beyond stored activations."""
    h, v = model.hidden_size, model.vocab_size
    if path == "liger":
        chunk = liger_chunk_rows(tokens, model)
        # grad_input + grad_weight (zeros_like, compute dtype) + one logits tile + fp32 loss_1d
        return tokens * h * a + v * h * a + chunk * v * a + FP32 * tokens
    if path == "trl_fused":
        tile = trl_tile_bytes(a, tokens)
        saved_hidden = tokens * h * a  # hidden_states[mask]: a gathered copy
        grads = tokens * h * (FP32 + a) + v * h * (FP32 + a)  # fp32 accumulators + their casts
        return saved_hidden + grads + tile + TRL_FP32_PER_TOKEN * FP32 * tokens
    if path == "trl_logps":
        return 3 * a * v * tokens
    return act.logits_peak_bytes_per_token(model, a) * tokens


def reference_loss_bytes(path: str, model, a: int, tokens: int) -> int:
    """The reference model's no-grad loss path.

    TRL's fused head keeps one tile and the per-token statistics. A full-logits path holds the
    compute-dtype logits while ``.to(torch.float32)`` copies them, then the fp32 logits while
    ``log_softmax`` writes its fp32 output: max(a + 4, 4 + 4) bytes per token and vocabulary entry
    (LLaMA-Factory ``concatenated_forward`` under ``torch.no_grad()``).
    """
    if path == "trl_fused":
        tile = trl_tile_bytes(a, tokens)
        return tokens * model.hidden_size * a + tile + TRL_FP32_PER_TOKEN * FP32 * tokens
    if path == "trl_logps":
        # under no_grad: the logits and their temperature-scaled copy; one row's log_softmax
        return 2 * a * model.vocab_size * tokens
    return max(a + FP32, 2 * FP32) * model.vocab_size * tokens


def policy_held_bytes(path: str, model, a: int, tokens: int) -> int:
    """What the policy's loss path still holds while DPO's reference forward runs.

    Both LLaMA-Factory (``CustomDPOTrainer.get_batch_loss_metrics``) and TRL 1.16
    (``DPOTrainer._compute_loss``) run the policy forward first and the reference forward after
    it, before backward, so the policy's graph is alive during the reference forward.
    - full logits: the fp32 logits (returned as ``chosen_logits`` / ``rejected_logits`` and kept
      for the ``logits/*`` metrics) and ``log_softmax``'s fp32 output saved for backward: 8 B x V
      per token;
    - TRL's fused head: the scored hidden states and the per-token fp32 statistics it saves
      (``ChunkedLogProbFunction.forward``: ``ctx.save_for_backward``);
    - Liger: no DPO path (see ``loss_path``); its SFT forward keeps the input and weight grads it
      computed in the forward, the same bytes as ``train_loss_bytes`` minus the tile.
    """
    if path == "trl_fused":
        return tokens * model.hidden_size * a + TRL_FP32_PER_TOKEN * FP32 * tokens
    if path == "trl_logps":
        # DPOTrainer keeps the logits for its logits/* metrics and the rows' log_softmax
        return 2 * a * model.vocab_size * tokens
    if path == "liger":
        h, v = model.hidden_size, model.vocab_size
        return tokens * h * a + v * h * a + FP32 * tokens
    return 2 * FP32 * model.vocab_size * tokens
