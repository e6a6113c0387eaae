"""QLoRA against LoRA step time on one GPU, and bitsandbytes' 4-bit dequantization per call.

zerofit's speed model prices QLoRA's 4-bit base as its dequantizations (speed/quantization.py):
their count per micro step, their HBM bytes, and a host cost per dequantizing call
(``DEQUANTIZE_HOST_S_PER_CALL``), which this script measures. Three kinds of rows (``kind``):

- ``dequantize``: ``bitsandbytes.functional.dequantize_4bit`` of one NF4 weight with double
  quantization (what ``MatMul4Bit.backward`` calls) at a decoder's shapes: GPU seconds per call
  (CUDA events over a run of calls), and a frozen ``bnb.nn.Linear4bit`` forward against an
  ``nn.Linear`` one on 4096 rows (the forward's dequantize-then-matmul fallback).
- ``host``: host seconds of a frozen ``Linear4bit`` and an ``nn.Linear`` on a 256 x 256 weight at
  2048 rows (past the fused kernel's rows; small enough that the GPU keeps up with the host):
  forward alone, and forward + backward; ``host_s_per_dequantize`` is half the difference of the
  latter (one forward and one backward dequantization), the value of
  ``DEQUANTIZE_HOST_S_PER_CALL``.
- ``step``: whole training steps of a random-init Qwen2 of Qwen2.5-1.5B's and Qwen2.5-7B's shape
  (built on the GPU from a transformers config, nothing downloaded), LoRA on the bf16 base and
  QLoRA on the base quantized as transformers' ``from_pretrained`` does (``replace_with_bnb_linear``
  with ``get_keys_to_not_convert``'s exclusions, each weight a ``Params4bit`` moved to the GPU:
  NF4, double quantization, bf16 compute); peft all-linear r 16 adapters; the autocast stack of
  benchmarks/gpu_lora_memory.py ``build_step`` (bf16 autocast, clipping, fused AdamW; QLoRA's
  adapters cast to bf16 as TRL does), micro batch 2, with and without checkpointing, at 512 and
  2048 tokens; the median of 5 steps after 2 warm-ups.

Run on a GPU (zerofit need not be importable there):
    python3 benchmarks/qlora_step_time.py --out qlora.jsonl [--quick: the 1.5B shape only]
Plan only:  python3 benchmarks/qlora_step_time.py --dry-run [--quick]
CPU run:    python3 benchmarks/qlora_step_time.py --device cpu --tiny --out tiny.jsonl
Add zerofit's predictions and print the comparison (where zerofit is importable):
    python benchmarks/qlora_step_time.py --annotate qlora.jsonl
No public step time of a bitsandbytes QLoRA run is stored: the Qwen README's "Q-LoRA" rows
(tests/data/step_times_public.jsonl) train its GPTQ Int4 checkpoints through auto-gptq's kernels,
not NF4, and benchmarks/step_times_public.py leaves them out for that reason.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import gpu_lora_memory
from model_shapes import QWEN25_7B, QWEN25_15B

SHAPES = {"qwen2.5-1.5b": QWEN25_15B, "qwen2.5-7b": QWEN25_7B, "tiny": gpu_lora_memory.TINY}
WARMUP_STEPS, TIMED_STEPS = 2, 5
HOST_ROWS, HOST_WIDTH, HOST_CALLS = 2048, 256, 200
FORWARD_ROWS = 4096


def dequantize_shapes(tiny: bool) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of the weights the ``dequantize`` rows time: Qwen2.5-7B's
    attention and MLP projections and Qwen2.5-1.5B's up projection (the tiny shape's on a CPU)."""
    if tiny:
        return [("tiny.up_proj", 64, 176)]
    return [
        ("qwen2.5-7b.q_proj", 3584, 3584),
        ("qwen2.5-7b.k_proj", 3584, 512),
        ("qwen2.5-7b.up_proj", 3584, 18944),
        ("qwen2.5-7b.down_proj", 18944, 3584),
        ("qwen2.5-1.5b.up_proj", 1536, 8960),
    ]


