"""Whole training steps of the clients users run, measured on CPU against the estimate.

The HF Trainer of the pinned transformers runs ``train()`` itself (its default fused AdamW, its
autocast, its gradient clipping) on batches padded by a collator, as every SFT run without packing
gets them; TRL 1.16's SFTTrainer, DPOTrainer and GRPOTrainer run theirs with their own defaults.
Bytes are counted by the probe's ``StorageTracker`` (tests/scripts/zero_phase_probe.py:
every storage an aten op creates, rounded to the CUDA allocator's 512 B blocks); the peak of two
steps (the second has Adam's states) is what ``torch.cuda.max_memory_allocated()`` would report.

Run: .venv/bin/python -m pytest tests/memory/test_real_clients.py -q -s   (~70 s)
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from memory_probe import fp32_kernels_for_emulated_bf16

from zerofit.memory.estimate import TrainSetup, estimate_memory

PROBE = Path(__file__).resolve().parents[1] / "scripts" / "zero_phase_probe.py"
# an activation-bound Qwen2 shape (the backward sets the peak), GQA 4 heads / 2 KV heads
SHAPE = dict(
    hidden_size=256,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=500,
    tie_word_embeddings=False,
)
MICRO, SEQ = 4, 512
# sequence lengths of the examples: every micro batch holds one full-length row and three shorter
LENGTHS = [SEQ, SEQ - 100, SEQ - 37, SEQ - 256] * 2


def _storage_tracker():
    spec = importlib.util.spec_from_file_location("zero_phase_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.StorageTracker()


def _two_quiet_cpu_steps(output_dir: Path, micro: int) -> dict:
    """Training arguments for two steps on the CPU that write, log and report nothing."""
    return dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=micro,
        max_steps=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )


def _pad(rows: list[dict]) -> dict:
    """What DataCollatorForSeq2Seq does: right-pad to the longest row, labels with -100."""
    import torch

    longest = max(len(row["input_ids"]) for row in rows)
    ids = torch.zeros((len(rows), longest), dtype=torch.long)
    labels = torch.full((len(rows), longest), -100)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        labels[i, :n] = ids[i, :n]
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _tiny_model_dir(tmp_path: Path) -> Path:
    """A local directory with the probe's Qwen2 (fp32 weights) and a word-level tokenizer, what
    TRL's trainers load by path (``create_model_from_path``)."""
    import torch
    from conftest import write_tiny_model_dir
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = write_tiny_model_dir(tmp_path / "model", vocab_size=SHAPE["vocab_size"])
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **SHAPE)
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    return model_dir


def _measured_peak(trainer, *models) -> int:
    """Peak bytes of ``trainer.train()``, the models' weights (made before) counted once."""
    tracker = _storage_tracker()
    for model in models:
        tracker.track_existing(model.parameters())
    with fp32_kernels_for_emulated_bf16(), tracker:
        trainer.train()
    return tracker.peak


def _trl_defaults(workload: str, micro: int, seq: int, **more) -> TrainSetup:
    """zerofit's answers for a TRL 1.16 trainer with its own defaults on one device: the model
    loaded by path in fp32, bf16 autocast, gradient checkpointing, the fused LM head, and the
    planner's padding rule for the workload."""
    from zerofit.planning.answers import Answers
    from zerofit.planning.planner import pads_batches

    return TrainSetup(
        stage=0,
        stack="hf",
        workload=workload,
        weights_dtype="fp32",
        micro_batch=micro,
        seq_len=seq,
        gradient_checkpointing=True,
        loss_kernel="trl_fused",
        padded=pads_batches(Answers(workload=workload), micro),
        **more,
    )


