"""Measured LoRA / QLoRA training-step memory on one GPU beside zerofit's estimate.

A random-init Qwen2 of Qwen2.5-0.5B's shape (from a transformers config, nothing downloaded) is
saved once, then loaded per case in bf16 (LoRA) or with bitsandbytes' NF4 and double
quantization, bf16 compute (QLoRA), as transformers' ``from_pretrained`` does for users. peft
adds all-linear r 16 adapters (dropout 0.05); three steps run, with and without gradient
checkpointing (``use_reentrant=False`` plus ``enable_input_require_grads``, as peft and TRL
enable it), at two sequence lengths. The peak of steps 2-3 (``torch.cuda.max_memory_allocated``
/ ``_reserved``) is printed as one JSON line per case with zerofit's estimate for the matching
``TrainSetup`` on the row's GPU (``peak_bytes``, its ``cublas_workspace`` term included: the
cuBLAS workspaces ``max_memory_allocated`` holds beside the step's tensors; that plus the
allocator term for reserved). ``--stack`` picks the training stack (a comma list runs several):

- ``plain`` (the default; tests/data/gpu_lora_memory_h200.jsonl): a loop without autocast and
  ``torch.optim.AdamW(foreach=True)``, peft's fp32 adapters kept; one QLoRA case pair also runs
  peft's ``prepare_model_for_kbit_training`` first (every non-quantized parameter upcast to
  fp32). Against zerofit's stage-0 ``accelerate`` estimate without autocast.
- ``autocast``: what the HF Trainer / TRL run on one GPU: forward and loss under bf16
  ``torch.autocast`` (accelerate's ``mixed_precision="bf16"``), ``clip_grad_norm_`` and the
  Trainer's default ``torch.optim.AdamW(fused=True)`` (``adamw_torch_fused``). LoRA keeps peft's
  fp32 adapters (``get_peft_model(autocast_adapter_dtype=True)``); QLoRA's are cast back to bf16
  as TRL 1.16's ``SFTTrainer.__init__`` does for a quantized model (recipes/lora.py
  ``cast_adapters_to_16_bit``). Against zerofit's stage-0 ``hf`` estimate.
- ``deepspeed``: a DeepSpeed engine on one rank (``deepspeed.initialize`` with the trainable
  parameters, ``engine.backward`` / ``engine.step``) under ZeRO-2 and ZeRO-3, with the JSON
  zerofit writes in its explicit flavour (bf16, gradient clipping 1.0, ``overlap_comm``,
  ``contiguous_gradients``, zerofit's bucket sizes, an AdamW block with ``torch_adam``: torch's
  foreach AdamW, so no op compiles). DeepSpeed casts the module, adapters included, to bf16
  (``engine.py:_cast_module_mixed_precision``). QLoRA stores its 4-bit weights in bf16
  (``bnb_4bit_quant_storage``), which ZeRO-3 needs to shard them. The model is loaded whole and
  ``deepspeed.initialize`` converts it to ZeRO-3 parameters (``parameter_offload.py:
  _convert_to_zero_parameters``); transformers does the same for a quantized model (its
  ``zero.Init`` path skips quantized ones). With one rank a partition is the whole tensor: the
  terms and buffers are what is tested, not the division by the world size. Against zerofit's
  stage-2/3 ``deepspeed`` estimate with ``optimizer="adamw_torch"``.

Run on a GPU:  python benchmarks/gpu_lora_memory.py --stack deepspeed,autocast --out results.jsonl
CPU dry run:   python benchmarks/gpu_lora_memory.py --device cpu --tiny [--stack ...]
               (bitsandbytes' CPU 4-bit path, DeepSpeed over gloo; shows the script runs end to
               end, measures no peak; the plain stack runs in fp32 there, the others in bf16)
Add estimates to a results file measured where zerofit was not importable:
               python benchmarks/gpu_lora_memory.py --annotate results.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import model_shapes

QWEN25_05B = dict(model_shapes.QWEN25_05B, max_position_embeddings=32768, rms_norm_eps=1e-6)
TINY = model_shapes.TINY
RANK, DROPOUT, MICRO = 16, 0.05, 2
STACKS = ("plain", "autocast", "deepspeed")
# DeepSpeed's own bucket defaults (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig), what
# zerofit's ds_bucket_sizes starts from; written out so the script runs without zerofit
DS_DEFAULT_BUCKET = 500_000_000
DS_DEFAULT_STAGE3_LIVE = 1_000_000_000


def build_cases(tiny: bool, stack: str = "plain", stages: tuple[int, ...] = (2, 3)) -> list[dict]:
    """The cases of ``stack``: LoRA and QLoRA x checkpointing x two lengths (x ZeRO stage for
    deepspeed, LoRA first); plain adds QLoRA through prepare_model_for_kbit_training."""
    seqs = (64, 128) if tiny else (512, 2048)
    if stack == "deepspeed":
        return [
            {"stack": stack, "stage": stage, "finetuning": kind, "checkpointing": ckpt, "seq": seq}
            for kind in ("lora", "qlora")
            for stage in stages
            for ckpt in (True, False)
            for seq in seqs
        ]
    if stack == "autocast":
        return [
            {"stack": stack, "stage": 0, "finetuning": kind, "checkpointing": ckpt, "seq": seq}
            for kind in ("lora", "qlora")
            for ckpt in (True, False)
            for seq in seqs
        ]
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


def bucket_sizes(hidden_size: int, stage: int) -> dict[str, int]:
    """The ``zero_optimization`` bucket keys zerofit writes at ``stage`` (memory/ds_defaults.py
    ``ds_bucket_sizes``: DeepSpeed's defaults at stage 1/2, HF's "auto" values at stage 3)."""
    if stage in (1, 2):
        return {"reduce_bucket_size": DS_DEFAULT_BUCKET, "allgather_bucket_size": DS_DEFAULT_BUCKET}
    hidden_squared = hidden_size * hidden_size
    return {
        "reduce_bucket_size": hidden_squared,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_squared),
        "stage3_param_persistence_threshold": 10 * hidden_size,
        "stage3_max_live_parameters": DS_DEFAULT_STAGE3_LIVE,
        "stage3_max_reuse_distance": DS_DEFAULT_STAGE3_LIVE,
    }


def deepspeed_config(stage: int, hidden_size: int) -> dict:
    """zerofit's explicit-flavour DeepSpeed JSON for one rank (configs/deepspeed_json.py
    ``build_zero_config`` with ``--optimizer-block``), bf16."""
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    zero.update(bucket_sizes(hidden_size, stage))
    return {
        "train_batch_size": MICRO,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": 1e-5,
                "betas": [0.9, 0.999],
                "eps": 1e-8,
                "weight_decay": 0.01,
                "torch_adam": True,
            },
        },
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
    }


def init_single_rank(device: str) -> None:
    """torch.distributed for one process (DeepSpeed needs a process group): nccl on the GPU,
    gloo on the CPU."""
    import deepspeed

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517"), ("RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")


def save_random_model(shape: dict, folder: Path) -> None:
    """A random-init Qwen2 of ``shape`` saved in bf16, what from_pretrained then loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)