def step_cases(shape_names: list[str], tiny: bool) -> list[dict]:
    """LoRA then QLoRA per shape (one model each), without then with checkpointing, two lengths."""
    seqs = (64, 160) if tiny else (512, 2048)
    return [
        {"kind": "step", "shape": shape, "stack": "autocast", "stage": 0, "finetuning": finetuning}
        | {"checkpointing": checkpointing, "seq": seq}
        for shape in shape_names
        for finetuning in ("lora", "qlora")
        for checkpointing in (False, True)
        for seq in seqs
    ]


def plan(args) -> list[dict]:
    """Every row the run measures, in order (what ``--dry-run`` prints)."""
    rows = [
        {"kind": "dequantize", "weight": name, "in_features": fan_in, "out_features": fan_out}
        for name, fan_in, fan_out in dequantize_shapes(args.tiny)
    ]
    # on a CPU the default kernel dequantizes at any size: a tiny product times the host's path
    on_cpu = args.device == "cpu"
    host = {"rows": 8 if on_cpu else HOST_ROWS, "width": 64 if on_cpu else HOST_WIDTH}
    rows.append({"kind": "host", **host, "calls": 50 if on_cpu else HOST_CALLS})
    return rows + step_cases(args.shape_names, args.tiny)


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def quantized_linear(weight, device: str):
    """A frozen ``bnb.nn.Linear4bit`` holding ``weight`` (out x in) in NF4 with double
    quantization and bf16 compute, quantized as transformers' loader does (``Params4bit(...)
    .to(device)``: integrations/bitsandbytes.py ``Bnb4bitQuantize.convert``)."""
    import bitsandbytes as bnb
    import torch

    out_features, in_features = weight.shape
    layer = bnb.nn.Linear4bit(
        in_features,
        out_features,
        bias=False,
        compute_dtype=torch.bfloat16,
        compress_statistics=True,
        quant_type="nf4",
    )
    layer.weight = bnb.nn.Params4bit(
        weight.detach().cpu(), requires_grad=False, **layer.weight.__dict__
    ).to(device)
    return layer.requires_grad_(False)


def gpu_seconds_per_call(work, calls: int, device: str) -> float | None:
    """GPU seconds of one ``work()`` over ``calls`` runs between two CUDA events (None on a
    CPU)."""
    import torch

    work()
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        work()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / calls