def _trl_trainer(trainer_cls, model_dir: Path, args, rows: list[dict], **more):
    """A TRL trainer as its docs build one: the model by path (TRL loads it itself), the rows as a
    ``datasets.Dataset`` and the directory's own tokenizer; ``more`` adds what a trainer needs
    besides (GRPO's ``reward_funcs``)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    return trainer_cls(
        model=str(model_dir),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        **more,
    )


def _words(n: int, start: int) -> str:
    """``n`` numbers below 400 as text, for the tiny word-level tokenizer."""
    return " ".join(str((start + i) % 400) for i in range(n))


def _probe_spec():
    from zerofit.models.resolve import spec_from_config

    return spec_from_config({**SHAPE, "model_type": "qwen2"}, "probe")


@pytest.mark.parametrize(
    "weights, checkpointing", [("fp32", False), ("bf16", False), ("fp32", True)]
)
def test_hf_trainer_on_padded_batches_matches_the_estimate(weights, checkpointing, tmp_path):
    """``Trainer.train()`` for two steps, weights loaded in fp32 (bf16 autocast) or bf16: the
    estimate of the hf stack with the planner's padding rule (sft, micro 4: padded) is within
    3 % of the measured peak, and without the padding terms it is short of it."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    from zerofit.planning.answers import Answers
    from zerofit.planning.planner import pads_batches

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **SHAPE)
    model = AutoModelForCausalLM.from_config(config)
    if weights == "bf16":
        model = model.to(torch.bfloat16)
    examples = [{"input_ids": torch.randint(1, 500, (n,)).tolist()} for n in LENGTHS]
    args = TrainingArguments(
        **_two_quiet_cpu_steps(tmp_path, MICRO),
        bf16=True,
        gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=_pad)
    tracker = _storage_tracker()
    tracker.track_existing(model.parameters())
    with fp32_kernels_for_emulated_bf16(), tracker:
        trainer.train()
    measured = tracker.peak

    padded = pads_batches(Answers(workload="sft"), MICRO)
    setup = TrainSetup(
        stage=0,
        stack="hf",
        weights_dtype=weights,
        micro_batch=MICRO,
        seq_len=SEQ,
        gradient_checkpointing=checkpointing,
        padded=padded,
    )
    spec = _probe_spec()
    est = estimate_memory(spec, setup)
    unpadded = estimate_memory(spec, dataclasses.replace(setup, padded=False))
    print(
        f"Trainer {weights} ckpt={checkpointing}: measured {measured:,} predicted "
        f"{est.peak_bytes:,} ({est.phase}, {est.optimizer}); unpadded {unpadded.peak_bytes:,}"
    )
    assert padded and est.optimizer == "adamw_torch_fused"
    assert est.peak_bytes == pytest.approx(measured, rel=0.03)
    assert unpadded.peak_bytes < est.peak_bytes


def test_trl_dpo_trainer_step_matches_the_estimate(tmp_path):
    """``DPOTrainer.train()`` of TRL 1.16 for two steps with its own defaults: the model and its
    reference loaded from a directory in fp32 (``create_model_from_path``), bf16 autocast,
    gradient checkpointing on (``DPOConfig``), pairs padded by ``DataCollatorForPreference``,
    the fused LM head (``loss_kernel trl_fused``). The estimate is within 3 % of the measured
    peak. What is left is the CPU fallback of TRL's Triton kernel: three fp32 ``[N, V]`` tiles of
    torch ops that the kernel keeps in registers on a GPU. Without Triton the head also scores
    every position (trl/trainer/utils.py ``add_fused_lm_head``: ``compact`` only on Triton
    devices), as the estimate counts DPO's tokens; on a GPU it scores the completions only."""
    pytest.importorskip("trl")
    from trl import DPOConfig, DPOTrainer

    seq, micro = 256, 2
    model_dir = _tiny_model_dir(tmp_path)

    rows = []
    for k in range(4 * micro):
        prompt = 64 if k % 2 == 0 else 40
        chosen = seq - prompt if k % 4 == 0 else 120  # one full-length row per batch
        rows.append(
            {
                "prompt": _words(prompt, k),
                "chosen": " " + _words(chosen, k + 1),
                "rejected": " " + _words(90 + k, k + 2),
            }
        )
    # TRL's own defaults otherwise: bf16, gradient checkpointing, the fused LM head
    args = DPOConfig(**_two_quiet_cpu_steps(tmp_path / "out", micro), max_length=seq)
    trainer = _trl_trainer(DPOTrainer, model_dir, args, rows)
    assert args.gradient_checkpointing and args.bf16 and trainer.ref_model is not None
    measured = _measured_peak(trainer, trainer.model, trainer.ref_model)

    est = estimate_memory(_probe_spec(), _trl_defaults("dpo", micro, seq))
    print(f"DPOTrainer: measured {measured:,} predicted {est.peak_bytes:,} ({est.phase})")
    assert est.peak_bytes == pytest.approx(measured, rel=0.03)


