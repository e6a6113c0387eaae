"""Loss-path terms vs the real code on CPU (MemTracker): transformers' ForCausalLMLoss with its fp32
upcast, and TRL's DPO forward over chosen + rejected concatenated.

Run: .venv/bin/python -m pytest tests/memory/test_losses.py -q   (~10 s, mostly imports)
"""

from __future__ import annotations

import pytest
from memory_probe import saved_tensor_bytes, tracked_peak
from memory_shapes import QWEN25_7B, TINY_DECODER, ModelSpec

from zerofit.memory import activations as act
from zerofit.memory import losses

H, V = 64, 16_000


def _spec(h=H, v=V, tied=False) -> ModelSpec:
    return ModelSpec(
        name="probe",
        architecture="Qwen2ForCausalLM",
        hidden_size=h,
        intermediate_size=352,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        vocab_size=v,
        tie_embeddings=tied,
        params=0,
        active_params=0,
    )


def test_hf_causal_lm_loss_path_matches_transformers():
    """bf16 logits -> ForCausalLMLoss (.float(), cross_entropy) -> backward: the peak above the
    inputs is the fp32 log_softmax, its grad and the grad it produces, 12 B x V per token."""
    torch = pytest.importorskip("torch")
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(0)
    batch, seq = 2, 256
    weight = torch.randn(V, H, dtype=torch.bfloat16)
    hidden = torch.randn(batch, seq, H, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (batch, seq))

    def step():
        logits = hidden @ weight.t()
        loss = ForCausalLMLoss(logits, labels, V)
        del logits  # the Trainer keeps only the loss (compute_loss drops the outputs)
        loss.backward()

    peak, _, _ = tracked_peak(step, hidden)
    measured = peak - hidden.nbytes - weight.nbytes
    predicted = losses.train_loss_bytes("hf", _spec(), 2, batch * seq)
    print(f"hf loss path: measured {measured:,} predicted {predicted:,}")
    assert measured == pytest.approx(predicted, rel=0.03)


def _bf16_qwen2(vocab: int):
    """The tiny decoder (memory_shapes.TINY_DECODER) as a bf16 Qwen2 in training mode, untied."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        **{**TINY_DECODER, "vocab_size": vocab},
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        use_cache=False,
    )
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16).train()


def test_dpo_concatenated_forward_stores_both_halves():
    """TRL DPO runs chosen + rejected as one batch (DataCollatorForPreference pads and concatenates)
    through the model TRL patched with its fused LM head: the activations autograd keeps are
    those of 2 x micro sequences."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from trl.trainer.utils import add_fused_lm_head

    spec, model = _spec(h=128, v=8000), _bf16_qwen2(vocab=8000)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    micro, seq = 2, 256
    chosen, rejected = torch.randint(0, 8000, (micro, seq)), torch.randint(0, 8000, (micro, seq))
    ids = torch.cat([chosen, rejected])

    def step():
        out = model(input_ids=ids, labels=ids, fused_lm_head=True)
        (-out.log_probs.sum()).backward()

    _, _, by_kind = tracked_peak(step, model)
    layer_batch = act.LayerBatch(2 * micro, seq, "sdpa")
    predicted = act.stored_activation_bytes(spec, 2, layer_batch, False)
    print(f"dpo activations: measured {by_kind['ACT']:,} predicted {predicted:,}")
    assert by_kind["ACT"] == pytest.approx(predicted, rel=0.03)


def test_dpo_pairs_collated_by_trl_are_padded_and_keep_the_mask_terms():
    """Chosen and rejected of unequal lengths, collated by TRL's own DataCollatorForPreference,
    give the model a mask with zeros: every layer then keeps the mask copy and the repeated K/V
    (activations.padded_attention_bytes), which is why the planner takes DPO as padded. Counted
    with saved-tensor hooks: each storage autograd keeps for backward, weights excluded."""
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from zerofit.planning.answers import Answers
    from zerofit.planning.planner import pads_batches

    spec, model = _spec(h=128, v=8000), _bf16_qwen2(vocab=8000)
    examples = [
        {"prompt_ids": list(range(1, 65)), "chosen_ids": [5] * 192, "rejected_ids": [6] * 100},
        {"prompt_ids": list(range(1, 33)), "chosen_ids": [7] * 150, "rejected_ids": [8] * 224},
    ]
    batch = DataCollatorForPreference(pad_token_id=0)(examples)
    rows, seq = batch["input_ids"].shape
    assert (rows, seq) == (4, 256) and not bool(batch["attention_mask"].all())
    measured = saved_tensor_bytes(
        model, lambda: model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    )
    assert pads_batches(Answers(workload="dpo"), micro=2)
    padded_batch = act.LayerBatch(rows, seq, "sdpa", residual=2, padded=True)
    predicted = act.stored_activation_bytes(spec, 2, padded_batch, False)
    unpadded = act.stored_activation_bytes(spec, 2, act.LayerBatch(rows, seq, "sdpa"), False)
    print(f"dpo padded: measured {measured:,} predicted {predicted:,} (unpadded {unpadded:,})")
    assert measured == pytest.approx(predicted, rel=0.03)
    assert unpadded < measured * 0.97