def measure_dequantize(row: dict, device: str) -> dict:
    """GPU seconds of ``dequantize_4bit`` and of a 4-bit against a 16-bit forward at one shape."""
    import bitsandbytes.functional as bnb_functional
    import torch

    weight = torch.randn(row["out_features"], row["in_features"], dtype=torch.bfloat16)
    weight = weight.to(device)
    four_bit = quantized_linear(weight, device)
    sixteen_bit = torch.nn.Linear(row["in_features"], row["out_features"], bias=False)
    sixteen_bit = sixteen_bit.to(device=device, dtype=torch.bfloat16).requires_grad_(False)
    packed, state = four_bit.weight.data, four_bit.weight.quant_state
    calls = 20 if device == "cuda" else 2
    rows = FORWARD_ROWS if device == "cuda" else 256
    inputs = torch.randn(rows, row["in_features"], dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        measured = {
            "gpu_s_dequantize": gpu_seconds_per_call(
                lambda: bnb_functional.dequantize_4bit(packed, state), calls, device
            ),
            "gpu_s_forward_4bit": gpu_seconds_per_call(lambda: four_bit(inputs), calls, device),
            "gpu_s_forward_16bit": gpu_seconds_per_call(
                lambda: sixteen_bit(inputs), calls, device
            ),
        }
    return dict(row, forward_rows=rows, **measured)


def host_seconds_per_call(work, calls: int, device: str) -> float:
    """Median host seconds of ``work()`` over three runs of ``calls`` (the GPU synchronized only
    around each run, so that the host's issue time is what is timed while the GPU keeps up)."""
    work()
    synchronize(device)
    runs = []
    for _ in range(3):
        began = time.perf_counter()
        for _ in range(calls):
            work()
        runs.append((time.perf_counter() - began) / calls)
        synchronize(device)
    return statistics.median(runs)


def measure_host(row: dict, device: str) -> dict:
    """Host seconds per forward and per forward + backward of a frozen 4-bit and 16-bit linear
    whose input requires grad (as inside a trained decoder), and GPU seconds of the 4-bit pair
    (below the host's: the host's time is what the run measured)."""
    import torch

    width, rows = row["width"], row["rows"]
    weight = torch.randn(width, width, dtype=torch.bfloat16, device=device)
    four_bit = quantized_linear(weight, device)
    sixteen_bit = torch.nn.Linear(width, width, bias=False).to(device=device, dtype=torch.bfloat16)
    sixteen_bit.requires_grad_(False)
    inputs = torch.randn(rows, width, dtype=torch.bfloat16, device=device, requires_grad=True)
    grad = torch.ones(rows, width, dtype=torch.bfloat16, device=device)
    calls = row["calls"]
    out = dict(row)
    for name, layer in (("4bit", four_bit), ("16bit", sixteen_bit)):

        def forward(layer=layer) -> None:
            layer(inputs)

        def forward_backward(layer=layer) -> None:
            layer(inputs).backward(grad)

        out[f"host_s_forward_{name}"] = host_seconds_per_call(forward, calls, device)
        out[f"host_s_step_{name}"] = host_seconds_per_call(forward_backward, calls, device)
        out[f"gpu_s_step_{name}"] = gpu_seconds_per_call(forward_backward, calls, device)
    extra = out["host_s_step_4bit"] - out["host_s_step_16bit"]
    out["host_s_forward_extra"] = out["host_s_forward_4bit"] - out["host_s_forward_16bit"]
    out["host_s_backward_extra"] = extra - out["host_s_forward_extra"]
    out["host_s_per_dequantize"] = extra / 2
    return out


def build_model(shape: dict, finetuning: str, device: str):
    """A random-init Qwen2 of ``shape`` in bf16, built on ``device``; under QLoRA its linear
    layers replaced and quantized as transformers' bitsandbytes loader does
    (quantizers/quantizer_bnb_4bit.py ``_process_model_before_weight_loading``: the modules of
    quantizers/base.py ``get_keys_to_not_convert`` stay 16-bit, integrations/bitsandbytes.py
    ``replace_with_bnb_linear``, then ``Bnb4bitQuantize.convert``'s ``Params4bit(...).to``)."""
    import bitsandbytes as bnb
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", attn_implementation="sdpa", use_cache=False, **shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if finetuning == "qlora":
        skipped = get_keys_to_not_convert(model)
        linears = {
            name: (module.weight.data, module.bias)
            for name, module in model.named_modules()
            if type(module) is torch.nn.Linear and name not in skipped
        }
        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        replace_with_bnb_linear(model, skipped, quantization)
        for name, (weight, bias) in linears.items():
            module = model.get_submodule(name)
            module.weight = bnb.nn.Params4bit(
                weight, requires_grad=False, **module.weight.__dict__
            ).to(device)
            if bias is not None:
                module.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
        model.is_loaded_in_4bit = True  # quantizer_bnb_4bit.py _process_model_after_weight_loading
    return model.train()


def add_adapters(model, finetuning: str):
    """peft's all-linear adapters (gpu_lora_memory's rank and dropout); QLoRA's cast to bf16 as
    TRL 1.16's ``SFTTrainer.__init__`` does for a quantized model."""
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=gpu_lora_memory.RANK, target_modules="all-linear", lora_dropout=gpu_lora_memory.DROPOUT
    )
    model = get_peft_model(model, config)
    if finetuning == "qlora":
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    return model


def time_steps(model, case: dict, shape: dict, device: str) -> dict:
    """The median of ``TIMED_STEPS`` steps after ``WARMUP_STEPS`` (each synchronized)."""
    import torch

    step, trainable, _ = gpu_lora_memory.build_step(model, case, shape, device)
    for _ in range(WARMUP_STEPS):
        step()
    synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(TIMED_STEPS if device == "cuda" else 1):
        began = time.perf_counter()
        step()
        synchronize(device)
        seconds.append(round(time.perf_counter() - began, 4))
    row = dict(case, micro=gpu_lora_memory.MICRO, rank=gpu_lora_memory.RANK)
    row.update(dropout=gpu_lora_memory.DROPOUT, trainable_params=trainable, step_seconds=seconds)
    row["seconds_per_step"] = statistics.median(seconds)
    if device == "cuda":
        row["max_allocated"] = torch.cuda.max_memory_allocated()
    return row


