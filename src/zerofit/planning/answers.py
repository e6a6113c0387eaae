"""Answers: everything the user decides (wizard, flags or answers.yaml), validated; its YAML.

``Answers`` is a frozen pydantic dataclass: every way of making one (``Answers(...)``,
``Answers.replace``, ``dataclasses.replace``, ``answers_from_dict``, ``load_answers``) runs the same
validation. The field types hold the choices (``Literal``) and the ranges (``Field(ge=, le=)``);
``Answers.check_combinations`` holds the rules between fields; ``error_from_pydantic`` turns
pydantic's first complaint into the one-line ``field: problem (fix: ...)`` users see.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from zerofit.addresses import check_address
from zerofit.errors import ZerofitError

# the memory model owns what it can estimate: one list each, not a copy here
from zerofit.memory.lora import FINETUNING, MAX_LORA_RANK, check_lora_targets
from zerofit.memory.losses import LOSS_KERNELS
from zerofit.memory.optimizers import OPTIMIZERS, STACKS

WORKLOADS = ("sft", "dpo", "grpo")
PRECISIONS = ("bf16", "fp16", "fp32")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
LAUNCHERS = ("accelerate", "torchrun", "env", "slurm", "deepspeed")
FLAVOURS = ("explicit", "auto")
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
WEIGHTS_DTYPES = ("fp32", "bf16")
# the GPUs' link inside a node: "auto" is the catalog GPU's usual one (hardware.GpuSpec)
INTERCONNECTS = ("auto", "nvlink", "pcie")

# The same choices as types: a tuple subscript lists its items, Literal[("a", "b")] is
# Literal["a", "b"], so the tuples above stay the one list.
Workload = Literal[WORKLOADS]
Precision = Literal[PRECISIONS]
OffloadDevice = Literal[OFFLOAD_DEVICES]
Launcher = Literal[LAUNCHERS]
Flavour = Literal[FLAVOURS]
Attention = Literal[ATTENTION]
WeightsDtype = Literal[WEIGHTS_DTYPES]
Interconnect = Literal[INTERCONNECTS]
Stack = Literal[STACKS]
Optimizer = Literal[OPTIMIZERS]
LossKernel = Literal[LOSS_KERNELS]
Finetuning = Literal[FINETUNING]

# Upper bounds of every count and size: generous for any real job, and small enough that nothing
# downstream loops or allocates without end on a typo (100000000 GPUs per node once planned for
# 10 minutes and grew past 3.9 GB). The error names the bound and the reason below.
MAX_GPUS_PER_NODE = 64
MAX_NODES = 4096
MAX_SEQ_LEN = 1_048_576
MAX_GLOBAL_BATCH = 1_048_576
MAX_MICRO_BATCH = 4096
MAX_NUM_GENERATIONS = 1024
MAX_STEPS_PER_GENERATION = 4096
MAX_HOST_RAM_GIB = 65536.0
MAX_INTER_NODE_GBPS = 100_000.0
MAX_INTRA_NODE_GBPS = 10_000.0
MAX_DATASET_TOKENS = 10**15
MAX_DATASET_SAMPLES = 10**12
MAX_EPOCHS = 1000.0
BOUND_REASONS = {
    "gpus_per_node": "GPUs in one machine; the largest servers hold 8-16",
    "num_nodes": "4096 nodes of 8 GPUs are twice the largest published training run, 16k GPUs",
    "seq_len": "1M tokens, the longest context models are trained at",
    "completion_len": "part of seq_len, at most 1M tokens",
    "target_len": "an encoder-decoder's target tokens, at most 1M like seq_len",
    "global_batch": "sequences per optimizer step; 1M is beyond any published batch",
    "micro_batch": "sequences per GPU per forward; 4096 overflows any GPU at a useful length",
    "num_generations": "completions per prompt; GRPO runs use 8-64",
    "steps_per_generation": "micro batches generated at once; 4096 is far past any accumulation",
    "host_ram_gib": "GiB of RAM per node; the largest single machines hold 32-48 TiB",
    "inter_node_gbps": "Gbit/s per node; a DGX's eight 400G ports are 3,200",
    "intra_node_gbps": "GB/s per GPU one way; NVLink 5 is 900",
    "dataset_tokens": "tokens per epoch; 10^15 is 25x the largest published pretraining set",
    "dataset_samples": "samples per epoch; 10^12 is past any fine-tuning set",
    "avg_seq_len": "tokens per sample, at most 1M",
    "epochs": "passes over the data; fine-tuning runs use 1-10",
    "lora_rank": "the adapter's rank; published runs use 4-256, 4096 is past any useful rank",
}
# Ranges that are not counts: what to use instead (these messages predate the model; tests pin them)
_RANGE_FIXES = {
    "main_process_port": "use 1-65535",
    "headroom": "use a fraction in 0.1-1.0",
    "vllm_gpu_memory_utilization": "use a fraction between 0 and 1, e.g. 0.3 (TRL's default)",
    "safety_margin_gib": "use 0-64 GiB",
    "lora_dropout": "use a probability from 0 up to (not including) 1, e.g. 0.05 (TRL's default)",
}
# Sizes that are not counts, at or below zero: what to give instead
_POSITIVE_FIXES = {
    "host_ram_gib": "give the node's RAM in GiB",
    "inter_node_gbps": "give the network of one node in Gbit/s, e.g. 100",
    "intra_node_gbps": "give the GPUs' link in GB/s per GPU one way, e.g. 32 for PCIe Gen4 x16",
    "epochs": "give the passes over the data, e.g. 1 or 0.5",
}


def _refuse_bool(value: Any) -> Any:
    """YAML's true/false are not the numbers 1/0 (pydantic's lax int and float would take them)."""
    if isinstance(value, bool):
        raise PydanticCustomError("bool_as_number", "true/false where a number belongs")
    return value


def _single_line(value: str) -> str:
    """Names and paths go into YAML, JSON and shell scripts: no newline, tab or other control."""
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise PydanticCustomError("control_character", "a control character in text")
    return value


def _main_address(value: str) -> str:
    """The same rule as `zerofit launch` (zerofit.addresses): an IP address or a hostname."""
    return check_address("main_process_ip", value)


Number = BeforeValidator(_refuse_bool)
Text = Annotated[str, AfterValidator(_single_line)]


def default_flavour(stack: str) -> str:
    """The DeepSpeed JSON flavour the stack's client runs unchanged.

    ``hf``: "auto". The HF Trainer (TRL's trainers are subclasses) fills each "auto" from its
    TrainingArguments and stops on every explicit value that differs from them: transformers'
    integrations/deepspeed.py, ``HfTrainerDeepSpeedConfig.trainer_config_process`` calls
    ``fill_match`` on train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size,
    gradient_clipping, fp16/bf16.enabled and the optimizer's params, and
    ``trainer_config_finalize`` raises "Please correct the following DeepSpeed config values that
    mismatch TrainingArguments values". Explicit numbers only run when every argument matches.
    ``accelerate`` and ``deepspeed``: "explicit". ``deepspeed.initialize`` takes no "auto", and a
    plain accelerate loop then runs the batch and precision the plan counted without repeating them.
    """
    return "auto" if stack == "hf" else "explicit"


@dataclass(
    frozen=True,
    config=ConfigDict(
        extra="forbid",  # an unknown field is an error (error_from_pydantic names the near one)
        coerce_numbers_to_str=True,  # `model: 7` or `main_process_ip: 10` in YAML are text
        allow_inf_nan=False,  # `--host-ram-gib inf` is not a size
    ),
)
class Answers:
    """What the user decided. ``None`` on a training knob means "let the planner choose"."""

    # --- what to train, where
    model: Text = "qwen2.5-0.5b"  # built-in name, config.json path, model dir, or hub id
    gpu: Text = "H100-SXM"  # hardware.CATALOG key or alias
    gpus_per_node: Annotated[int, Number, Field(ge=1, le=MAX_GPUS_PER_NODE)] = 1
    num_nodes: Annotated[int, Number, Field(ge=1, le=MAX_NODES)] = 1
    # --- workload
    workload: Workload = "sft"
    # tokens per sequence (grpo: prompt + completion)
    seq_len: Annotated[int, Number, Field(ge=1, le=MAX_SEQ_LEN)] = 2048
    # encoder-decoder models (T5): tokens per target sequence, the decoder's and the loss's
    # length (seq_len is the encoder's); None: as long as seq_len (planner.check_target_len)
    target_len: Annotated[int, Number, Field(ge=1, le=MAX_SEQ_LEN)] | None = None
    # sequences per optimizer step, all GPUs; None: micro × world
    global_batch: Annotated[int, Number, Field(ge=1, le=MAX_GLOBAL_BATCH)] | None = None
    precision: Precision | None = None  # None: bf16 where the GPU has it, else fp16
    # grpo: completions per prompt
    num_generations: Annotated[int, Number, Field(ge=1, le=MAX_NUM_GENERATIONS)] = 8
    # grpo: generated tokens per completion (part of seq_len)
    completion_len: Annotated[int, Number, Field(ge=1, le=MAX_SEQ_LEN)] = 256
    reference_model: StrictBool | None = None  # None: dpo yes, grpo no (beta = 0), sft no
    attention: Attention = "sdpa"
    # micro batches padded to their longest sequence (an attention mask with zeros); None: what
    # the collators do (planner.pads_batches); False: packed, padding-free or equal-length rows
    padding: StrictBool | None = None
    # --- the training stack (memory/optimizers.py, memory/losses.py derive what each implies)
    stack: Stack = "hf"  # hf (Trainer/TRL/LLaMA-Factory) | accelerate | deepspeed
    optimizer: Optimizer | None = None  # None: what the stack runs (hf: adamw_torch_fused)
    # None: what the stack runs (hf stack: TRL's trl_logps for grpo, full logits otherwise);
    # hf (full fp32 logits) | liger | trl_fused (TRL >= 1.16's trainers) | trl_logps (TRL 0.14-1.15)
    loss_kernel: LossKernel | None = None
    precompute_ref: StrictBool = False  # dpo: precompute_ref_log_probs (no reference model)
    # grpo: colocated vLLM's share of the GPU
    vllm_gpu_memory_utilization: Annotated[float, Number, Field(gt=0.0, lt=1.0)] | None = None
    # grpo: None = gradient accumulation steps
    steps_per_generation: (
        Annotated[int, Number, Field(ge=1, le=MAX_STEPS_PER_GENERATION)] | None
    ) = None
    # host RAM per node; None: this node's MemTotal
    host_ram_gib: Annotated[float, Number, Field(gt=0.0, le=MAX_HOST_RAM_GIB)] | None = None
    # stage 0 (no DeepSpeed): dtype the weights are loaded in; None: fp32 (TRL's and our recipes')
    weights_dtype: WeightsDtype | None = None
    # stage 0 (no DeepSpeed): the forward runs under torch.autocast (the HF Trainer, TRL and
    # accelerate with mixed precision); False: a plain loop computing in the weights' dtype
    autocast: StrictBool = True
    # --- overrides of the planner's decisions
    stage: Annotated[int, Number, Field(ge=0, le=3)] | None = None
    offload_optimizer: OffloadDevice | None = None
    offload_param: OffloadDevice | None = None
    gradient_checkpointing: StrictBool | None = None
    micro_batch: Annotated[int, Number, Field(ge=1, le=MAX_MICRO_BATCH)] | None = None
    nvme_path: Text | None = None
    # offload buffers in page-locked host RAM (DeepSpeed's offload ``pin_memory``); None: pinned,
    # unless the node's RAM only holds them unpinned (memory/pinned.py: pinning rounds each block
    # up to a power of two)
    pin_memory: StrictBool | None = None
    # --- output and launch
    # explicit numbers, or "auto" for HF Trainer / TRL; None: the stack's (default_flavour)
    flavour: Flavour | None = None
    optimizer_block: StrictBool = False  # write a DeepSpeed `optimizer` block (AdamW) into the JSON
    launcher: Launcher = "accelerate"
    main_process_ip: Annotated[str, AfterValidator(_main_address)] = "127.0.0.1"
    main_process_port: Annotated[int, Number, Field(ge=1, le=65535)] = 29500
    # fraction of GPU memory a plan may use
    headroom: Annotated[float, Number, Field(ge=0.1, le=1.0)] = 1.0
    # kept free on top of every modelled term (overheads.py)
    safety_margin_gib: Annotated[float, Number, Field(ge=0.0, le=64.0)] = 1.0
    # --- speed: the network a step's collectives cross, and the run's length
    # the GPUs' link inside a node: auto (the catalog GPU's usual link), nvlink, or pcie
    interconnect: Interconnect = "auto"
    # Gbit/s per node between nodes (as NICs are sold); None: --cluster-facts, else
    # speed.step_time.DEFAULT_INTER_NODE_GBITS (100). Only matters on more than one node.
    inter_node_gbps: Annotated[float, Number, Field(gt=0.0, le=MAX_INTER_NODE_GBPS)] | None = None
    # GB/s (bytes) per GPU, one direction, inside a node when measured (--cluster-facts);
    # None: what ``interconnect`` implies (planner.intra_node_link)
    intra_node_gbps: Annotated[float, Number, Field(gt=0.0, le=MAX_INTRA_NODE_GBPS)] | None = None
    # the data one epoch trains on: tokens, or samples of an average length (planner.run_steps)
    dataset_tokens: Annotated[int, Number, Field(ge=1, le=MAX_DATASET_TOKENS)] | None = None
    dataset_samples: Annotated[int, Number, Field(ge=1, le=MAX_DATASET_SAMPLES)] | None = None
    avg_seq_len: Annotated[int, Number, Field(ge=1, le=MAX_SEQ_LEN)] | None = None
    epochs: Annotated[float, Number, Field(gt=0.0, le=MAX_EPOCHS)] = 1.0
    # --- parameter-efficient fine-tuning (memory/lora.py): full | lora | qlora (PEFT adapters
    # on a frozen base; qlora: the base in bitsandbytes 4-bit NF4 with double quantization).
    # Rank and dropout default to TRL's ModelConfig (lora_r 16, lora_dropout 0.05)
    finetuning: Finetuning = "full"
    lora_rank: Annotated[int, Number, Field(ge=1, le=MAX_LORA_RANK)] = 16
    # all-linear (every linear layer but the LM head), attention, or module names "q_proj,v_proj"
    lora_targets: Text = "all-linear"
    lora_dropout: Annotated[float, Number, Field(ge=0.0, lt=1.0)] = 0.05

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def replace(self, **changes: Any) -> Answers:
        """A validated copy with ``changes`` applied (a new stack brings its own flavour, unless
        the flavour differs from the old stack's default: see answers_to_dict)."""
        return answers_from_dict({**answers_to_dict(self), **changes})

    @model_validator(mode="wrap")
    @classmethod
    def _one_line_errors(cls, data: Any, handler: Any) -> Answers:
        """Every pydantic complaint as today's ZerofitError (the first one, like before)."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise error_from_pydantic(exc.errors(include_url=False)[0]) from None

    @model_validator(mode="after")
    def check_combinations(self) -> Answers:
        """The rules between fields; fills ``flavour`` from the stack when it was not given."""
        check_workload(self)
        check_hardware(self)
        if self.flavour is None:
            # frozen: the one write, before anyone holds the object
            object.__setattr__(self, "flavour", default_flavour(self.stack))
        return self


# the allowed values of each choice field (the CLI's flags take them too)
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
    "interconnect": INTERCONNECTS,
    "finetuning": FINETUNING,
}
# answers.yaml / answers_from_dict keys that name a field another way
KEY_ALIASES = {"flavor": "flavour"}


def check_workload(a: Answers) -> None:
    """Rules between the workload's fields; ZerofitError naming the first broken one."""
    if a.weights_dtype == "bf16" and a.precision in ("fp16", "fp32"):
        raise ZerofitError(
            "weights_dtype",
            f"bf16 weights cannot train in {a.precision}",
            "set precision bf16, or weights_dtype fp32",
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
    check_dataset(a)
    check_lora_targets(a.lora_targets)
    if not a.model.strip():
        raise ZerofitError(
            "model",
            "is empty",
            "give a built-in name, a config.json, a model directory or a hub id",
        )


def check_dataset(a: Answers) -> None:
    """The run's length is given one way: tokens, or samples (of an average length)."""
    if a.dataset_tokens is not None and a.dataset_samples is not None:
        raise ZerofitError(
            "dataset_samples",
            "given together with dataset_tokens",
            "give the dataset's size once: --dataset-tokens, or --dataset-samples "
            "with --avg-seq-len",
        )
    if a.avg_seq_len is not None and a.dataset_samples is None:
        raise ZerofitError(
            "avg_seq_len",
            "given without dataset_samples",
            "add --dataset-samples N, or give --dataset-tokens instead",
        )


def check_hardware(a: Answers) -> None:
    """Rules between the answers and the machine: the GPU exists and runs the precision, nvme
    offload has a path."""
    if "nvme" in (a.offload_optimizer, a.offload_param) and not a.nvme_path:
        raise ZerofitError(
            "nvme_path", "offload to nvme needs a path", "pass --nvme-path /local_nvme"
        )
    # local: keeps this module importable without the catalog
    from zerofit.hardware import is_hopper, lookup

    gpu = lookup(a.gpu)
    if a.attention == "flash_attention_3" and not is_hopper(gpu.key):
        raise ZerofitError(
            "attention",
            f"flash_attention_3 runs on Hopper GPUs only (H100, H200, H800, H20), not {gpu.name}",
            "use --attention flash_attention_2",
        )
    if a.precision == "bf16" and not gpu.bf16:
        # DeepSpeed would stop at start-up (no bf16 kernels before Ampere); the wizard re-asks this
        raise ZerofitError(
            "precision",
            f"bf16 is not supported by {gpu.name}",
            "use --precision fp16 (loss scaling) or fp32, or a GPU with bf16 (A100 or newer)",
        )


def error_from_pydantic(error: dict[str, Any]) -> ZerofitError:
    """pydantic's first error (``ValidationError.errors()[0]``) as ``field: problem (fix: ...)``."""
    name = str(error["loc"][0]) if error["loc"] else "answers"
    value, kind, ctx = error.get("input"), error["type"], error.get("ctx") or {}
    if kind == "unexpected_keyword_argument":
        return unknown_answer(name)
    if kind == "literal_error":
        choices = ", ".join(CHOICES[name])
        return ZerofitError(name, f"{value!r} is not allowed", f"use one of {choices}")
    if name == "stage":
        return ZerofitError("stage", f"{value!r} is not a ZeRO stage", "use 0, 1, 2 or 3")
    if kind in ("bool_type", "bool_parsing"):
        return ZerofitError(name, f"{value!r} is not true/false", f"set {name}: true or false")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return ZerofitError(name, f"{value!r} is not an integer", f"set {name} to a whole number")
    if kind in ("float_type", "float_parsing", "bool_as_number"):
        return ZerofitError(name, f"{value!r} is not a number", f"set {name} to a number")
    if kind == "finite_number":
        return ZerofitError(name, f"{value} is not a finite number", f"set {name} to a number")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return _range_error(name, value, kind, ctx)
    if kind == "control_character":
        return ZerofitError(
            name, f"{value!r} contains a control character", "write it on one line, without tabs"
        )
    if kind == "string_type":
        return ZerofitError(name, f"{value!r} is not text", f"set {name} to a string")
    return ZerofitError(name, f"{value!r}: {error['msg']}", "see `zerofit config --help`")


def _range_error(name: str, value: Any, kind: str, ctx: dict[str, Any]) -> ZerofitError:
    """An out-of-range number, in the words each field has always used; upper bounds say why."""
    if name in _RANGE_FIXES:
        return ZerofitError(name, f"{value!r} is out of range", _RANGE_FIXES[name])
    if kind.startswith("less_than"):
        limit = ctx.get("le", ctx.get("lt"))
        limit = int(limit) if float(limit).is_integer() else limit  # 65536, not 65536.0
        return ZerofitError(
            name,
            f"{value} is above the limit of {limit}",
            f"use at most {limit}: {BOUND_REASONS[name]}",
        )
    if name in _POSITIVE_FIXES:
        return ZerofitError(name, f"{value!r} must be positive", _POSITIVE_FIXES[name])
    return ZerofitError(name, f"{value!r} must be a positive integer", f"set {name} to 1 or more")


def unknown_answer(key: Any) -> ZerofitError:
    """A key that is no Answers field, with the field it most likely means."""
    known = [f.name for f in dataclasses.fields(Answers)]
    spelled = str(key).replace("_", "").replace("-", "").lower()
    near = [k for k in known if k.replace("_", "") == spelled]
    return ZerofitError(
        str(key),
        "is not a known answer",
        f"did you mean {near[0]}?" if near else "remove it; known: " + ", ".join(known),
    )


def answers_from_dict(data: dict[str, Any]) -> Answers:
    """Build validated Answers from a mapping (answers.yaml or CLI flags); unknown keys are errors.

    ``flavor`` is accepted for ``flavour`` (KEY_ALIASES); giving both is an error when they differ.
    """
    if not isinstance(data, dict):
        raise ZerofitError(
            "answers", "must be a mapping of field: value", "see `zerofit config --help`"
        )
    known = {f.name for f in dataclasses.fields(Answers)}
    clean: dict[str, Any] = {}
    for key, value in data.items():
        name = KEY_ALIASES.get(key, key)
        if name not in known:
            raise unknown_answer(key)
        earlier = clean.get(name)
        if earlier is not None and value is not None and earlier != value:
            raise ZerofitError(
                str(key), f"given twice, as {value!r} and {earlier!r}", "keep one of them"
            )
        clean[name] = earlier if value is None else value
    return Answers(**clean)


def answers_to_dict(a: Answers) -> dict[str, Any]:
    """Plain mapping of every field, in declaration order (the wizard's and the flags' base).

    ``flavour`` is None when it is the stack's default (default_flavour), so a mapping that then
    changes the stack (the wizard's stack question, ``--answers FILE --stack deepspeed``) gets the
    new stack's flavour; a flavour chosen against the stack's default is kept.
    """
    data = {f.name: getattr(a, f.name) for f in dataclasses.fields(Answers)}
    if a.flavour == default_flavour(a.stack):
        data["flavour"] = None
    return data


def render_answers(a: Answers) -> str:
    """answers.yaml text; `zerofit config --answers answers.yaml` reproduces the same files.

    The flavour is written as decided, under its documented spelling ``flavor``.
    """
    import yaml

    data = {
        ("flavor" if name == "flavour" else name): (a.flavour if name == "flavour" else value)
        for name, value in answers_to_dict(a).items()
    }
    header = "# zerofit answers: re-run with `zerofit config --answers answers.yaml --out DIR`\n"
    return header + yaml.safe_dump(data, sort_keys=False)


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