def test_estimate_counts_dpo_as_twice_the_sequences():
    from zerofit.memory.estimate import TrainSetup, estimate_memory

    sft = estimate_memory(QWEN25_7B, TrainSetup(stage=3, world_size=8, micro_batch=2, seq_len=1024))
    dpo = estimate_memory(
        QWEN25_7B,
        TrainSetup(
            stage=3, world_size=8, micro_batch=1, seq_len=1024, workload="dpo", stack="accelerate"
        ),
    )
    assert dpo.phases["forward"] - dpo.breakdown.get("reference_model", 0) == pytest.approx(
        sft.phases["forward"], rel=1e-9
    )


def test_liger_never_materialises_the_logits():
    """Liger's fused linear CE keeps one [chunk, V] tile with chunk ~ BT / (V / H), so its bytes
    grow like BT x H, not BT x V: at 7B shapes and 16k tokens, over 20x less than the HF path."""
    tokens = 16_384
    hf = losses.train_loss_bytes("hf", QWEN25_7B, 2, tokens)
    liger = losses.train_loss_bytes("liger", QWEN25_7B, 2, tokens)
    assert (
        losses.liger_chunk_rows(tokens, QWEN25_7B) == 512
    )  # next_pow2(16384 / ceil(152064/3584)=43)
    assert liger * 20 < hf
    assert losses.loss_path("hf", "sft", "liger") == "liger"
    # DPO stays on full logits with Liger: TRL 1.16 refuses its FLCE, LLaMA-Factory passes no labels
    assert losses.loss_path("hf", "dpo", "liger") == "hf"
    assert losses.loss_path("accelerate", "grpo", "hf") == "hf"


def test_hf_stack_assumes_full_logits_unless_told_trl_fused():
    """The hf stack covers LLaMA-Factory's CustomDPOTrainer and TRL before 1.16, which build the
    full fp32 logits: the default must hold them; TRL 1.16's fused head, which its SFTTrainer runs
    too (sft_trainer.py: add_fused_lm_head), is an explicit choice."""
    assert losses.loss_path("hf", "dpo", "hf") == "hf"
    assert losses.loss_path("hf", "grpo", "hf") == "hf"
    assert losses.loss_path("hf", "sft", None) == "hf"
    assert losses.loss_path("hf", "dpo", "trl_fused") == "trl_fused"
    assert losses.loss_path("hf", "grpo", "trl_fused") == "trl_fused"
    assert losses.loss_path("hf", "sft", "trl_fused") == "trl_fused"


def test_trl_fused_head_counts_fp32_weight_grad():
    """ChunkedLogProbFunction.backward accumulates the LM-head grad in fp32 then casts: the term
    holds V x H x (4 + 2) bytes whatever the token count."""
    small = losses.train_loss_bytes("trl_fused", QWEN25_7B, 2, 1)
    assert small >= QWEN25_7B.vocab_size * QWEN25_7B.hidden_size * 6


def test_full_logits_dpo_reference_forward_holds_the_policy_logits():
    """LLaMA-Factory's CustomDPOTrainer (and TRL before 1.16): the policy's fp32 logits and its
    saved log_softmax stay alive while the reference's no-grad forward builds its own fp32 logits
    and log_softmax, so the loss path peaks at 16 B x V per token, in the reference forward."""
    torch = pytest.importorskip("torch")

    torch.manual_seed(0)
    micro, seq = 1, 256
    rows = 2 * micro  # chosen + rejected concatenated
    weight = torch.randn(V, H, dtype=torch.bfloat16)
    hidden = torch.randn(rows, seq, H, dtype=torch.bfloat16, requires_grad=True)
    ref_hidden = torch.randn(rows, seq, H, dtype=torch.bfloat16)
    labels = torch.randint(0, V, (rows, seq))

    def batch_logps(logits):
        # LLaMA-Factory get_batch_logps: shift, log_softmax over the vocabulary, gather
        logps = logits[:, :-1, :].log_softmax(-1)
        return torch.gather(logps, 2, labels[:, 1:].unsqueeze(2)).squeeze(2).sum(-1)

    def step():
        all_logits = (hidden @ weight.t()).to(torch.float32)  # concatenated_forward
        policy = batch_logps(all_logits)
        chosen_logits, rejected_logits = all_logits.split(micro)  # returned for the metrics
        with torch.no_grad():
            reference = batch_logps((ref_hidden @ weight.t()).to(torch.float32))
        loss = -torch.nn.functional.logsigmoid(policy - reference).mean()
        del all_logits, chosen_logits, rejected_logits  # get_batch_loss_metrics returns
        loss.backward()

    peak, _, _ = tracked_peak(step, hidden, weight, ref_hidden, labels)
    measured = peak - hidden.nbytes - weight.nbytes - ref_hidden.nbytes - labels.nbytes
    tokens = rows * seq
    predicted = losses.policy_held_bytes("hf", _spec(), 2, tokens) + losses.reference_loss_bytes(
        "hf", _spec(), 2, tokens
    )
    print(f"full-logits dpo reference phase: measured {measured:,} predicted {predicted:,}")
    assert measured == pytest.approx(predicted, rel=0.03)
    # and it is the larger of the loss path's two moments: backward alone holds 12 B x V per token
    assert predicted > losses.train_loss_bytes("hf", _spec(), 2, tokens)