def measure_steps(cases: list[dict], device: str, emit) -> None:
    """Each (shape, finetuning)'s cases on one model: checkpointing switched on after the cases
    without it (``use_reentrant=False`` plus ``enable_input_require_grads``, as peft and TRL)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for case in cases:
        groups.setdefault((case["shape"], case["finetuning"]), []).append(case)
    for (shape_name, finetuning), group in groups.items():
        shape = SHAPES[shape_name]
        try:
            model = add_adapters(build_model(shape, finetuning, device), finetuning)
        except Exception as error:  # one shape failing must not lose the others' rows
            for case in group:
                emit(dict(case, error=f"{type(error).__name__}: {error}"[:300]))
            continue
        checkpointing = False
        for case in group:
            if case["checkpointing"] and not checkpointing:
                model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
                model.enable_input_require_grads()
                checkpointing = True
            try:
                emit(time_steps(model, case, shape, device))
            except Exception as error:
                emit(dict(case, error=f"{type(error).__name__}: {error}"[:300]))
            gpu_lora_memory.release(device)
        del model
        gpu_lora_memory.release(device)


def measure(args) -> list[dict]:
    """Every planned row measured, written to ``--out`` as it comes."""
    import torch

    lines: list[dict] = []
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"

    def emit(row: dict) -> None:
        row = dict(row, device=args.device, gpu=gpu, tiny=args.tiny)
        lines.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            args.out.write_text("".join(json.dumps(item) + "\n" for item in lines))

    rows = plan(args)
    for row in rows:
        if row["kind"] == "dequantize":
            emit(measure_dequantize(row, args.device))
        elif row["kind"] == "host":
            emit(measure_host(row, args.device))
    measure_steps([row for row in rows if row["kind"] == "step"], args.device, emit)
    return lines


# --- zerofit's predictions beside the measured rows (--annotate, where zerofit is importable) ---
def predicted_step(row: dict) -> dict:
    """zerofit's step time of a ``step`` row: the TrainSetup gpu_lora_memory builds for its
    autocast stack (stage 0, the HF stack, bf16) on the row's GPU."""
    from zerofit.hardware import lookup
    from zerofit.memory.lora import count_trainable_params
    from zerofit.models.resolve import spec_from_config
    from zerofit.speed.step_time import estimate_step_time

    setup = gpu_lora_memory.estimate_setup(row, bf16=True)
    spec = spec_from_config({**SHAPES[row["shape"]], "model_type": "qwen2"}, row["shape"])
    gpu = lookup(setup.gpu or "H100-SXM")
    step = estimate_step_time(
        setup, spec, gpu, trainable_params=count_trainable_params(spec, setup)
    )
    terms = step.breakdown()
    out = {"est_step_s": round(step.total_s, 4), "est_dequantize_s": terms.get("dequantize_s", 0)}
    out["err_step"] = round(step.total_s / row["seconds_per_step"] - 1, 4)
    return out


def predicted_dequantize(row: dict) -> dict:
    """zerofit's bytes and HBM seconds of one dequantization of the row's weight."""
    from zerofit.hardware import lookup
    from zerofit.speed.generation import DECODE_HBM_EFFICIENCY
    from zerofit.speed.quantization import dequantize_bytes_per_element

    elements = row["in_features"] * row["out_features"]
    hbm_bytes = elements * dequantize_bytes_per_element(2)
    gpu = lookup(gpu_lora_memory.catalog_gpu(row) or "H100-SXM")
    out = {"est_bytes": round(hbm_bytes)}
    out["est_gpu_s_dequantize"] = hbm_bytes / (gpu.hbm_gbps * 1e9 * DECODE_HBM_EFFICIENCY)
    if row.get("gpu_s_dequantize"):
        out["achieved_gbps"] = round(hbm_bytes / row["gpu_s_dequantize"] / 1e9, 1)
    return out


