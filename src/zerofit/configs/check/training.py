"""check, the training setup next to the configs: LoRA / QLoRA / pre-quantized models under ZeRO-3.

``zerofit check ds_config.json --training X`` reads how the model is loaded from X: a TRL or
LLaMA-Factory YAML (or a recipe's `--config` YAML), or the training command line itself
(`accelerate launch ... train.py --load_in_4bit ...`, `llamafactory-cli train x.yaml`). One
``TrainingSetup`` comes out whatever the source, and the rules judge it against every ZeRO-3
config in the check:

- QLoRA without `bnb_4bit_quant_storage` equal to the compute dtype: ZeRO-3 leaves uint8 4-bit
  weights whole on every GPU;
- 8-bit bitsandbytes, or a pre-quantized GPTQ/AWQ/... checkpoint (its config.json's
  `quantization_config`), which ZeRO-3 cannot partition;
- `device_map` (transformers refuses it) or `low_cpu_mem_usage`;
- LoRA without `stage3_gather_16bit_weights_on_model_save`: empty adapters on save.
What the stacks set up themselves (LLaMA-Factory's quant storage, the recipes' gathering) is data
in ``facts``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from typing import Any

from zerofit.configs.check.facts import (
    DTYPE_NAMES,
    LLAMAFACTORY_KEYS,
    PARTITIONABLE_QUANT_METHODS,
    RECIPE_SCRIPTS,
    TRL_KEYS,
)
from zerofit.configs.check.problems import Problem

GATHER_KEY = "stage3_gather_16bit_weights_on_model_save"


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """How the training script loads and trains the model, from a YAML or a command line."""

    source: str  # the file name, or "command", as Problem paths start
    stack: str  # "trl", "llamafactory", "recipes" or "transformers" (any other script)
    peft: bool  # LoRA (or another adapter): only adapters train and get saved
    quant_bits: int | None  # bitsandbytes quantization on load: 4, 8, or None
    quant_storage: str | None  # bnb_4bit_quant_storage as a dtype name ("stack": set by it)
    compute_dtype: str | None  # the dtype the 4-bit layers compute in, when known
    model: str | None  # model_name_or_path / --model
    device_map: Any = None
    low_cpu_mem_usage: Any = None
    deepspeed: str | None = None  # the DeepSpeed JSON a TRL / LLaMA-Factory YAML names
    # the accelerate config of `accelerate launch --config_file X script.py ...`
    accelerate_config: str | None = None


# ----------------------------------------------------------------------------- reading
def read_training(value: str, read_text) -> TrainingSetup:
    """``--training VALUE``: a YAML file (read with ``read_text``) or a command line."""
    if value.lower().endswith((".yaml", ".yml")) and os.path.isfile(value):
        return setup_from_mapping(os.path.basename(value), _yaml_mapping(value, read_text(value)))
    return setup_from_command(value, read_text)


def _yaml_mapping(name: str, text: str) -> dict:
    import yaml

    from zerofit.errors import ZerofitError

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = (str(exc).splitlines() or ["unparsable"])[0]
        raise ZerofitError(name, f"is not valid YAML ({first})", "fix the file") from None
    if not isinstance(data, dict):
        raise ZerofitError(name, "holds no `key: value` lines", "give a TRL / LLaMA-Factory YAML")
    return data


def setup_from_command(command: str, read_text) -> TrainingSetup:
    """The flags of a training command line (`--key value`, `--key=value`, a bare `--flag`);
    a YAML file among its words (`llamafactory-cli train x.yaml`, `--config x.yaml`) is read
    first and the flags override it."""
    from zerofit.errors import ZerofitError

    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ZerofitError("--training", f"cannot split the command ({exc})", "quote it") from None
    launcher_config = _launcher_config(words)
    values: dict[str, Any] = {}
    for word in words:
        if word == launcher_config:
            continue  # accelerate's own config, not the training script's arguments
        if word.lower().endswith((".yaml", ".yml")) and os.path.isfile(word):
            values.update(_yaml_mapping(os.path.basename(word), read_text(word)))
    values.update(_command_flags(words))
    script = next((w for w in words if w.endswith(".py")), "")
    if os.path.basename(script) in RECIPE_SCRIPTS and "recipes" in script:
        values.setdefault("finetuning", "full")
    setup = setup_from_mapping("command", values)
    return dataclasses.replace(setup, accelerate_config=launcher_config)


def _launcher_config(words: list[str]) -> str | None:
    """X of `accelerate launch --config_file X script.py ...`: the launcher's flags come before
    the script (accelerate/commands/launch.py, launch_command_parser: `--config_file`)."""
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), len(words))
    for index, word in enumerate(words[:script]):
        key, equals, value = word.partition("=")
        if key != "--config_file":
            continue
        if equals:
            return value or None
        return words[index + 1] if index + 1 < script else None
    return None


def _command_flags(words: list[str]) -> dict[str, Any]:
    """{key: value} of every `--key` after the script (or after `train` / `-m module`)."""
    flags: dict[str, Any] = {}
    start = next((i for i, w in enumerate(words) if w.endswith(".py") or w == "train"), -1)
    index = start + 1
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("--"):
            continue
        key, _, value = word[2:].partition("=")
        key = key.replace("-", "_")
        if not value and index < len(words) and not words[index].startswith("--"):
            value = words[index]
            index += 1
        flags[key] = value if value else True
    return flags


def setup_from_mapping(source: str, values: dict) -> TrainingSetup:
    """One TrainingSetup from a stack's own key names (TRL ModelConfig, LLaMA-Factory model
    and finetuning arguments, the recipes' Args)."""
    model = values.get("model_name_or_path") or values.get("model") or None
    common = {
        "source": source,
        "model": str(model) if model else None,
        "device_map": values.get("device_map"),
        "low_cpu_mem_usage": values.get("low_cpu_mem_usage"),
        "deepspeed": str(values["deepspeed"]) if values.get("deepspeed") else None,
    }
    if "finetuning" in values:  # zerofit's recipes: QLoRA storage and gathering set by them
        method = str(values["finetuning"])
        quant = 4 if method == "qlora" else None
        return TrainingSetup(
            stack="recipes",
            peft=method in ("lora", "qlora"),
            quant_bits=quant,
            quant_storage="stack" if quant else None,
            compute_dtype=None,
            **common,
        )
    if LLAMAFACTORY_KEYS & set(values):
        bits = _int_or_none(values.get("quantization_bit"))
        method = str(values.get("quantization_method", "bnb")).lower()
        return TrainingSetup(
            stack="llamafactory",
            peft=str(values.get("finetuning_type", "lora")).lower() in ("lora", "oft"),
            quant_bits=bits if method in ("bnb", "bitsandbytes") else None,
            quant_storage="stack" if bits == 4 else None,  # set to the compute dtype by it
            compute_dtype=None,
            **common,
        )
    quant = None
    if _true(values.get("load_in_4bit")):
        quant = 4
    elif _true(values.get("load_in_8bit")):
        quant = 8
    compute = values.get("bnb_4bit_compute_dtype") or values.get("dtype")
    compute = compute or values.get("torch_dtype")
    return TrainingSetup(
        stack="trl" if TRL_KEYS & set(values) else "transformers",
        peft=_true(values.get("use_peft")) or "lora_r" in values or "lora_rank" in values,
        quant_bits=quant,
        quant_storage=dtype_name(values.get("bnb_4bit_quant_storage")),
        compute_dtype=dtype_name(compute),
        **common,
    )


