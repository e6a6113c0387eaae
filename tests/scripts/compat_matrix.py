"""Compatibility matrix worker: every (config, client) cell in ONE 2-process job, cell after cell.

    python -m torch.distributed.run --nproc_per_node 2 tests/scripts/compat_matrix.py \\
        CELLS.json RESULTS.jsonl

Used by tests/configs/test_compat_matrix.py, which writes CELLS.json (one dict per cell: id, client,
ds, yaml, precision, micro, accum, optimizer) and asserts every line of RESULTS.jsonl. Starting
processes and importing torch/transformers/trl costs ~10-15 s per launch on this machine, so the
clients run here one after another in the same two processes, and the global state accelerate and
transformers keep between runs is reset after each cell (``reset_global_state``).

Clients: ``trainer`` (transformers Trainer), ``sft`` / ``dpo`` / ``grpo`` (TRL), ``accelerate`` (a
plain loop with the environment ``accelerate launch`` derives from the cell's YAML, computed by
accelerate's own launcher functions), ``deepspeed`` (``deepspeed.initialize``), and ``finalize``
(transformers' config-processing steps only: what the Trainer runs on a GPU before the engine, for
precisions the CPU cannot run). Each cell reports what the engine really used; an exception is the
cell's result, never the end of the run.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

SEQ = 16


def reset_global_state() -> None:
    """Forget the previous cell: accelerate's singletons, transformers' ZeRO-3 weakref,
    ACCELERATE_* env."""
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    GradientState._reset_state()
    unset_hf_deepspeed_config()
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        del os.environ[key]
    gc.collect()


def token_rows(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 128, (n, SEQ), generator=g).tolist()
    return [{"input_ids": r, "labels": r} for r in rows]


def training_args(cls, cell: dict, out: str, **extra):
    precision = cell["precision"]
    return cls(
        output_dir=out,
        per_device_train_batch_size=cell["micro"],
        gradient_accumulation_steps=cell["accum"],
        max_steps=2,
        learning_rate=1e-3,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        deepspeed=cell["ds"],
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        use_cpu=not torch.cuda.is_available(),
        **extra,
    )


def engine_facts(engine) -> dict:
    facts = {
        "stage": engine.zero_optimization_stage(),
        "global_steps": engine.global_steps,
        "bf16": bool(engine.bfloat16_enabled()),
        "fp16": bool(engine.fp16_enabled()),
        "micro": engine.train_micro_batch_size_per_gpu(),
        "accum": engine.gradient_accumulation_steps(),
        "train_batch_size": engine.train_batch_size(),
    }
    inner = engine.optimizer
    while hasattr(inner, "optimizer"):
        inner = inner.optimizer
    facts["optimizer"] = type(inner).__name__
    return facts


def run_trainer(cell: dict, out: str, model_dir: str) -> dict:
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    args = training_args(TrainingArguments, cell, out)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir
    )  # after args: zero.Init applies at ZeRO-3
    trainer = Trainer(model=model, args=args, train_dataset=token_rows(64))
    result = trainer.train()
    return dict(engine_facts(trainer.model_wrapped), loss=result.training_loss)


def run_finalize(cell: dict, out: str, model_dir: str) -> dict:
    """transformers' HfTrainerDeepSpeedConfig steps, then DeepSpeed's config class, as on a GPU."""
    from unittest import mock

    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import AutoConfig, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    # TrainingArguments with fp16 on a CPU-only build may refuse; build it as fp32 and set the flag
    # afterwards, exactly what trainer_config_process reads.
    args = training_args(TrainingArguments, dict(cell, precision="fp32"), out)
    args.fp16 = cell["precision"] == "fp16"
    args.bf16 = cell["precision"] == "bf16"
    hf = HfTrainerDeepSpeedConfig(cell["ds"])
    hf.trainer_config_process(args)
    model = type("M", (), {"config": AutoConfig.from_pretrained(model_dir)})()
    hf.trainer_config_finalize(args, model, num_training_steps=2)
    with mock.patch("deepspeed.comm.get_world_size", return_value=dist.get_world_size()):
        cfg = DeepSpeedConfig(hf.config)
    return {
        "stage": cfg.zero_optimization_stage,
        "bf16": cfg.bfloat16_config.enabled,
        "fp16": cfg.float16_config.enabled,
        "micro": cfg.train_micro_batch_size_per_gpu,
        "accum": cfg.gradient_accumulation_steps,
        "train_batch_size": cfg.train_batch_size,
        "global_steps": 0,
    }


def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def run_sft(cell: dict, out: str, model_dir: str) -> dict:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = training_args(SFTConfig, cell, out, max_length=SEQ)
    data = Dataset.from_list(
        [{"text": " ".join(str(i % 100) for i in range(k, k + 12))} for k in range(64)]
    )
    trainer = SFTTrainer(
        model=model_dir, args=args, train_dataset=data, processing_class=tokenizer(model_dir)
    )
    result = trainer.train()
    return dict(engine_facts(trainer.model_wrapped), loss=result.training_loss)


def run_dpo(cell: dict, out: str, model_dir: str) -> dict:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = training_args(DPOConfig, cell, out, max_length=SEQ)
    rows = [
        {"prompt": f"{k} {k + 1} {k + 2}", "chosen": f" {k + 3} {k + 4}", "rejected": f" {k} {k}"}
        for k in range(64)
    ]
    trainer = DPOTrainer(
        model=model_dir,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer(model_dir),
    )
    result = trainer.train()
    return dict(engine_facts(trainer.model_wrapped), loss=result.training_loss)


def digit_reward(completions, **kwargs) -> list[float]:
    return [float(sum(ch.isdigit() for ch in str(c))) for c in completions]


def run_grpo(cell: dict, out: str, model_dir: str) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = training_args(GRPOConfig, cell, out, num_generations=2, max_completion_length=4)
    data = Dataset.from_list([{"prompt": f"{k} {k + 1}"} for k in range(64)])
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=digit_reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer(model_dir),
    )
    result = trainer.train()
    return dict(engine_facts(trainer.model_wrapped), loss=result.training_loss)


def launch_env(cell: dict) -> dict[str, str]:
    """The ACCELERATE_* environment `accelerate launch --config_file YAML` gives its workers.

    Computed by accelerate's own functions (commands/launch.py `_validate_launch_command`,
    utils/launch.py `prepare_deepspeed_cmd_env` / `prepare_multi_gpu_env`), as launch_command does.
    """
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    argv = ["--config_file", cell["yaml"], "--num_processes", str(dist.get_world_size())]
    if cell.get("mixed_precision"):
        argv += ["--mixed_precision", cell["mixed_precision"]]
    args = launch_command_parser().parse_args(argv + ["train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        if mp_from_config:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}


def run_accelerate(cell: dict, out: str, model_dir: str) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    from torch.utils.data import DataLoader, TensorDataset
    from transformers import AutoModelForCausalLM

    env = launch_env(cell)
    os.environ.update(env)
    # A plain DDP config on a machine without CUDA: accelerate's MULTI_GPU state leaves every rank
    # training alone (no DDP wrapper, reduce returns the local value) unless cpu=True selects
    # MULTI_CPU over gloo (accelerate/state.py PartialState.__init__ / _prepare_backend). A CPU
    # user of this YAML must do the same; on GPUs the YAML is used as is.
    ddp_on_cpu = env.get("ACCELERATE_USE_DEEPSPEED") != "true" and not torch.cuda.is_available()
    accelerator = Accelerator(
        cpu=ddp_on_cpu, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")]
    )
    assert accelerator.num_processes == dist.get_world_size()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plugin = accelerator.state.deepspeed_plugin
    accum = plugin.deepspeed_config.get("gradient_accumulation_steps", 1) if plugin else 1
    accum = accum if isinstance(accum, int) else 1
    rows = torch.tensor([r["input_ids"] for r in token_rows(cell["micro"] * accum * 2 * 2)])
    loader = DataLoader(TensorDataset(rows), batch_size=cell["micro"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loss = None
    for (batch,) in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    value = accelerator.reduce(loss.detach().float(), reduction="mean").item()
    if plugin is None:
        # the ranks really train together: DDP wraps the model and syncs its gradients
        assert isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
        return {
            "stage": 0,
            "global_steps": 2,
            "loss": value,
            "bf16": accelerator.mixed_precision == "bf16",
            "fp16": accelerator.mixed_precision == "fp16",
            "optimizer": type(optimizer.optimizer).__name__,
        }
    # the world accelerate saw and the dtype the engine trains its weights in
    return dict(
        engine_facts(model),
        loss=value,
        world=accelerator.num_processes,
        dtype=str(next(model.parameters()).dtype),
    )


def run_deepspeed(cell: dict, out: str, model_dir: str) -> dict:
    import deepspeed
    from transformers import AutoModelForCausalLM

    with open(cell["ds"]) as fh:
        config = json.load(fh)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    optimizer = None
    if cell.get("optimizer") == "client":
        offload = (config.get("zero_optimization", {}).get("offload_optimizer") or {}).get(
            "device", "none"
        )
        if offload != "none":  # what a DeepSpeed user writes with optimizer offload
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(model.parameters(), lr=1e-3)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config=config,
        model_parameters=[p for p in model.parameters()],
    )
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    rows = torch.tensor([r["input_ids"] for r in token_rows(micro * accum * 2)])
    loss = None
    for batch in rows.split(micro):
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
    return dict(engine_facts(engine), loss=loss.item())


CLIENTS = {
    "trainer": run_trainer,
    "finalize": run_finalize,
    "sft": run_sft,
    "dpo": run_dpo,
    "grpo": run_grpo,
    "accelerate": run_accelerate,
    "deepspeed": run_deepspeed,
}


def main() -> None:
    cells_path, results_path = sys.argv[1], sys.argv[2]
    with open(cells_path) as fh:
        spec = json.load(fh)
    # One gloo group for the whole matrix; accelerate / the Trainer / deepspeed all reuse it. The
    # timeout turns a rank left waiting by its failed peer into an error instead of a hang.
    dist.init_process_group("gloo", timeout=timedelta(seconds=spec.get("timeout_s", 120)))
    import deepspeed

    deepspeed.init_distributed("gloo")
    rank = dist.get_rank()
    results = open(results_path, "w") if rank == 0 else None
    for cell in spec["cells"]:
        start = time.perf_counter()
        out = tempfile.mkdtemp(prefix="cell_")
        here = os.getcwd()
        try:
            if cell.get("cwd"):
                os.chdir(cell["cwd"])  # where the user would run `accelerate launch` from
            facts = CLIENTS[cell["client"]](cell, out, spec["model_dir"])
            loss = facts.get("loss")
            if loss is not None and not math.isfinite(loss):
                raise RuntimeError(f"loss {loss} is not finite")
            record = {"id": cell["id"], "ok": True, **facts}
        except Exception as exc:  # noqa: BLE001 - the failure is the cell's result
            lines = [
                text
                for text in traceback.format_exception_only(type(exc), exc)[-1].splitlines()
                if text.strip()
            ]
            record = {
                "id": cell["id"],
                "ok": False,
                "error": (lines[0] if lines else repr(exc))[:500],
            }
        finally:
            os.chdir(here)
        record["secs"] = round(time.perf_counter() - start, 2)
        reset_global_state()
        dist.barrier()  # both ranks finish a cell before the next starts
        if results:
            results.write(json.dumps(record, default=str) + "\n")
            results.flush()
            print(
                f"[matrix] {record['id']}: {'ok' if record['ok'] else 'FAILED ' + record['error']} "
                f"({record['secs']} s)",
                flush=True,
            )
    if results:
        results.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
