"""zerofit's OOM verdict at its own boundary, on a real GPU: held-out H100 points and capped runs.

    python benchmarks/gpu_oom_boundary.py --out $OUT/boundary.jsonl   # on a CUDA machine
    python benchmarks/gpu_oom_boundary.py --dry-run                   # anywhere: what it would run

It judges the memory model on H100 points it was not built on, and its verdict on whether a
configuration runs out of memory. Public reports (benchmarks/public_reports.py) leave too many
facts open to settle the second; this script settles both on a lent GPU. Most runs use the
calibration runs' setup (tests/data/mem_h100_qwen2.5-0.5b.md: a random-init model of a built-in
shape, bf16, a client ``torch.optim.AdamW`` handed to ``deepspeed.initialize``, bucket sizes at
DeepSpeed's defaults, 3 steps on random token ids); three run ``transformers.Trainer`` with its
defaults on one GPU without DeepSpeed, 1.5B to 7B models loaded in bf16. None of the
configurations in ``GRID`` is a calibration point, and most use a shape no calibration point has.

Every configuration is run three times, each in a fresh process (an OOM leaves the CUDA state
of its process unusable):

1. ``uncapped``: the peak the step really allocates and reserves, compared with zerofit's peak
   (a held-out calibration point; the calibration target is |error| <= 2 %, none under -1 %);
2. ``fits``: the caching allocator capped (``torch.cuda.set_per_process_memory_fraction``) at
   what zerofit says the allocator must be able to reserve, the allocated peak plus the
   fragmentation term (memory/overheads.py), plus ``--gap``. zerofit says this fits: it must run;
3. ``oom``: capped at zerofit's allocated peak minus ``--gap``. zerofit says this does not fit:
   it must run out of memory.

The cap limits only what the caching allocator reserves (c10/cuda/CUDACachingAllocator.cpp:
``set_memory_fraction`` sets ``allowed_memory_maximum``; a request over it first frees cached
blocks, then raises ``OutOfMemoryError``). So this checks the allocated peak and the
fragmentation term; the CUDA context and NCCL terms, outside the allocator, are checked by
tests/memory/test_overheads.py's GPU test and benchmarks/outside_allocator.py.

Output: one JSON line per run (``--out``, written as each run ends, so a run cut short by the
device's time limit keeps what finished; the uncapped lines carry the calibration file's
measurements: peak_alloc_gib, peak_reserved_gib, device_used_before_model_gib, device_used_end_gib,
step_s), then a summary. A run that crashed or timed out is reported, not judged.
``--budget-s`` stops launching runs once that much time has passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the checkout's zerofit, not an older installed copy

GIB = 1024**3
DS_CONFIG = ROOT / "tests" / "data" / "ds_calibration_h100.json"
MARKER = "GPU_OOM_BOUNDARY"
STEPS = 3  # as the calibration runs: the first step creates Adam's states, the last is steady
ENDINGS = ("ran", "oom")  # how a run can end and be judged; "crashed" and "timeout" are not


@dataclasses.dataclass(frozen=True)
class Config:
    """One training configuration, in the calibration file's terms."""

    shape: str  # a built-in model name (zerofit.models.builtin)
    stage: int
    offload: str  # offload_optimizer device: none | cpu
    seq: int
    mbs: int
    gc: bool
    # "deepspeed": the calibration runs' own loop on deepspeed.initialize; "trainer": the
    # transformers Trainer on one GPU without DeepSpeed, weights loaded in bf16 (stage 0)
    client: str = "deepspeed"

    @property
    def name(self) -> str:
        return (
            f"{self.shape} {self.client} stage {self.stage} offload {self.offload} "
            f"seq {self.seq} mbs {self.mbs} gc {self.gc}"
        )