def predicted_host(row: dict) -> dict:
    """The model's host cost per dequantizing call beside the row's measured one."""
    from zerofit.speed.quantization import DEQUANTIZE_HOST_S_PER_CALL

    return {"est_host_s_per_dequantize": DEQUANTIZE_HOST_S_PER_CALL}


PREDICTORS = {"step": predicted_step, "dequantize": predicted_dequantize, "host": predicted_host}


def comparison_lines(rows: list[dict]) -> list[str]:
    """QLoRA's measured and predicted extra seconds over LoRA per (shape, checkpointing, seq)."""
    steps = {
        (row["shape"], row["checkpointing"], row["seq"], row["finetuning"]): row
        for row in rows
        if row.get("kind") == "step" and "error" not in row
    }
    lines = []
    for row in rows:
        if row.get("kind") == "dequantize" and row.get("gpu_s_dequantize"):
            lines.append(
                f"dequantize {row['weight']}: {row['gpu_s_dequantize'] * 1e6:.1f} us measured, "
                f"{row['est_gpu_s_dequantize'] * 1e6:.1f} us predicted "
                f"({row['achieved_gbps']} GB/s at zerofit's bytes)"
            )
        if row.get("kind") == "host" and "est_host_s_per_dequantize" in row:
            lines.append(
                f"host per dequantization: {row['host_s_per_dequantize'] * 1e6:.1f} us measured "
                f"(forward +{row.get('host_s_forward_extra', 0) * 1e6:.1f}, backward "
                f"+{row.get('host_s_backward_extra', 0) * 1e6:.1f}); DEQUANTIZE_HOST_S_PER_CALL "
                f"{row['est_host_s_per_dequantize'] * 1e6:.1f} us"
            )
    lines.append("shape ckpt seq: lora s, qlora s (measured / predicted); qlora - lora")
    for (shape, ckpt, seq, finetuning), lora in steps.items():
        qlora = steps.get((shape, ckpt, seq, "qlora"))
        if finetuning != "lora" or qlora is None or "est_step_s" not in qlora:
            continue
        measured = qlora["seconds_per_step"] - lora["seconds_per_step"]
        predicted = qlora["est_step_s"] - lora["est_step_s"]
        lines.append(
            f"{shape} {'ckpt' if ckpt else 'no-ckpt'} {seq}: "
            f"{lora['seconds_per_step']:.4f} / {lora['est_step_s']:.4f}, "
            f"{qlora['seconds_per_step']:.4f} / {qlora['est_step_s']:.4f}; "
            f"+{measured:.4f} measured, +{predicted:.4f} predicted "
            f"(dequantize_s {qlora['est_dequantize_s']:.4f})"
        )
    return lines


def annotate(path: Path) -> None:
    """Rewrite a measured results file with zerofit's predictions beside each row, then print
    the rows and the QLoRA - LoRA comparison."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    fresh = []
    for row in rows:
        kept = {k: v for k, v in row.items() if not k.startswith(("est_", "err_", "achieved_"))}
        if "error" not in kept and kept.get("kind") in PREDICTORS:
            kept.update(PREDICTORS[kept["kind"]](kept))
        fresh.append(kept)
    path.write_text("".join(json.dumps(row) + "\n" for row in fresh))
    for row in fresh:
        print(json.dumps(row))
    for line in comparison_lines(fresh):
        print(line)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="the 2-layer shape (CPU runs)")
    parser.add_argument("--quick", action="store_true", help="the 1.5B shape only")
    parser.add_argument("--dry-run", action="store_true", help="print the planned rows and stop")
    parser.add_argument("--out", type=Path, help="also write the JSON lines here")
    parser.add_argument("--annotate", type=Path, help="add zerofit's predictions to a results file")
    args = parser.parse_args(argv)
    if args.tiny:
        args.shape_names = ["tiny"]
    else:
        args.shape_names = ["qwen2.5-1.5b"] if args.quick else ["qwen2.5-1.5b", "qwen2.5-7b"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.annotate:
        annotate(args.annotate)
        return
    if args.dry_run:
        for row in plan(args):
            print(json.dumps(row))
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA GPU visible (fix: --device cpu --tiny for a CPU run)")
    measure(args)
    gc.collect()


if __name__ == "__main__":
    main()