def _true(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def dtype_name(value: Any) -> str | None:
    """ "bfloat16" for bf16 / torch.bfloat16 / bfloat16; None for nothing or "auto"."""
    if value in (None, "", "auto"):
        return None
    text = str(value).lower().removeprefix("torch.")
    return DTYPE_NAMES.get(text, text)


# ----------------------------------------------------------------------------- rules
def zero3_configs(deepspeed: dict[str, dict]) -> dict[str, dict]:
    """The DeepSpeed configs among the checked files that run ZeRO-3."""
    found = {}
    for name, cfg in deepspeed.items():
        zero = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
        if isinstance(zero, dict) and zero.get("stage") == 3:
            found[name] = cfg
    return found


def check_training(
    setup: TrainingSetup, deepspeed: dict[str, dict], client: str | None, read_model_config
) -> list[Problem]:
    """The setup's problems under each ZeRO-3 config in ``deepspeed`` ({name: config});
    ``read_model_config(model)`` returns a local model's config.json as a dict, or None."""
    problems: list[Problem] = []
    model_config = read_model_config(setup.model) if setup.model else None
    for name, cfg in zero3_configs(deepspeed).items():
        problems += _quantized_base(setup, name)
        problems += _prequantized(setup, name, model_config)
        problems += _loading_options(setup, name)
        problems += _adapter_saving(setup, name, cfg, client)
    return problems


def _quantized_base(setup: TrainingSetup, ds_name: str) -> list[Problem]:
    """bitsandbytes on load under ZeRO-3: transformers skips zero.Init for a quantized model
    (modeling_utils.py, PreTrainedModel.get_init_context: `if not is_quantized`), so every rank
    loads the whole base and DeepSpeed partitions it only when the 4-bit weights are stored in a
    float dtype (peft issue 1844, bitsandbytes issue 1249)."""
    if setup.quant_bits == 8:
        return [
            Problem(
                f"{setup.source}:load_in_8bit",
                f"8-bit bitsandbytes weights are int8 tensors that ZeRO-3 ({ds_name}) cannot "
                "partition; LLaMA-Factory refuses it (\"Only 4-bit quantized model can use "
                'fsdp+qlora")',
                "use 4-bit with bnb_4bit_quant_storage equal to the compute dtype, or ZeRO-2",
            )
        ]
    if setup.quant_bits != 4 or setup.quant_storage == "stack":
        return []
    wanted = setup.compute_dtype or "bfloat16"
    if setup.quant_storage == wanted:
        return []
    stored = setup.quant_storage or "uint8 (the default)"
    return [
        Problem(
            f"{setup.source}:bnb_4bit_quant_storage",
            f"QLoRA under ZeRO-3 ({ds_name}) stores the 4-bit weights as {stored}, not the "
            f"compute dtype {wanted}: ZeRO-3 leaves them whole on every GPU (peft issue 1844, "
            "bitsandbytes issue 1249)",
            f"set bnb_4bit_quant_storage: {wanted} (the compute dtype), as peft's DeepSpeed "
            "guide and LLaMA-Factory do",
        )
    ]


def _prequantized(setup: TrainingSetup, ds_name: str, model_config: dict | None) -> list[Problem]:
    """A checkpoint saved quantized (GPTQ, AWQ, ...): its packed integer weights cannot be
    partitioned. LLaMA-Factory refuses it ("DeepSpeed ZeRO-3 or FSDP is incompatible with
    PTQ-quantized models", model_utils/quantization.py, LLaMA-Factory issue 6898); transformers
    issue 30332 (AWQ under ZeRO-3)."""
    quant = (model_config or {}).get("quantization_config")
    if not isinstance(quant, dict):
        return []
    method = str(quant.get("quant_method", "?")).lower()
    if method in PARTITIONABLE_QUANT_METHODS:
        stored = dtype_name(quant.get("bnb_4bit_quant_storage"))
        if not quant.get("load_in_4bit") or stored not in (None, "uint8"):
            return []
        return [
            Problem(
                f"{setup.model}/config.json:quantization_config.bnb_4bit_quant_storage",
                f"this bitsandbytes 4-bit checkpoint stores its weights as uint8, which ZeRO-3 "
                f"({ds_name}) cannot partition (peft issue 1844)",
                "quantize the 16-bit model on load with bnb_4bit_quant_storage equal to the "
                "compute dtype",
            )
        ]
    return [
        Problem(
            f"{setup.model}/config.json:quantization_config.quant_method",
            f"{method} is a pre-quantized checkpoint: ZeRO-3 ({ds_name}) cannot partition its "
            "packed weights, and LLaMA-Factory refuses it (\"DeepSpeed ZeRO-3 or FSDP is "
            'incompatible with PTQ-quantized models", LLaMA-Factory issue 6898)',
            "use ZeRO-2 (LoRA on the quantized base), or QLoRA from the 16-bit model",
        )
    ]


def _loading_options(setup: TrainingSetup, ds_name: str) -> list[Problem]:
    """`device_map` under ZeRO-3: transformers refuses it (integrations/accelerate.py,
    check_and_set_device_map: "DeepSpeed Zero-3 is not compatible with passing a
    `device_map`"); `low_cpu_mem_usage`: transformers 4.x refused it the same way, 5.x drops it
    (modeling_utils.py, from_pretrained: "Not used anymore")."""
    problems = []
    if setup.device_map not in (None, "", "none", "None", False):
        problems.append(
            Problem(
                f"{setup.source}:device_map",
                f"{setup.device_map!r} with ZeRO-3 ({ds_name}): transformers refuses it "
                '("DeepSpeed Zero-3 is not compatible with passing a `device_map`", accelerate '
                "issue 2543, peft issue 306)",
                "remove device_map: DeepSpeed places the shards",
            )
        )
    if _true(setup.low_cpu_mem_usage):
        problems.append(
            Problem(
                f"{setup.source}:low_cpu_mem_usage",
                f"with ZeRO-3 ({ds_name}): transformers 4.x refuses it (\"DeepSpeed Zero-3 is not "
                'compatible with `low_cpu_mem_usage=True`"), 5.x ignores it',
                "remove low_cpu_mem_usage: zero.Init already loads the model in shards",
                "warning",
            )
        )
    return problems


def _adapter_saving(setup: TrainingSetup, ds_name: str, cfg: dict, client) -> list[Problem]:
    """LoRA under ZeRO-3 without 16-bit gathering on save: every parameter is an empty
    partition, and a save through accelerate's get_state_dict refuses (accelerator.py,
    Accelerator.get_state_dict raises ValueError) while a plain `save_pretrained` writes empty
    adapters (trl issue 4416, DeepSpeed issue 4295: "adapter_model.bin 519K"). Today's HF
    Trainer gathers a PEFT adapter itself (trainer.py, Trainer.save_model:
    `_zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)`): a warning there."""
    if not setup.peft or setup.stack == "recipes":  # the recipes turn the gathering on
        return []
    value = cfg["zero_optimization"].get(GATHER_KEY)
    if value is True:
        return []
    shown = "missing (false)" if value is None else json.dumps(value)
    return [
        Problem(
            f"{ds_name}:zero_optimization.{GATHER_KEY}",
            f"is {shown} while LoRA trains under ZeRO-3: saving the adapter without gathering "
            "the 16-bit weights writes empty adapters (trl issue 4416, DeepSpeed issue 4295) "
            "or fails in accelerate's get_state_dict",
            f"set zero_optimization.{GATHER_KEY}: true",
            "warning" if client == "trainer" else "error",
        )
    ]


def read_model_config(model: str) -> dict | None:
    """A local model directory's config.json as a dict (None for a hub id or no readable file)."""
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