# Held out: no calibration point has these (stage, offload, seq, mbs, gc), and qwen2.5-1.5b and
# qwen2.5-3b are shapes no calibration point has. Both phases that set most peaks are covered:
# forward (the logits of a 152k vocabulary, long sequences) and step (Adam's states with small
# activations, the phase where most of the public reports' missed OOMs peak). Every run fits an
# 80 GB GPU uncapped. Offload runs come last: they build DeepSpeed's cpu_adam op on first use.
GRID = (
    Config("qwen2.5-0.5b", 1, "none", 2048, 2, False),
    Config("qwen2.5-0.5b", 2, "none", 3072, 3, True),
    Config("qwen2.5-0.5b", 3, "none", 4096, 2, False),
    Config("qwen2.5-1.5b", 1, "none", 512, 4, False),
    Config("qwen2.5-1.5b", 2, "none", 4096, 2, True),
    Config("qwen2.5-1.5b", 3, "none", 1024, 1, True),
    Config("qwen2.5-3b", 2, "none", 1024, 1, True),
    Config("qwen2.5-0.5b", 2, "cpu", 6144, 2, True),
    Config("qwen2.5-1.5b", 3, "cpu", 8192, 1, True),
    # The scale users train at on one GPU, through the client most of them use: a 7B model loaded
    # in bf16 (57 GiB at its backward peak with the Trainer's default fused AdamW; ms-swift's and
    # LLaMA-Factory's single-A100 full fine-tunes in tests/data are this regime), and two forward
    # peaks without checkpointing.
    Config("qwen2.5-7b", 0, "none", 2048, 1, True, client="trainer"),
    Config("qwen2.5-3b", 0, "none", 4096, 2, False, client="trainer"),
    Config("qwen2.5-1.5b", 0, "none", 2048, 4, False, client="trainer"),
)


def estimate_config(config: Config):
    """zerofit's estimate for ``config``. The deepspeed client is set up exactly as
    tests/memory/test_estimate.py sets up a calibration point (one GPU, the accelerate stack's
    foreach AdamW, DeepSpeed's buckets); the trainer client as ``zerofit estimate --stack hf
    --stage 0 --weights-dtype bf16`` would, the Trainer's own default optimizer included."""
    from zerofit.memory.ds_defaults import DEEPSPEED_DEFAULT_BUCKETS
    from zerofit.memory.estimate import TrainSetup, estimate_memory
    from zerofit.models.resolve import resolve_model

    # the points run on an H100, whose cuBLAS workspaces the caching allocator holds
    shared = dict(
        micro_batch=config.mbs, seq_len=config.seq, gradient_checkpointing=config.gc, gpu="H100-SXM"
    )
    if config.client == "trainer":
        setup = TrainSetup(stage=0, stack="hf", weights_dtype="bf16", **shared)
    else:
        setup = TrainSetup(
            stage=config.stage,
            offload_optimizer=config.offload,
            buckets=DEEPSPEED_DEFAULT_BUCKETS,
            **shared,
        )
    return estimate_memory(resolve_model(config.shape), setup)


def allocator_need_bytes(estimate) -> int:
    """What zerofit says the caching allocator must be able to reserve: the allocated peak plus
    the fragmentation inside live segments (``MemoryEstimate.allocator_bytes``)."""
    return estimate.peak_bytes + estimate.allocator_bytes


def planned_runs(config: Config, gap: float) -> list[dict]:
    """The three runs of ``config``: uncapped, capped where zerofit says it fits, capped where
    zerofit says it does not. ``cap_bytes`` is what the allocator may reserve (None: no cap)."""
    estimate = estimate_config(config)
    need = allocator_need_bytes(estimate)
    common = {
        "config": dataclasses.asdict(config),
        "predicted_peak_gib": round(estimate.peak_gib, 3),
        "predicted_phase": estimate.phase,
        "predicted_allocator_need_gib": round(need / GIB, 3),
    }
    return [
        {**common, "kind": "uncapped", "cap_bytes": None},
        {**common, "kind": "fits", "cap_bytes": int(need * (1 + gap))},
        {**common, "kind": "oom", "cap_bytes": int(estimate.peak_bytes * (1 - gap))},
    ]


# ---------------------------------------------------------------- one run, in its own process


def _training_model(config: dict, device: str, model_config: dict | None):
    """A random-init causal LM of the built-in shape (or ``model_config``), bf16, on ``device``."""
    import torch
    import transformers

    from zerofit.models.resolve import builtin_config

    fields = dict(model_config or builtin_config(config["shape"]))
    model_type = fields.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **fields, use_cache=False)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    if config["gc"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, hf_config.vocab_size


def _deepspeed_config(config: dict) -> dict:
    """The calibration runs' DeepSpeed JSON with this run's stage, micro batch and offload."""
    ds = {k: v for k, v in json.loads(DS_CONFIG.read_text()).items() if not k.startswith("_")}
    ds["train_micro_batch_size_per_gpu"] = config["mbs"]
    ds["zero_optimization"] = {**ds["zero_optimization"], "stage": config["stage"]}
    if config["offload"] != "none":
        offload = {"device": config["offload"], "pin_memory": True}
        ds["zero_optimization"]["offload_optimizer"] = offload
    return ds


def _train_with_deepspeed(model, vocab: int, config: dict, device: str, progress: dict) -> float:
    """The calibration runs' loop: a client torch AdamW handed to ``deepspeed.initialize``."""
    import deepspeed
    import torch

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=_deepspeed_config(config)
    )
    for _ in range(STEPS):
        start = time.perf_counter()
        ids = torch.randint(0, vocab, (config["mbs"], config["seq"]), device=device)
        progress["phase"] = "forward"
        loss = engine(input_ids=ids, labels=ids).loss
        progress["phase"] = "backward"
        engine.backward(loss)
        progress["phase"] = "step"
        engine.step()
        if device == "cuda":
            torch.cuda.synchronize()
        progress["step_s"].append(round(time.perf_counter() - start, 3))
    return float(loss.detach().float())


