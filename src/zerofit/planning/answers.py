"""Answers: everything the user decides (wizard, flags or answers.yaml), validated, and its YAML form."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from zerofit.errors import ZerofitError

# the memory model owns what it can estimate: one list each, not a copy here
from zerofit.memory.losses import LOSS_KERNELS
from zerofit.memory.optimizers import OPTIMIZERS, STACKS

WORKLOADS = ("sft", "dpo", "grpo")
PRECISIONS = ("bf16", "fp16", "fp32")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
LAUNCHERS = ("accelerate", "torchrun", "env", "slurm", "deepspeed")
FLAVOURS = ("explicit", "auto")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
WEIGHTS_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class Answers:
    """What the user decided. ``None`` on a training knob means "let the planner choose"."""

    # --- what to train, where
    model: str = "qwen2.5-0.5b"  # built-in name, config.json path, model dir, or hub id
    gpu: str = "H100-SXM"  # hardware.CATALOG key or alias
    gpus_per_node: int = 1
    num_nodes: int = 1
    # --- workload
    workload: str = "sft"  # sft | dpo | grpo
    seq_len: int = 2048  # tokens per sequence (grpo: prompt + completion)
    global_batch: int | None = None  # sequences per optimizer step, all GPUs; None: micro × world
    precision: str | None = None  # None: bf16 where the GPU has it, else fp16
    num_generations: int = 8  # grpo: completions per prompt
    completion_len: int = 256  # grpo: generated tokens per completion (part of seq_len)
    reference_model: bool | None = None  # None: dpo yes, grpo no (beta = 0), sft no
    attention: str = "sdpa"
    # micro batches padded to their longest sequence (an attention mask with zeros); None: what
    # the collators do (planner.pads_batches); False: packed, padding-free or equal-length rows
    padding: bool | None = None
    # --- the training stack (memory/optimizers.py, memory/losses.py derive what each implies)
    stack: str = "hf"  # hf (Trainer/TRL/LLaMA-Factory) | accelerate | deepspeed
    optimizer: str | None = None  # None: what the stack runs (hf: adamw_torch_fused)
    # None: what the stack runs (hf stack: TRL's trl_logps for grpo, full logits otherwise);
    # hf (full fp32 logits) | liger | trl_fused (TRL >= 1.16's trainers) | trl_logps (TRL 0.14-1.15)
    loss_kernel: str | None = None
    precompute_ref: bool = False  # dpo: precompute_ref_log_probs (no reference model)
    vllm_gpu_memory_utilization: float | None = None  # grpo: colocated vLLM's share of the GPU
    steps_per_generation: int | None = None  # grpo: None = gradient accumulation steps
    host_ram_gib: float | None = None  # host RAM per node; None: this node's MemTotal
    # stage 0 (no DeepSpeed): dtype the weights are loaded in; None: fp32 (TRL's and our recipes')
    weights_dtype: str | None = None
    # --- overrides of the planner's decisions
    stage: int | None = None
    offload_optimizer: str | None = None
    offload_param: str | None = None
    gradient_checkpointing: bool | None = None
    micro_batch: int | None = None
    nvme_path: str | None = None
    # offload buffers in page-locked host RAM (DeepSpeed's offload ``pin_memory``); None: pinned,
    # unless the node's RAM only holds them unpinned (memory/pinned.py: pinning rounds each block
    # up to a power of two)
    pin_memory: bool | None = None
    # --- output and launch
    flavour: str = "explicit"  # explicit numbers, or "auto" for HF Trainer / TRL
    optimizer_block: bool = False  # write a DeepSpeed `optimizer` block (AdamW) into the JSON
    launcher: str = "accelerate"
    main_process_ip: str = "127.0.0.1"
    main_process_port: int = 29500
    headroom: float = 1.0  # fraction of GPU memory a plan may use
    safety_margin_gib: float = 1.0  # kept free on top of every modelled term (overheads.py)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def replace(self, **changes: Any) -> "Answers":
        """A validated copy with ``changes`` applied."""
        return validate_answers(dataclasses.replace(self, **changes))


# the allowed values of each choice field (validate_answers; the CLI's flags take them too)
CHOICES = {
    "workload": WORKLOADS,
    "precision": PRECISIONS,
    "offload_optimizer": OFFLOAD_DEVICES,
    "offload_param": OFFLOAD_DEVICES,
    "launcher": LAUNCHERS,
    "flavour": FLAVOURS,
    "attention": ATTENTION,
    "stack": STACKS,
    "optimizer": OPTIMIZERS,
    "loss_kernel": LOSS_KERNELS,
    "weights_dtype": WEIGHTS_DTYPES,
}
_POSITIVE = (
    "gpus_per_node",
    "num_nodes",
    "seq_len",
    "global_batch",
    "num_generations",
    "completion_len",
    "micro_batch",
    "steps_per_generation",
)


def validate_answers(a: Answers) -> Answers:
    """Check types, choices and ranges; raise ZerofitError naming the first bad field."""
    for name, choices in CHOICES.items():
        value = getattr(a, name)
        if value is not None and value not in choices:
            raise ZerofitError(
                name, f"{value!r} is not allowed", "use one of " + ", ".join(choices)
            )
    for name in _POSITIVE:
        value = getattr(a, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ZerofitError(
                name, f"{value!r} must be a positive integer", f"set {name} to 1 or more"
            )
    if a.stage is not None and a.stage not in (0, 1, 2, 3):
        raise ZerofitError("stage", f"{a.stage!r} is not a ZeRO stage", "use 0, 1, 2 or 3")
    if not 1 <= a.main_process_port <= 65535 or isinstance(a.main_process_port, bool):
        raise ZerofitError(
            "main_process_port", f"{a.main_process_port!r} is out of range", "use 1-65535"
        )
    if not 0.1 <= a.headroom <= 1.0:
        raise ZerofitError(
            "headroom", f"{a.headroom!r} is out of range", "use a fraction in 0.1-1.0"
        )
    if a.vllm_gpu_memory_utilization is not None and not 0.0 < a.vllm_gpu_memory_utilization < 1.0:
        raise ZerofitError(
            "vllm_gpu_memory_utilization",
            f"{a.vllm_gpu_memory_utilization!r} is out of range",
            "use a fraction between 0 and 1, e.g. 0.3 (TRL's default)",
        )
    if a.weights_dtype == "bf16" and a.precision in ("fp16", "fp32"):
        raise ZerofitError(
            "weights_dtype",
            f"bf16 weights cannot train in {a.precision}",
            "set precision bf16, or weights_dtype fp32",
        )
    if a.host_ram_gib is not None and a.host_ram_gib <= 0:
        raise ZerofitError(
            "host_ram_gib", f"{a.host_ram_gib!r} must be positive", "give the node's RAM in GiB"
        )
    if not 0.0 <= a.safety_margin_gib <= 64.0:
        raise ZerofitError(
            "safety_margin_gib", f"{a.safety_margin_gib!r} is out of range", "use 0-64 GiB"
        )
    if a.workload == "grpo" and a.completion_len >= a.seq_len:
        raise ZerofitError(
            "completion_len",
            f"{a.completion_len} leaves no room for a prompt in seq_len {a.seq_len}",
            "raise seq_len or lower completion_len",
        )
    if a.loss_kernel == "trl_logps" and a.workload == "sft":
        raise ZerofitError(
            "loss_kernel",
            "trl_logps is TRL's DPO/GRPO log-prob path (0.14-1.15), not an SFT loss",
            "use --loss-kernel hf, liger or trl_fused (TRL >= 1.16's SFTTrainer) for sft",
        )
    if a.workload == "grpo" and a.num_generations < 2:  # a group of 1: advantages are 0 or NaN
        raise ZerofitError(
            "num_generations",
            f"{a.num_generations} leaves a group nothing to compare",
            "use at least 2, e.g. 8",
        )
    if a.global_batch is not None and a.workload == "grpo" and a.global_batch % a.num_generations:
        raise ZerofitError(
            "global_batch",
            f"{a.global_batch} is not divisible by num_generations {a.num_generations}",
            "use a multiple of num_generations",
        )
    if "nvme" in (a.offload_optimizer, a.offload_param) and not a.nvme_path:
        raise ZerofitError(
            "nvme_path", "offload to nvme needs a path", "pass --nvme-path /local_nvme"
        )
    if not isinstance(a.model, str) or not a.model.strip():
        raise ZerofitError(
            "model",
            "is empty",
            "give a built-in name, a config.json, a model directory or a hub id",
        )
    from zerofit.hardware import (
        lookup,
    )  # local: keeps this module importable without the catalog cost

    gpu = lookup(a.gpu)
    if a.precision == "bf16" and not gpu.bf16:
        # DeepSpeed would stop at start-up (no bf16 kernels before Ampere); the wizard re-asks this
        raise ZerofitError(
            "precision",
            f"bf16 is not supported by {gpu.name}",
            "use --precision fp16 (loss scaling) or fp32, " "or a GPU with bf16 (A100 or newer)",
        )
    return a


def answers_from_dict(data: dict[str, Any]) -> Answers:
    """Build validated Answers from a mapping (answers.yaml or CLI flags); unknown keys are errors."""
    if not isinstance(data, dict):
        raise ZerofitError(
            "answers", "must be a mapping of field: value", "see `zerofit config --help`"
        )
    known = {f.name: f for f in fields(Answers)}
    for key in data:
        if key not in known:
            near = [
                k
                for k in known
                if k.replace("_", "") == str(key).replace("_", "").replace("-", "").lower()
            ]
            raise ZerofitError(
                str(key),
                "is not a known answer",
                f"did you mean {near[0]}?" if near else "remove it; known: " + ", ".join(known),
            )
    clean = {}
    for key, value in data.items():
        expected = known[key].type
        if (
            value is not None
            and "int" in expected
            and "bool" not in expected
            and isinstance(value, str)
        ):
            value = _to_int(key, value)
        if value is not None and "bool" in expected and not isinstance(value, bool):
            raise ZerofitError(key, f"{value!r} is not true/false", f"set {key}: true or false")
        if (
            value is not None
            and "float" in expected
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        ):
            value = float(value)
        if value is not None and expected.startswith("str") and not isinstance(value, str):
            value = str(value)
        if (
            value is not None
            and "int" in expected
            and "bool" not in expected
            and not isinstance(value, int)
        ):
            raise ZerofitError(key, f"{value!r} is not an integer", f"set {key} to a whole number")
        if value is not None and expected.startswith("float") and not isinstance(value, float):
            raise ZerofitError(key, f"{value!r} is not a number", f"set {key} to a number")
        clean[key] = value
    return validate_answers(Answers(**clean))


def _to_int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ZerofitError(
            key, f"{value!r} is not an integer", f"set {key} to a whole number"
        ) from None


def answers_to_dict(a: Answers) -> dict[str, Any]:
    """Plain mapping of every field, in declaration order (what answers.yaml holds)."""
    return {f.name: getattr(a, f.name) for f in fields(Answers)}


def render_answers(a: Answers) -> str:
    """answers.yaml text; `zerofit config --answers answers.yaml` reproduces the same files."""
    import yaml

    header = "# zerofit answers: re-run with `zerofit config --answers answers.yaml --out DIR`\n"
    return header + yaml.safe_dump(answers_to_dict(a), sort_keys=False)


def load_answers(text: str) -> Answers:
    """Parse answers.yaml text into validated Answers."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ZerofitError(
            "answers", f"is not valid YAML ({str(exc).splitlines()[0]})", "fix the YAML syntax"
        ) from None
    return answers_from_dict(data)