def compute_dtype(case: dict, device: str):
    """bf16 on the GPU; on the CPU the plain stack runs in fp32 (its dry run), the others bf16."""
    import torch

    if device == "cuda" or case.get("stack", "plain") != "plain":
        return torch.bfloat16
    return torch.float32


def load_peft_model(folder: Path, case: dict, device: str):
    """The base as users load it (bf16, or NF4 with double quantization), then peft adapters."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    dtype = compute_dtype(case, device)
    kwargs = {"dtype": dtype, "device_map": device}
    if case["finetuning"] == "qlora":
        storage = {"bnb_4bit_quant_storage": dtype} if case.get("stack") == "deepspeed" else {}
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
            **storage,
        )
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs).train()
    prepare_kbit = case.get("prepare_kbit", False)
    if prepare_kbit:
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=case["checkpointing"],
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    config = LoraConfig(r=RANK, target_modules="all-linear", lora_dropout=DROPOUT)
    model = get_peft_model(model, config)
    if case["checkpointing"] and not prepare_kbit:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if case.get("stack") == "autocast" and case["finetuning"] == "qlora":
        # TRL 1.16 SFTTrainer.__init__: a quantized model's adapters back to bf16
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    return model


def build_step(model, case: dict, shape: dict, device: str):
    """One training step of ``case``'s stack as a function, its trainable count and what must
    be released after the case (the DeepSpeed engine)."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in trainable)
    ids = torch.randint(0, shape["vocab_size"], (MICRO, case["seq"]), device=device)
    stack = case.get("stack", "plain")
    if stack == "deepspeed":
        import deepspeed

        config = deepspeed_config(case["stage"], shape["hidden_size"])
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=trainable, config=config
        )

        def deepspeed_step() -> None:
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()

        return deepspeed_step, count, engine
    if stack == "autocast":
        optimizer = torch.optim.AdamW(trainable, lr=1e-5, fused=True)

        def autocast_step() -> None:
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return autocast_step, count, None
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)

    def plain_step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return plain_step, count, None