def _train_with_trainer(model, vocab: int, config: dict, device: str, progress: dict) -> float:
    """``transformers.Trainer.train()`` with its defaults (its default ``optim``, max_grad_norm
    1.0) on equal-length random rows, one process, no DeepSpeed."""
    import tempfile

    import torch
    import transformers

    class StepTimes(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            progress["step_s"].append(round(time.perf_counter() - self.start, 3))

    ids = torch.randint(0, vocab, (config["mbs"] * STEPS, config["seq"]))
    rows = [{"input_ids": row, "labels": row} for row in ids]
    with tempfile.TemporaryDirectory() as output_dir:
        args = transformers.TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=config["mbs"],
            max_steps=STEPS,
            bf16=True,  # optim left at the Trainer's default, as zerofit's hf stack assumes
            save_strategy="no",
            report_to=[],
            logging_steps=1,
            dataloader_num_workers=0,
            use_cpu=device != "cuda",
        )
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=rows, callbacks=[StepTimes()]
        )
        progress["phase"] = "train"  # the Trainer's phases are not told apart
        output = trainer.train()
    return float(output.training_loss)


def run_one(run: dict, device: str = "cuda", model_config: dict | None = None) -> dict:
    """Train ``run["config"]`` for STEPS steps in this process and say how it ended.

    ``device="cpu"`` runs the same code without memory readings (the test suite's check that
    this script still works with the installed libraries; set DS_ACCELERATOR=cpu)."""
    import torch

    config, cap = run["config"], run.get("cap_bytes")
    on_gpu = device == "cuda"
    result = {"kind": run["kind"], "config": config, "cap_gib": cap and round(cap / GIB, 3)}
    if on_gpu:
        torch.cuda.set_device(0)
        free, total = torch.cuda.mem_get_info()
        result["device_used_before_model_gib"] = round((total - free) / GIB, 3)
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(cap / total)
    progress = {"phase": "init", "step_s": []}
    train = _train_with_trainer if config.get("client") == "trainer" else _train_with_deepspeed
    try:
        model, vocab = _training_model(config, device, model_config)
        loss = train(model, vocab, config, device, progress)
        result.update(outcome="ran", loss=loss, step_s=progress["step_s"])
    except RuntimeError as err:
        # torch.OutOfMemoryError from the caching allocator; a kernel or NCCL that fails its own
        # allocation raises a plain RuntimeError naming it
        if not isinstance(err, torch.OutOfMemoryError) and "out of memory" not in str(err):
            raise
        result.update(outcome="oom", phase=progress["phase"], step_s=progress["step_s"])
        result["error"] = str(err)[:300]
    if on_gpu:
        free, total = torch.cuda.mem_get_info()
        result.update(
            peak_alloc_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
            peak_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3),
            device_used_end_gib=round((total - free) / GIB, 3),
        )
    return result


def launch_run(run: dict, timeout_s: float, env: dict | None = None) -> dict:
    """``run_one`` in a fresh Python process; a crash or timeout is an outcome of its own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(run)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env or dict(os.environ)
        )
    except subprocess.TimeoutExpired:
        return {"kind": run["kind"], "config": run["config"], "outcome": "timeout"}
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER + " "):
            return json.loads(line[len(MARKER) + 1 :])
    tail = (proc.stdout + proc.stderr)[-2000:]
    return {"kind": run["kind"], "config": run["config"], "outcome": "crashed", "log": tail}


# ---------------------------------------------------------------- judging and reporting


def judge(run: dict, result: dict) -> dict:
    """One run's line: the plan, what happened, and whether zerofit was right about it."""
    line = {**run, **result}
    line.pop("cap_bytes", None)
    outcome = result.get("outcome")
    if run["kind"] == "fits":
        line["verdict_right"] = outcome == "ran"
    elif run["kind"] == "oom":
        line["verdict_right"] = outcome == "oom"
    elif outcome == "ran" and result.get("peak_alloc_gib"):
        line["peak_error"] = round(run["predicted_peak_gib"] / result["peak_alloc_gib"] - 1, 4)
    return line


