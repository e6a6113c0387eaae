"""build_accelerate_config(plan) -> accelerate's YAML as a dict (ClusterConfig keys verbatim).

Facts this follows (accelerate 1.15, read from its source and tried):

* ``num_processes`` is the TOTAL across all machines (users often write per-node counts).
* With ``deepspeed_config_file``, ``accelerate launch`` refuses a YAML that also sets
  ``mixed_precision`` or DeepSpeed knobs such as ``zero_stage`` ("the following accelerate config
  variables will be ignored"), so precision lives in the DeepSpeed JSON only.
* ``deepspeed_config_file`` is opened by the training processes relative to their working
  directory (where ``accelerate launch`` ran), not relative to the YAML file. `zerofit config`
  therefore writes an absolute path; the shipped presets (relative to the repository root) say so.
* ``accelerate launch`` without ``--config_file`` reads ``default_config.yaml`` in
  ``$HF_HOME/accelerate`` (``HF_HOME`` defaults to ``$XDG_CACHE_HOME/huggingface``, then
  ``~/.cache/huggingface``): accelerate ``commands/config/config_args.py``
  (``default_config_file``).
* accelerate's default multi-node DeepSpeed launcher is pdsh (needs ssh + a hostfile); the
  ``standard`` launcher is torchrun on every node, started by you or your scheduler.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

DS_CONFIG_FILE = "ds_config.json"
DEFAULT_CONFIG_NAME = "default_config.yaml"


def default_config_path(environ: Mapping[str, str]) -> str:
    """Where ``accelerate launch`` looks without ``--config_file`` (the same rule as accelerate).

    accelerate ``commands/config/config_args.py``: ``HF_HOME`` or ``$XDG_CACHE_HOME/huggingface``
    (``~/.cache/huggingface``), then ``accelerate/default_config.yaml``.
    """
    cache = environ.get("XDG_CACHE_HOME", "~/.cache")
    hf_home = environ.get("HF_HOME", os.path.join(cache, "huggingface"))
    home = environ.get("HOME")
    if hf_home.startswith("~") and home:  # expanduser, but from the given environment
        hf_home = home + hf_home[1:]
    return os.path.join(os.path.expanduser(hf_home), "accelerate", DEFAULT_CONFIG_NAME)


def build_accelerate_config(
    plan, ds_config_file: str = DS_CONFIG_FILE, machine_rank: int = 0
) -> dict[str, Any]:
    """The accelerate config for ``plan`` on machine ``machine_rank``.

    Args:
        plan: a ``zerofit.plan.Plan``.
        ds_config_file: path written into ``deepspeed_config_file`` (resolved from the launch
            directory).
        machine_rank: the rank written into the file, 0 … num_nodes-1; every node can share the
            rank-0 file and pass ``--machine_rank`` (see render_machine_rank_lines).
    """
    answers = plan.answers
    nodes = answers.num_nodes
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if plan.stage > 0:
        cfg["distributed_type"] = "DEEPSPEED"
        ds: dict[str, Any] = {
            "deepspeed_config_file": ds_config_file,
            # zero.Init partitions weights while from_pretrained loads them, so
            # no rank ever holds the full model (stage 3 only).
            "zero3_init_flag": plan.stage == 3,
        }
        if nodes > 1:
            ds["deepspeed_multinode_launcher"] = "standard"
        cfg["deepspeed_config"] = ds
    else:
        cfg["distributed_type"] = "MULTI_GPU" if plan.world_size > 1 else "NO"
        cfg["mixed_precision"] = {"bf16": "bf16", "fp16": "fp16"}.get(plan.precision, "no")
        if plan.world_size > 1:
            cfg["gpu_ids"] = "all"
    cfg["machine_rank"] = machine_rank
    cfg["main_training_function"] = "main"
    cfg["num_machines"] = nodes
    cfg["num_processes"] = plan.world_size  # total across machines, not per node
    if nodes > 1:
        cfg["main_process_ip"] = answers.main_process_ip
        cfg["main_process_port"] = answers.main_process_port
        cfg["rdzv_backend"] = "static"  # honours machine_rank: --machine_rank on each node
        cfg["same_network"] = True
    cfg["use_cpu"] = False
    return cfg


def count_words(count: int, noun: str, plural: str | None = None) -> str:
    """``1 process``, ``8 processes``: the count and its noun, singular or plural."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def render_processes_line(plan) -> str:
    """The header's first line: how many processes the file starts, and where."""
    nodes, per_node = plan.answers.num_nodes, plan.answers.gpus_per_node
    return (
        "# accelerate config written by zerofit: "
        f"{count_words(plan.world_size, 'process', 'processes')} in total "
        f"({per_node} per node x {count_words(nodes, 'node')})."
    )