def measure_case(folder: Path, case: dict, shape: dict, device: str) -> dict:
    """Three steps; the allocated / reserved peak of steps 2-3 (the first creates Adam states).
    ``start_allocated`` is what earlier cases left allocated (0 when they released everything)."""
    import torch

    cuda = device == "cuda"
    start = {}
    if cuda:
        start = {
            "start_allocated": torch.cuda.memory_allocated(),
            "start_reserved": torch.cuda.memory_reserved(),
        }
    model = load_peft_model(folder, case, device)
    step, trainable, engine = build_step(model, case, shape, device)
    step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    step()
    step()
    row = dict(case, micro=MICRO, rank=RANK, dropout=DROPOUT, trainable_params=trainable)
    if cuda:
        torch.cuda.synchronize()
        row["max_allocated"] = torch.cuda.max_memory_allocated()
        row["max_reserved"] = torch.cuda.max_memory_reserved()
        row.update(start)
    row["seconds_per_step"] = round((time.perf_counter() - began) / 2, 4)
    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()  # removes ZeRO's hooks, which hold the module
    return row


def estimate_setup(row: dict, bf16: bool):
    """zerofit's ``TrainSetup`` of a measured row (its stack, stage, case and GPU)."""
    from zerofit.memory.estimate import TrainSetup

    common = dict(
        micro_batch=row["micro"],
        seq_len=row["seq"],
        gradient_checkpointing=row["checkpointing"],
        finetuning=row["finetuning"],
        lora_rank=row["rank"],
        lora_dropout=row["dropout"],
        gpu=catalog_gpu(row),
    )
    stack = row.get("stack", "plain")
    if stack == "deepspeed":
        return TrainSetup(
            stage=row["stage"],
            stack="deepspeed",
            precision="bf16",
            optimizer="adamw_torch",  # torch_adam: torch.optim.AdamW, foreach on CUDA
            ds_optimizer_block=True,
            buckets=row.get("buckets"),
            quant_storage="compute",
            **common,
        )
    if stack == "autocast":
        return TrainSetup(
            stage=0,
            stack="hf",
            precision="bf16",
            weights_dtype="bf16",
            optimizer="adamw_torch_fused",
            **common,
        )
    dtype = "bf16" if bf16 else "fp32"
    return TrainSetup(
        stage=0,
        stack="accelerate",
        precision=dtype,
        weights_dtype=dtype,
        autocast=False,  # the plain loop: peft's fp32 adapters compute in fp32
        optimizer="adamw_torch",
        **common,
    )


def catalog_gpu(row: dict) -> str | None:
    """The catalog key of the GPU a row ran on (its CUDA architecture sizes the cuBLAS
    workspaces the estimate counts); None for a CPU row, which has no cuBLAS."""
    from zerofit.hardware import match_gpu_name

    if row.get("device") != "cuda":
        return None
    return match_gpu_name(row.get("gpu") or "")