def test_trl_sft_trainer_step_matches_the_estimate(tmp_path):
    """``SFTTrainer.train()`` of TRL 1.16 for two steps with its own defaults: the model loaded
    from a directory in fp32, bf16 autocast, gradient checkpointing on (``SFTConfig``), plain-text
    rows padded to the longest of each batch by its collator, and the loss taken from the fused LM
    head it installs (``sft_trainer.py``: ``add_fused_lm_head``, ``compute_loss``). With
    ``loss_kernel trl_fused`` the estimate is within 3 % of the measured peak once the head's CPU
    fallback is set aside (``_torch_fallback_tiles``). Every position of a plain-text row is a
    label, so the CPU's head scores the same tokens as a GPU's."""
    pytest.importorskip("trl")
    from trl import SFTConfig, SFTTrainer

    seq, micro = 512, 4
    model_dir = _tiny_model_dir(tmp_path)

    # each micro batch: one row cut at max_length, three shorter ones
    rows = [{"text": _words(seq + 64 if k % 4 == 0 else 150 + 40 * k, k)} for k in range(2 * micro)]
    args = SFTConfig(**_two_quiet_cpu_steps(tmp_path / "out", micro), max_length=seq)
    trainer = _trl_trainer(SFTTrainer, model_dir, args, rows)
    assert args.gradient_checkpointing and args.bf16 and not args.packing
    assert max(len(ids) for ids in trainer.train_dataset["input_ids"]) == seq
    measured = _measured_peak(trainer, trainer.model)

    est = estimate_memory(_probe_spec(), _trl_defaults("sft", micro, seq))
    cpu_only = _torch_fallback_tiles(micro * seq, SHAPE["vocab_size"], SHAPE["hidden_size"])
    print(
        f"SFTTrainer: measured {measured:,}, of which the CPU fallback's tiles {cpu_only:,}; "
        f"predicted {est.peak_bytes:,} ({est.phase}, loss {est.loss_path})"
    )
    assert est.loss_path == "trl_fused"
    assert est.peak_bytes == pytest.approx(measured - cpu_only, rel=0.03)


def _torch_fallback_tiles(tokens: int, vocab: int, hidden: int) -> int:
    """Bytes TRL's fused LM head holds on a device without Triton beyond its buffer and per-token
    statistics: the torch fallback (``trl/kernels/chunked_logprob.py:_forward_tile``) works on
    whole fp32 ``[N, V]`` tiles (the float copy, its exponential, the masked copy for the top-1
    test) that the Triton kernel of a GPU keeps in registers. Measured by running the head alone
    on the same shapes: its forward peak minus the buffer ``losses.trl_tile_bytes`` counts."""
    import torch
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from zerofit.memory.losses import TRL_VOCAB_CHUNK, trl_tile_bytes

    states = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    outputs = ("log_probs", "entropy", "is_top1")  # what SFTTrainer asks of the head
    tracker = _storage_tracker()
    tracker.track_existing([states, weight])
    with fp32_kernels_for_emulated_bf16(), tracker:
        ChunkedLogProbFunction.apply(
            states, weight, None, targets, 1.0, TRL_VOCAB_CHUNK, None, 1.0, outputs
        )
    return tracker.peak - trl_tile_bytes(2, tokens)


def test_trl_grpo_trainer_step_matches_the_estimate(tmp_path, monkeypatch):
    """``GRPOTrainer.train()`` of TRL 1.16 for two steps with its own defaults: the model loaded
    from a directory in fp32, bf16 autocast, gradient checkpointing on, no reference model (beta
    0), completions generated by the training model itself (no vLLM), left-padded prompts, and
    the fused LM head. Four completions of 24 tokens after a 64-token prompt, every one run to
    full length. The estimate is within 3 % of the measured peak, which sits at the end of
    backward with every gradient. Without Triton the head scores every position instead of the
    completions only (``add_fused_lm_head``: ``compact``); the estimate that scores what this CPU
    scored is within 3 % as well."""
    pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer

    from zerofit.memory import losses

    prompt, completion, micro = 64, 24, 4
    model_dir = _tiny_model_dir(tmp_path)
    # single digits are one token each: prompts of exactly 64 and 54 tokens
    rows = [
        {"prompt": " ".join(str((k + i) % 10) for i in range(prompt - 10 * (k % 2)))}
        for k in range(8)
    ]
    args = GRPOConfig(
        **_two_quiet_cpu_steps(tmp_path / "out", micro),
        num_generations=micro,
        max_completion_length=completion,
        generation_kwargs={"min_new_tokens": completion},
    )

    def reward(completions, **_):
        return [float(len(text)) for text in completions]

    trainer = _trl_trainer(GRPOTrainer, model_dir, args, rows, reward_funcs=reward)
    assert args.gradient_checkpointing and args.bf16 and trainer.ref_model is None
    measured = _measured_peak(trainer, trainer.model)

    setup = _trl_defaults(
        "grpo",
        micro,
        prompt + completion,
        completion_len=completion,
        num_generations=micro,
        steps_per_generation=1,
        reference_model=False,
    )
    est = estimate_memory(_probe_spec(), setup)
    monkeypatch.setattr(losses, "scored_tokens", lambda stack, workload, tokens, done: tokens)
    as_run_here = estimate_memory(_probe_spec(), setup)
    print(
        f"GRPOTrainer: measured {measured:,} predicted {est.peak_bytes:,} ({est.phase}); "
        f"scoring every position {as_run_here.peak_bytes:,} ({as_run_here.phase})"
    )
    assert est.loss_path == "trl_fused" and est.phase == "backward"
    assert est.peak_bytes == pytest.approx(measured, rel=0.03)
    assert as_run_here.peak_bytes == pytest.approx(measured, rel=0.03)