def render_deepspeed_lines(plan, ds_config_file: str) -> list[str]:
    """Header lines naming the DeepSpeed JSON and the precision flag its "auto" needs."""
    if plan.stage == 0:
        return []
    relative = ", opened relative to the directory you launch from"
    where = "" if os.path.isabs(ds_config_file) else relative
    lines = [
        f"# DeepSpeed settings (ZeRO-{plan.stage}, precision, batch sizes) live in "
        f"{ds_config_file}{where}."
    ]
    if plan.answers.flavour == "auto" and plan.precision in ("bf16", "fp16"):
        lines.append(
            f'# Its precision is "auto": pass --{plan.precision} to the HF Trainer / '
            f"TRL, or --mixed_precision {plan.precision} to accelerate launch (else fp32)."
        )
    return lines


TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def quant_storage_dtype(plan) -> str | None:
    """QLoRA under ZeRO-3: the `bnb_4bit_quant_storage` the model must load with (the compute
    dtype), else None. transformers loads a quantized model outside zero.Init
    (modeling_utils.py, PreTrainedModel.get_init_context: `if not is_quantized`), and DeepSpeed
    then partitions the 4-bit weights only when they are stored in a float dtype: peft's guide
    (docs/source/accelerate/deepspeed.md, "Use PEFT QLoRA and DeepSpeed with ZeRO3") and
    transformers' BitsAndBytesConfig docstring (`bnb_4bit_quant_storage`); peft issue 1844."""
    if plan.stage != 3 or plan.answers.finetuning != "qlora":
        return None
    return TORCH_DTYPES.get(plan.precision, "bfloat16")


def render_finetuning_lines(plan) -> list[str]:
    """LoRA / QLoRA under ZeRO-3: what the training script must do for these files to work."""
    if plan.stage != 3 or plan.answers.finetuning == "full":
        return []
    lines = [
        "# LoRA under ZeRO-3: the JSON gathers the 16-bit weights on save, so adapters are not "
        "saved empty;",
        "# load the model without device_map (DeepSpeed places the shards).",
    ]
    storage = quant_storage_dtype(plan)
    if storage:
        lines += [
            "# QLoRA: load with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4',",
            f"#   bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.{storage},",
            f"#   bnb_4bit_quant_storage=torch.{storage}) (TRL: --bnb_4bit_quant_storage "
            f"{storage}): a storage",
            "#   dtype equal to the compute dtype is what lets ZeRO-3 partition the 4-bit weights.",
        ]
    return lines


def render_machine_rank_lines(plan, machine_rank: int) -> list[str]:
    """Multi-node: how every node uses this one file.

    ``accelerate launch`` takes a flag over the file's value (accelerate commands/launch.py,
    ``_validate_launch_command``: a config value fills only the arguments left unset), so each
    node runs the same file and adds its own ``--machine_rank``.
    """
    if plan.answers.num_nodes == 1:
        return []
    return [
        f"# Every node uses this file (it says machine_rank {machine_rank}): on node N run "
        "`accelerate launch --config_file <this file> --machine_rank N ...`,",
        "# or let `zerofit launch --config <this file>` write each node's command.",
    ]


def render_accelerate_config(
    plan, machine_rank: int = 0, ds_config_file: str = DS_CONFIG_FILE
) -> str:
    """accelerate.yaml text for ``machine_rank`` (stable key order, explanatory header)."""
    import yaml

    cfg = build_accelerate_config(plan, ds_config_file=ds_config_file, machine_rank=machine_rank)
    header = [
        render_processes_line(plan),
        *render_deepspeed_lines(plan, ds_config_file),
        *render_finetuning_lines(plan),
        *render_machine_rank_lines(plan, machine_rank),
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(cfg, sort_keys=False)