def zerofit_estimate(row: dict, shape: dict, bf16: bool) -> dict:
    """zerofit's estimate of the case: allocated = the estimate's peak (``est_cublas``: its
    cuBLAS workspaces), reserved = that plus the allocator term."""
    from zerofit.memory.estimate import estimate_memory
    from zerofit.models.resolve import spec_from_config

    spec = spec_from_config({**shape, "model_type": "qwen2"}, "gpu-lora")
    est = estimate_memory(spec, estimate_setup(row, bf16))
    allocated = est.peak_bytes
    out = {"est_allocated": allocated, "est_reserved": allocated + est.allocator_bytes}
    out["est_cublas"] = est.breakdown.get("cublas_workspace", 0)
    out["est_phase"] = est.phase
    if "max_allocated" in row:
        out["err_allocated"] = round(allocated / row["max_allocated"] - 1, 4)
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
        if "error" in kept:
            fresh.append(kept)
            continue
        fresh.append(with_estimate(kept, shape, bf16=row.get("device") == "cuda"))
    path.write_text("".join(json.dumps(row) + "\n" for row in fresh))
    for row in fresh:
        print(json.dumps(row))


def release(device: str) -> None:
    """Drop the case's model, engine and optimizer before the next case starts."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def run_case(folder: Path, case: dict, shape: dict, args) -> dict:
    """One case measured (or its error), labelled with the device, and its estimate."""
    try:
        row = measure_case(folder, case, shape, args.device)
    except Exception as error:  # one failing case must not lose the others' numbers
        row = dict(case, error=f"{type(error).__name__}: {error}"[:300])
    release(args.device)
    row.update(device=args.device, gpu=args.gpu_name, tiny=args.tiny)
    if "error" not in row:
        row = with_estimate(row, shape, bf16=args.device == "cuda")
    return row


def all_cases(args, shape: dict) -> list[dict]:
    """Every case of the chosen stacks, in order; DeepSpeed's carry the bucket sizes they run."""
    cases = []
    for stack in args.stacks:
        chosen = build_cases(args.tiny, stack, args.stage_list)[: args.first]
        if args.cases is not None:
            chosen = [case for index, case in enumerate(chosen) if index in args.cases]
        for case in chosen:
            if stack == "deepspeed":
                case["buckets"] = bucket_sizes(shape["hidden_size"], case["stage"])
            cases.append(case)
    return cases


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (dry runs)")
    parser.add_argument("--stack", default="plain", help="plain, autocast, deepspeed; a comma list")
    parser.add_argument("--stages", default="2,3", help="deepspeed's ZeRO stages, a comma list")
    parser.add_argument("--first", type=int, help="only each stack's first N cases (dry runs)")
    parser.add_argument(
        "--cases",
        help="only these of each stack's cases, a comma list of 0-based positions (one process "
        "per case: its peak is its own, and ZeRO-3 engines leave nothing to the next)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON lines here")
    parser.add_argument("--annotate", type=Path, help="add estimates to a results file")
    args = parser.parse_args()
    args.stacks = [name.strip() for name in args.stack.split(",")]
    unknown = [name for name in args.stacks if name not in STACKS]
    if unknown:
        parser.error(f"--stack: unknown {unknown} (fix: one or more of {', '.join(STACKS)})")
    try:
        args.cases = None if args.cases is None else {int(i) for i in args.cases.split(",")}
    except ValueError:
        parser.error(f"--cases: {args.cases!r} is not a comma list of numbers (fix: --cases 5,6)")
    args.stage_list = tuple(int(stage) for stage in args.stages.split(","))
    if not set(args.stage_list) <= {2, 3}:
        parser.error("--stages: DeepSpeed cases run ZeRO-2 and ZeRO-3 (fix: --stages 2,3)")
    return args


def main() -> None:
    args = parse_args()
    if args.annotate:
        annotate(args.annotate)
        return
    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA GPU visible (fix: --device cpu --tiny for a dry run)")
    shape = TINY if args.tiny else QWEN25_05B
    args.gpu_name = torch.cuda.get_device_name() if cuda else "cpu"
    if "deepspeed" in args.stacks:
        init_single_rank(args.device)
    cases = all_cases(args, shape)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        save_random_model(shape, folder)
        for case in cases:
            line = json.dumps(run_case(folder, case, shape, args))
            print(line, flush=True)
            lines.append(line)
            if args.out:
                args.out.write_text("".join(item + "\n" for item in lines))


if __name__ == "__main__":
    main()