def test_dpo_reference_phase_counts_the_policy_graph():
    """In the estimate, DPO's reference phase holds the policy's stored activations and its
    loss-path tensors on top of the reference's own forward."""
    from zerofit.memory.estimate import TrainSetup, estimate_memory

    setup = TrainSetup(
        stage=3,
        world_size=8,
        micro_batch=1,
        seq_len=4096,
        workload="dpo",
        stack="hf",
        gradient_checkpointing=True,
    )
    est = estimate_memory(QWEN25_7B, setup)
    tokens = 2 * 4096
    assert est.phase == "reference"
    assert est.breakdown["policy_logits"] == losses.policy_held_bytes("hf", QWEN25_7B, 2, tokens)
    assert est.breakdown["policy_activations"] == act.stored_activation_bytes(
        QWEN25_7B, 2, act.LayerBatch(2, 4096, "sdpa"), True
    )


def test_grpo_scores_completions_except_on_deepspeeds_own_loop():
    """TRL (logits_to_keep) and our recipe (slice before the fp32 cast) score the completions;
    OpenRLHF / DeepSpeed-Chat cast every position's logits and slice afterwards."""
    assert losses.scored_tokens("hf", "grpo", 4096, 1024) == 1024
    assert losses.scored_tokens("accelerate", "grpo", 4096, 1024) == 1024
    assert losses.scored_tokens("deepspeed", "grpo", 4096, 1024) == 4096
    assert losses.scored_tokens("hf", "dpo", 4096, 0) == 4096
    from zerofit.memory.estimate import TrainSetup, estimate_memory

    def peak(stack):
        return estimate_memory(
            QWEN25_7B,
            TrainSetup(
                stage=3,
                world_size=8,
                workload="grpo",
                seq_len=2048,
                completion_len=512,
                micro_batch=4,
                stack=stack,
                loss_kernel="hf",  # the same loss path on both stacks: only the tokens differ
                gradient_checkpointing=True,
            ),
        ).phases["forward"]

    extra = peak("deepspeed") - peak("hf")
    whole, completions = 4 * 2048, 4 * 512
    assert extra == losses.train_loss_bytes("hf", QWEN25_7B, 2, whole) - losses.train_loss_bytes(
        "hf", QWEN25_7B, 2, completions
    )


def test_grpo_on_the_hf_stack_defaults_to_trls_row_wise_log_softmax():
    """TRL's GRPOTrainer (0.14-1.15) keeps bf16 logits and a bf16 log_softmax per row: no fp32
    copy, 3 x 2 B x V per scored token at most; full logits stay the default of SFT and DPO."""
    assert losses.loss_path("hf", "grpo", None) == "trl_logps"
    assert losses.loss_path("accelerate", "grpo", None) == "hf"
    assert losses.loss_path("hf", "dpo", None) == "hf"
    assert losses.loss_path("hf", "sft", "trl_logps") == "hf"  # TRL's path scores DPO/GRPO only
    tokens = 1024
    v = QWEN25_7B.vocab_size
    assert losses.train_loss_bytes("trl_logps", QWEN25_7B, 2, tokens) == 3 * 2 * v * tokens
    assert losses.train_loss_bytes("trl_logps", QWEN25_7B, 2, tokens) < losses.train_loss_bytes(
        "hf", QWEN25_7B, 2, tokens
    )


def test_trl_row_wise_log_softmax_matches_trl():
    """TRL's GRPO scoring before its fused head, on CPU (no triton, so the code path of TRL
    0.15-1.15): bf16 logits of the completions (logits_to_keep + 1, last dropped), divided by the
    temperature, trl.trainer.utils.selective_log_softmax row by row, backward: 3 x 2 B x V."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from trl.trainer.utils import selective_log_softmax

    torch.manual_seed(0)
    batch, completion = 4, 256
    weight = torch.randn(V, H, dtype=torch.bfloat16)
    hidden = torch.randn(batch, completion + 1, H, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, V, (batch, completion))

    def step():
        logits = (hidden @ weight.t())[:, :-1, :]
        logps = selective_log_softmax(logits, ids, temperature=0.7)
        del logits
        (-logps.mean()).backward()

    peak, _, _ = tracked_peak(step, hidden)
    measured = peak - hidden.nbytes - weight.nbytes
    predicted = losses.train_loss_bytes("trl_logps", _spec(), 2, batch * completion)
    print(f"trl_logps: measured {measured:,} predicted {predicted:,}")
    assert measured == pytest.approx(predicted, rel=0.03)
