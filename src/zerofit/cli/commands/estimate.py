"""`zerofit estimate`: per-GPU memory of one configuration, with its breakdown and verdict.

Knobs left unset take fixed estimate defaults (no planning): ZeRO stage 2 (3 when parameters
are offloaded), no offload, micro batch 1, no gradient checkpointing, bf16 where the GPU has it.
Gradient accumulation is global_batch / (micro x GPUs) when a global batch is given, else 1.
With --ds-config / --accelerate-config the stage, offload, precision, bucket sizes, optimizer
block and batch sizes come from your own files; flags given on the command line override them.
"""

from __future__ import annotations

import json
from pathlib import Path

from zerofit.cli.answer_flags import add_answer_flags

# Answers fields a config file may fill (when the flag is not given)
_FILE_ANSWER_FIELDS = (
    "stage",
    "offload_optimizer",
    "offload_param",
    "precision",
    "micro_batch",
    "gpus_per_node",
    "num_nodes",
    "nvme_path",
)


def register(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict per-GPU peak memory of one configuration",
        description=__doc__.split("\n\n", 1)[1],
    )
    add_answer_flags(p)
    p.add_argument("--ds-config", metavar="FILE", help="your DeepSpeed JSON (flags override it)")
    p.add_argument(
        "--accelerate-config", metavar="FILE", help="your accelerate YAML (flags override it)"
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def read_config_files(ds_path: str | None, accelerate_path: str | None, hidden_size: int) -> dict:
    """Estimate inputs from the user's accelerate YAML and/or DeepSpeed JSON (the JSON wins)."""
    from zerofit.errors import ZerofitError
    from zerofit.memory.ds_config import read_accelerate_config, read_ds_config

    out: dict = {}
    if accelerate_path:
        import yaml

        text = _read("--accelerate-config", accelerate_path)
        try:
            cfg = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ZerofitError(
                "--accelerate-config",
                f"{accelerate_path} is not valid YAML " f"({str(exc).splitlines()[0]})",
                "fix the YAML syntax",
            ) from None
        acc, json_path = read_accelerate_config(cfg)
        out.update(acc)
        if json_path and not ds_path:
            ds_path = (
                str(Path(accelerate_path).parent / json_path)
                if not Path(json_path).is_absolute() and not Path(json_path).exists()
                else json_path
            )
    if ds_path:
        text = _read("--ds-config", ds_path)
        try:
            ds = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ZerofitError(
                "--ds-config",
                f"{ds_path} is not valid JSON ({exc.msg}, line {exc.lineno})",
                "fix the JSON syntax",
            ) from None
        out.update(read_ds_config(ds, hidden_size))
    return out


def _read(flag: str, path: str) -> str:
    from zerofit.errors import ZerofitError

    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ZerofitError(
            flag, f"cannot read {path} ({exc.strerror})", "give an existing file"
        ) from None


def build_estimate(answers, files: dict | None = None) -> dict:
    """The estimate as a plain dict (what --json prints). ``files``: inputs read from the user's
    config files that are not Answers fields (buckets, overlap_comm, optimizer block, grad_accum).
    """
    import dataclasses

    from zerofit.errors import ZerofitError
    from zerofit.hardware import lookup
    from zerofit.memory.estimate import GIB, estimate_memory
    from zerofit.models.resolve import resolve_model
    from zerofit.planning.planner import host_ram_gib, judge, make_setup, pick_precision

    files = files or {}
    model, gpu = resolve_model(answers.model), lookup(answers.gpu)
    precision = pick_precision(answers, gpu)[0]
    offload_param = answers.offload_param or "none"
    stage = answers.stage if answers.stage is not None else (3 if offload_param != "none" else 2)
    offload_opt = answers.offload_optimizer or (
        "none" if offload_param == "none" else offload_param
    )
    if offload_param != "none" and stage != 3:
        raise ZerofitError(
            "offload_param",
            f"needs ZeRO stage 3, not {stage}",
            "use --stage 3 or --offload-param none",
        )
    if offload_opt != "none" and stage == 0:
        raise ZerofitError(
            "offload_optimizer",
            "needs ZeRO stage 1, 2 or 3",
            "use --stage 2 or --offload-optimizer none",
        )
    micro = answers.micro_batch or 1
    world = answers.world_size
    accum = files.get("grad_accum", 1)
    if answers.global_batch is not None:
        if answers.global_batch % (micro * world):
            raise ZerofitError(
                "global_batch",
                f"{answers.global_batch} is not a multiple of micro {micro} x {world} GPUs",
                f"use a multiple of {micro * world}",
            )
        accum = answers.global_batch // (micro * world)
    elif "train_batch_size" in files and "grad_accum" not in files:
        accum = max(1, files["train_batch_size"] // (micro * world))
    setup = make_setup(
        answers,
        precision,
        stage,
        offload_opt,
        offload_param,
        bool(answers.gradient_checkpointing),
        micro,
        accum,
    )
    if files:
        extra = {
            k: files[k]
            for k in (
                "buckets",
                "overlap_comm",
                "ds_optimizer_block",
                "pin_optimizer_offload",
                "pin_param_offload",
            )
            if k in files
        }
        if files.get("optimizer") and answers.optimizer is None:
            extra["optimizer"] = files["optimizer"]
        setup = dataclasses.replace(setup, **extra)
    if answers.pin_memory is not None:  # the flag overrides the files' offload blocks
        setup = setup.with_pinning(answers.pin_memory)
    est = estimate_memory(model, setup)
    gpu_ok, host_ok, need = judge(est, answers, gpu)
    ram, source = host_ram_gib(answers, gpu)
    unpinned_cpu_gib = None
    if setup.pins_offload:  # what the same offload needs with pin_memory false (memory/pinned.py)
        unpinned_cpu_gib = round(estimate_memory(model, setup.with_pinning(False)).cpu_gib, 3)
    outside = {k: round(v / GIB, 3) for k, v in est.outside_bytes(gpu.memory_gib).items()}
    # what padding the micro batch costs at the peak (memory/activations.py:
    # padded_attention_bytes): the same setup with equal-length rows, for the note and --json
    padding_gib = 0.0
    if setup.padded:
        unpadded = estimate_memory(model, dataclasses.replace(setup, padded=False))
        padding_gib = round(est.peak_gib - unpadded.peak_gib, 3)
    return {
        "model": model.name,
        # where the decoder layer's bytes come from (activations.activations_basis): a formula
        # checked against transformers' modules, or this architecture's own code traced
        "activations_traced": est.activations_basis != "llama_shaped",
        "activations_basis": est.activations_basis,
        "params": model.params,
        "gpu": gpu.key,
        "world_size": world,
        "stage": stage,
        "offload_optimizer": offload_opt,
        "offload_param": offload_param,
        "precision": precision,
        "micro_batch": micro,
        "grad_accum": accum,
        "seq_len": answers.seq_len,
        "gradient_checkpointing": bool(answers.gradient_checkpointing),
        "workload": answers.workload,
        # micro batches padded to their longest sequence (planner.pads_batches), and what that
        # adds to the peak
        "padded": setup.padded,
        "padding_gib": padding_gib,
        "peak_gib": round(est.peak_gib, 3),
        "fits": gpu_ok and host_ok,
        "budget_gib": round(gpu.memory_gib * answers.headroom, 2),
        "peak_phase": est.phase,
        "breakdown": est.breakdown_gib(gpu.memory_gib),
        "cpu_gib": round(est.cpu_gib, 3),
        "cuda_context_gib": round(est.context_bytes / GIB, 3),
        # added with the stack-aware model (issue 8); the keys above are unchanged
        "stack": answers.stack,
        "optimizer": est.optimizer,
        "loss_path": est.loss_path,
        # stage 0 without DeepSpeed trains the weights in their load dtype (memory/states.py)
        "weights_dtype": setup.weight_dtype if setup.without_deepspeed else None,
        "outside_peak_gib": outside,
        "safety_margin_gib": answers.safety_margin_gib,
        "gpu_need_gib": round(need, 3),
        # what the budget leaves beyond everything above (negative: it does not fit)
        "spare_gib": round(gpu.memory_gib * answers.headroom - need, 3),
        "gpu_memory_gib": gpu.memory_gib,
        "fits_gpu": gpu_ok,
        "host_ram_gib": round(ram, 1),
        "host_ram_source": source,
        "fits_host": host_ok,
        # offload buffers page-locked (some offload block pins), and the host RAM without pinning
        "pin_memory": setup.pins_offload,
        "cpu_gib_unpinned": unpinned_cpu_gib,
        "from_files": sorted(k for k in files if k != "buckets")
        + (["buckets"] if "buckets" in files else []),
    }


def verdict_line(r: dict) -> str:
    """One sentence naming the budget that fails, with both numbers."""
    gpu = f"{r['gpu_need_gib']:.1f} GiB per GPU of {r['budget_gib']:.1f}"
    host = f"{r['cpu_gib']:.1f} GiB of host RAM per node"
    if r["host_ram_source"] == "this node":
        has = f"this node has {r['host_ram_gib']:.1f}"
    elif r["host_ram_source"] == "given":
        has = f"you gave {r['host_ram_gib']:.1f}"
    else:
        has = f"assumed {r['host_ram_gib']:.1f}; set --host-ram-gib"
    if r["fits"]:
        spare = f" ({r['spare_gib']:.1f} GiB to spare)"
        return f"fits: needs {gpu}{spare}" + (f", and {host} ({has})" if r["cpu_gib"] else "")
    if r["fits_gpu"]:
        line = f"does NOT fit: fits on the GPU ({gpu}) but needs {host}, {has}"
        unpinned = r.get("cpu_gib_unpinned")
        if unpinned is not None and unpinned <= r["host_ram_gib"]:
            line += (
                f"; with pin_memory false in the offload blocks (--no-pin-memory) it needs "
                f"{unpinned:.1f} GiB, which fits"
            )
        return line
    if r["fits_host"]:
        return f"does NOT fit on the GPU: needs {gpu}"
    return f"does NOT fit: needs {gpu} and {host}, {has}"


def estimate_from_files(
    flags: dict,
    ds_config: str | None = None,
    accelerate_config: str | None = None,
    base: dict | None = None,
) -> dict:
    """The estimate of the user's own config files: what ``zerofit estimate --ds-config FILE
    --accelerate-config FILE`` prints as JSON.

    ``flags``: Answers fields given on the command line (they override the files); ``base``: an
    answers file's fields (the config files override them). The files fill stage, offload,
    precision, micro batch and processes where no flag names them, and hand the estimate what
    Answers does not hold (bucket sizes, overlap_comm, the optimizer block, grad accumulation).
    """
    from zerofit.models.resolve import resolve_model
    from zerofit.planning.answers import answers_from_dict

    data = {**(base or {}), **flags}
    files: dict = {}
    if ds_config or accelerate_config:
        model = resolve_model(answers_from_dict(data).model)
        files = read_config_files(ds_config, accelerate_config, model.hidden_size)
        for name in _FILE_ANSWER_FIELDS:  # flags given on the command line win
            if name in files and flags.get(name) is None:
                data[name] = files[name]
    return build_estimate(answers_from_dict(data), files)


def run(args) -> int:
    from dataclasses import fields

    from zerofit.planning.answers import Answers, answers_to_dict, load_answers

    base: dict = {}
    if getattr(args, "answers", None):
        base = answers_to_dict(load_answers(_read("--answers", args.answers)))
    flags = {
        f.name: getattr(args, f.name)
        for f in fields(Answers)
        if getattr(args, f.name, None) is not None
    }
    result = estimate_from_files(flags, args.ds_config, args.accelerate_config, base)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    stage = f"ZeRO-{result['stage']}"
    if result["weights_dtype"]:
        stage += f" (no DeepSpeed, {result['weights_dtype']} weights)"
    # the setup is a heading of its own, not the table's title: rich folds a title to the table's
    # width, cutting a long model path mid-word
    heading = (
        f"{result['model']} on {result['world_size']} x {result['gpu']}: {stage}, "
        f"micro {result['micro_batch']}, seq {result['seq_len']}, peak in {result['peak_phase']} "
        f"({result['stack']} stack: {result['optimizer']}, loss {result['loss_path']})"
    )
    table = Table()
    table.add_column("component")
    table.add_column("GiB / GPU", justify="right")
    for name, gib in result["breakdown"].items():
        if "not in peak" not in name:
            table.add_row(name, f"{gib:.2f}")
    table.add_row(
        "[bold]peak (max_memory_allocated)[/bold]", f"[bold]{result['peak_gib']:.2f}[/bold]"
    )
    for name, gib in result["outside_peak_gib"].items():
        if gib:
            table.add_row(f"+ {name}", f"{gib:.2f}")
    table.add_row("+ safety margin", f"{result['safety_margin_gib']:.2f}")
    table.add_row("[bold]the GPU must hold[/bold]", f"[bold]{result['gpu_need_gib']:.2f}[/bold]")
    console = Console()
    console.print(heading, highlight=False)
    console.print(table)
    console.print(verdict_line(result))
    if result["fits_gpu"]:
        from zerofit.memory.overheads import tight_fit_note

        note = tight_fit_note(result["spare_gib"])
        if note:
            console.print(note)
    if result["padding_gib"] >= 0.05:
        from zerofit.memory.activations import padding_note

        console.print(padding_note(result["padding_gib"]))
    if result["activations_basis"] == "llama_shaped":
        console.print(
            f"note: activations use a Llama-style decoder layer; {result['model']}'s own layer "
            "was not traced (transformers cannot build it here) and may keep more (extra norms, "
            "other MLPs): keep some headroom"
        )
    elif result["activations_basis"].startswith("traced_eager"):
        fix = (
            "--attention flash_attention_2 avoids them"
            if result["activations_basis"] == "traced_eager"
            else "transformers has no flash attention for it either"
        )
        console.print(
            f"note: {result['model']} runs eager attention in transformers (no sdpa kernel for "
            f"it), which keeps seq x seq scores in every layer ({fix})"
        )
    return 0
