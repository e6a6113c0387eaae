"""Measured LoRA / QLoRA training-step memory on one GPU beside zerofit's estimate.

A random-init Qwen2 of Qwen2.5-0.5B's shape (from a transformers config, nothing downloaded) is
saved once, then loaded per case in bf16 (LoRA) or with bitsandbytes' NF4 and double
quantization, bf16 compute (QLoRA), as transformers' ``from_pretrained`` does for users. peft
adds all-linear r 16 adapters (dropout 0.05); a plain loop runs forward + loss, backward and
``torch.optim.AdamW(foreach=True)`` for three steps, with and without gradient checkpointing
(``use_reentrant=False`` plus ``enable_input_require_grads``, as peft and TRL enable it), at two
sequence lengths. The peak of steps 2-3 (``torch.cuda.max_memory_allocated`` / ``_reserved``)
is printed as one JSON line per case with zerofit's estimate (``peak_bytes``, and it plus the
allocator term for reserved). One QLoRA case pair also runs peft's
``prepare_model_for_kbit_training`` first (peft's QLoRA recipe: every non-quantized parameter
upcast to fp32). TRL 1.16's SFTTrainer does not call it for a 4-bit model
(``trl/trainer/sft_trainer.py``, ``SFTTrainer.__init__``: ``get_peft_model``,
``enable_input_require_grads`` under gradient checkpointing, the adapters cast to bf16); the
cases here keep peft's fp32 adapters.

Run on a GPU:  python benchmarks/gpu_lora_memory.py --out results.jsonl
CPU dry run:   python benchmarks/gpu_lora_memory.py --device cpu --tiny   (fp32, bitsandbytes'
               CPU 4-bit path; shows the script runs end to end, measures no peak)
Add estimates to a results file measured where zerofit was not importable:
               python benchmarks/gpu_lora_memory.py --annotate results.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import model_shapes

QWEN25_05B = dict(model_shapes.QWEN25_05B, max_position_embeddings=32768, rms_norm_eps=1e-6)
TINY = dict(
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
RANK, DROPOUT, MICRO = 16, 0.05, 2


def build_cases(tiny: bool) -> list[dict]:
    """LoRA and QLoRA x checkpointing x two lengths, and QLoRA through prepare_model_for_kbit."""
    seqs = (64, 128) if tiny else (512, 2048)
    cases = [
        {"finetuning": kind, "checkpointing": ckpt, "seq": seq, "prepare_kbit": False}
        for kind in ("lora", "qlora")
        for ckpt in (False, True)
        for seq in seqs
    ]
    return cases + [
        {"finetuning": "qlora", "checkpointing": True, "seq": seq, "prepare_kbit": True}
        for seq in seqs
    ]


def save_random_model(shape: dict, folder: Path) -> None:
    """A random-init Qwen2 of ``shape`` saved in bf16, what from_pretrained then loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)


def load_peft_model(folder: Path, case: dict, device: str):
    """The base as users load it (bf16, or NF4 with double quantization), then peft adapters."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    kwargs = {"dtype": dtype, "device_map": device}
    if case["finetuning"] == "qlora":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
        )
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs).train()
    if case["prepare_kbit"]:
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=case["checkpointing"],
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    config = LoraConfig(r=RANK, target_modules="all-linear", lora_dropout=DROPOUT)
    model = get_peft_model(model, config)
    if case["checkpointing"] and not case["prepare_kbit"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model


def measure_case(folder: Path, case: dict, shape: dict, device: str) -> dict:
    """Three steps; the allocated / reserved peak of steps 2-3 (the first creates Adam states)."""
    import torch

    model = load_peft_model(folder, case, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
    ids = torch.randint(0, shape["vocab_size"], (MICRO, case["seq"]), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    step()
    step()
    row = dict(case, micro=MICRO, rank=RANK, dropout=DROPOUT)
    row["trainable_params"] = sum(p.numel() for p in trainable)
    if device == "cuda":
        torch.cuda.synchronize()
        row["max_allocated"] = torch.cuda.max_memory_allocated()
        row["max_reserved"] = torch.cuda.max_memory_reserved()
    row["seconds_per_step"] = round((time.perf_counter() - start) / 2, 4)
    return row


def zerofit_estimate(row: dict, shape: dict, bf16: bool) -> dict:
    """zerofit's single-GPU estimate of the case: allocated peak, reserved = peak + allocator."""
    from zerofit.memory.estimate import TrainSetup, estimate_memory
    from zerofit.models.resolve import spec_from_config

    spec = spec_from_config({**shape, "model_type": "qwen2"}, "gpu-lora")
    dtype = "bf16" if bf16 else "fp32"
    setup = TrainSetup(
        stage=0,
        stack="accelerate",
        precision=dtype,
        weights_dtype=dtype,
        micro_batch=row["micro"],
        seq_len=row["seq"],
        gradient_checkpointing=row["checkpointing"],
        optimizer="adamw_torch",
        finetuning=row["finetuning"],
        lora_rank=row["rank"],
        lora_dropout=row["dropout"],
    )
    est = estimate_memory(spec, setup)
    out = {"est_allocated": est.peak_bytes, "est_reserved": est.peak_bytes + est.allocator_bytes}
    out["est_phase"] = est.phase
    if "max_allocated" in row:
        out["err_allocated"] = round(est.peak_bytes / row["max_allocated"] - 1, 4)
        out["err_reserved"] = round(out["est_reserved"] / row["max_reserved"] - 1, 4)
    return out


def with_estimate(row: dict, shape: dict, bf16: bool) -> dict:
    """The row with zerofit's estimate beside it, or the import error where zerofit is absent."""
    try:
        return {**row, **zerofit_estimate(row, shape, bf16)}
    except Exception as error:  # zerofit or deepspeed absent on the GPU machine: --annotate
        return {**row, "estimate_error": str(error)[:200]}


def annotate(path: Path) -> None:
    """Rewrite a measured results file with zerofit's estimates beside each row."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    shape = TINY if rows and rows[0].get("tiny") else QWEN25_05B
    fresh = []
    for row in rows:
        kept = {k: v for k, v in row.items() if not k.startswith(("est_", "err_", "estimate_"))}
        fresh.append(with_estimate(kept, shape, bf16=row.get("device") == "cuda"))
    path.write_text("".join(json.dumps(row) + "\n" for row in fresh))
    for row in fresh:
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (dry runs)")
    parser.add_argument("--out", type=Path, help="also write the JSON lines here")
    parser.add_argument("--annotate", type=Path, help="add estimates to a results file")
    args = parser.parse_args()
    if args.annotate:
        annotate(args.annotate)
        return
    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA GPU visible (fix: --device cpu --tiny for a dry run)")
    shape = TINY if args.tiny else QWEN25_05B
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        save_random_model(shape, folder)
        for case in build_cases(args.tiny):
            try:
                row = measure_case(folder, case, shape, args.device)
            except Exception as error:  # one failing case must not lose the others' numbers
                row = dict(case, error=f"{type(error).__name__}: {error}"[:300])
            row.update(device=args.device, gpu=device_name, tiny=args.tiny)
            if cuda:
                torch.cuda.empty_cache()  # the case's model is gone: start the next one clean
            if "error" not in row:
                row = with_estimate(row, shape, bf16=cuda)
            line = json.dumps(row)
            print(line, flush=True)
            lines.append(line)
            if args.out:
                args.out.write_text("".join(item + "\n" for item in lines))


if __name__ == "__main__":
    main()