def summarize(lines: list[dict]) -> dict:
    """The calibration error of the uncapped runs and the verdict counts of the capped ones."""
    errors = [line["peak_error"] for line in lines if "peak_error" in line]
    summary = {
        "points": len(errors),
        "max_abs_error": max((abs(e) for e in errors), default=None),
        "most_under": min(errors, default=None),
    }
    for kind in ("fits", "oom"):
        judged = [line for line in lines if line["kind"] == kind and line["outcome"] in ENDINGS]
        summary[kind] = {
            "right": sum(line["verdict_right"] for line in judged),
            "judged": len(judged),
        }
    summary["not_judged"] = [
        f"{Config(**line['config']).name} {line['kind']}: {line['outcome']}"
        for line in lines
        if line["outcome"] not in ENDINGS
    ]
    return summary


def render_summary(summary: dict) -> str:
    """The summary as the lines an issue note quotes."""
    out = [f"held-out points run uncapped: {summary['points']}"]
    if summary["points"]:
        out.append(
            f"  max |error| {summary['max_abs_error']:.1%}, most under {summary['most_under']:+.1%}"
            "  (target: max |error| <= 2 %, none under -1 %)"
        )
    fits, oom = summary["fits"], summary["oom"]
    out.append(
        f"capped at zerofit's allocator need + gap (predicted to fit): ran {fits['right']}"
        f"/{fits['judged']} (every one must)"
    )
    out.append(
        f"capped at zerofit's peak - gap (predicted not to fit): OOM {oom['right']}"
        f"/{oom['judged']} (every one must)"
    )
    out.extend(f"not judged: {entry}" for entry in summary["not_judged"])
    return "\n".join(out)


def render_plan(runs: list[dict]) -> str:
    """What a GPU run would do, one line per run (``--dry-run``)."""
    out = []
    for run in runs:
        cap = "no cap" if run["cap_bytes"] is None else f"cap {run['cap_bytes'] / GIB:7.3f} GiB"
        out.append(
            f"{Config(**run['config']).name:60} {run['kind']:8} {cap:18} zerofit peak "
            f"{run['predicted_peak_gib']:7.3f} GiB ({run['predicted_phase']})"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write one JSON line per run here")
    parser.add_argument("--gap", type=float, default=0.03, help="cap distance from the estimate")
    parser.add_argument("--budget-s", type=float, default=540, help="stop launching runs after")
    parser.add_argument("--run-timeout-s", type=float, default=300)
    parser.add_argument(
        "--configs",
        help="comma-separated GRID indices to run (default: all), e.g. to finish a "
        "grid that one call's time limit cut short",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one run, as JSON (launch_run)
    args = parser.parse_args(argv)

    if args.child:
        run = json.loads(args.child)
        print(MARKER, json.dumps(run_one(run, run.get("device", "cuda"), run.get("model"))))
        return 0
    chosen = range(len(GRID))
    if args.configs:
        chosen = [int(i) for i in args.configs.split(",") if i.strip().isdigit()]
        if not chosen or max(chosen) >= len(GRID):
            parser.error(f"--configs: give indices from 0 to {len(GRID) - 1}, e.g. --configs 6,7")
    runs = [run for i in chosen for run in planned_runs(GRID[i], args.gap)]
    if args.dry_run:
        print(render_plan(runs))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_oom_boundary: needs a CUDA GPU (--dry-run shows the plan)", file=sys.stderr)
        return 2
    start, lines = time.monotonic(), []
    sink = open(args.out, "w", encoding="utf-8") if args.out else None
    for port, run in enumerate(runs, start=29533):
        if time.monotonic() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: {len(runs) - len(lines)} runs not run")
            break
        env = dict(os.environ, MASTER_PORT=str(port))
        line = judge(run, launch_run(run, args.run_timeout_s, env))
        lines.append(line)
        print(json.dumps(line), flush=True)
        if sink:
            sink.write(json.dumps(line) + "\n")
            sink.flush()
    if sink:
        sink.close()
    print(render_summary(summarize(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
