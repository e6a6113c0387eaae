"""Recipe arguments: a dataclass of fields with their help text, parsed by transformers'
`HfArgumentParser`; defaults < `--config file.yaml` < command-line flags.

Every bad value (a flag or a YAML line) is one line on stderr naming the field and the fix, exit 2,
no traceback. Nothing here imports torch: a recipe checks its input before the heavy imports.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
import time
import typing

# seconds a rank that does not print a bad input's line waits for the launcher to stop it (fail)
SILENT_RANK_WAIT_S = 30
PROGRAM = {"name": "recipe"}  # set by parse_args: the prefix of every error line ("grpo.py: ...")


# ----------------------------------------------------------------------------- errors
def fail(field: str, problem: str, fix: str) -> typing.NoReturn:
    """Bad input: one line on stderr naming the field and the fix, exit 2, no traceback.

    Under a multi-process launch every rank meets the same bad input; only each node's first
    rank (LOCAL_RANK 0) prints it, so the line appears once per node, not once per rank.
    The other ranks wait before they exit: the launcher stops every rank as soon as one fails,
    so a silent rank that exited first could stop rank 0 before its line was out (seen on a
    loaded machine, where rank 0 also takes the run directory's lock first). Rank 0's exit ends
    the wait (the launcher stops them); the bound only matters if rank 0 does not fail."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"{PROGRAM['name']}: {field}: {problem} (fix: {fix})", file=sys.stderr, flush=True)
    else:
        time.sleep(SILENT_RANK_WAIT_S)
    sys.exit(2)


def note(message: str, accelerator=None) -> None:
    """A stated decision (e.g. a DeepSpeed JSON value winning over a flag), printed once."""
    main = accelerator.is_main_process if accelerator else os.environ.get("RANK", "0") == "0"
    if main:
        print(f"{PROGRAM['name']}: note: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- fields
def option(default, help: str) -> dataclasses.Field:
    """A field with its `--help` text (the field style of trl's configs)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class RunArgs:
    """Fields every recipe has; a recipe's own Args dataclass inherits them."""

    model: str = option(
        "", "local model directory or hub id; empty: a tiny random-init Qwen2-style model"
    )
    dataset: str = option(
        "",
        ".json/.jsonl file or a `datasets` name; empty: the built-in toy task. A relative "
        "path in a --config YAML is read from the YAML's directory",
    )
    dataset_split: str = option("train", "split of a `datasets` name")
    output_dir: str = option(
        "runs/recipe", "run directory: checkpoints, metrics.jsonl, final/; one run at a time"
    )
    max_steps: int = option(100, "optimizer steps to train")
    per_device_batch_size: int = option(
        16, "rows per micro-batch on each process; a DeepSpeed JSON integer wins"
    )
    gradient_accumulation_steps: int = option(
        1, "micro-batches per optimizer step; a DeepSpeed JSON integer wins"
    )
    learning_rate: float = option(1e-3, "AdamW learning rate (constant)")
    max_grad_norm: float = option(
        1.0, 'gradient clipping; 0: none; fills a DeepSpeed JSON\'s "auto" gradient_clipping'
    )
    gradient_checkpointing: bool = option(
        False, "recompute activations in the backward pass: less memory, more compute"
    )
    save_every: int = option(50, "steps between checkpoints; 0: only the final model")
    save_total_limit: int = option(0, "keep only the newest N checkpoints; 0: keep all")
    resume_from: str = option(
        "", '"latest", "auto" (latest if any, else a fresh start) or a checkpoint directory'
    )
    overwrite: bool = option(
        False, "start over in a non-empty --output-dir (deletes the old checkpoints)"
    )
    seed: int = option(0, "seed of the model init and the data order")
    finetuning: str = option(
        "full",
        "full: train every weight; lora: frozen base + trainable low-rank adapters (peft); "
        "qlora: lora on a 4-bit NF4 base (bitsandbytes)",
    )
    # defaults as TRL's ModelConfig (trl/trainer/model_config.py: lora_r 16, lora_alpha 32,
    # lora_dropout 0.05), the numbers most users start from
    lora_rank: int = option(16, "lora/qlora: rank r of each adapter (A is r x in, B is out x r)")
    lora_alpha: float = option(32.0, "lora/qlora: the update is scaled by lora_alpha / lora_rank")
    lora_targets: str = option(
        "all-linear",
        "lora/qlora: all-linear (every linear layer but the output head), attention (the "
        "attention projections), or module names, comma-separated, e.g. q_proj,v_proj",
    )
    lora_dropout: float = option(0.05, "lora/qlora: dropout on the adapter's input")
    merge_adapter: bool = option(
        False,
        "lora: save final/ as a full model with the adapter merged in; default: the adapter only",
    )


def override(name: str, default) -> dataclasses.Field:
    """RunArgs' field `name` with a recipe's own default and the same help text."""
    help_text = next(f.metadata["help"] for f in dataclasses.fields(RunArgs) if f.name == name)
    return option(default, help_text)


# ----------------------------------------------------------------------------- values
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def convert_value(name: str, value, type_name: str, source: str):
    """One argument value (YAML or command line) as the field's type, or a one-line error."""
    if value is None:
        fail(name, f"{source} gives null", f"give {name} a {type_name} value or leave it out")
    if isinstance(value, (list, dict)):
        fail(
            name,
            f"{source} gives a {type(value).__name__} ({value!r})",
            f"give one {type_name} value" + (', e.g. "1,0.2"' if type_name == "str" else ""),
        )
    if type_name == "bool":
        return convert_bool(name, value, source)
    if type_name == "int":
        return convert_int(name, value, source)
    if type_name == "float":
        return convert_float(name, value, source)
    return str(value)


def convert_bool(name: str, value, source: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        fail(name, f"{value!r} from {source} is not a boolean", "use true/false (or on/off, 1/0)")
    return word in TRUE_WORDS


def convert_int(name: str, value, source: str) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        fail(name, f"{value!r} from {source} is not a whole number", f"use an integer {name}")
    try:
        return int(value.strip() if isinstance(value, str) else value)
    except ValueError:
        fail(name, f"{value!r} from {source} is not a whole number", f"use an integer {name}")


def convert_float(name: str, value, source: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        fail(name, f"{value!r} from {source} is not a number", f"use a number for {name}")
    if not math.isfinite(number):
        fail(name, f"{value!r} from {source} is not finite", f"use a finite {name}")
    return number


def looks_like_path(value: str) -> bool:
    """A dataset/model value meant as a local path rather than a hub name."""
    return (
        value.startswith((".", "/", "~"))
        or value.count("/") > 1
        or value.endswith((".json", ".jsonl", ".csv", ".parquet", ".txt"))
    )


def field_types(args_class) -> dict[str, str]:
    """{field name: "int" | "float" | "bool" | "str"} of an Args dataclass."""
    hints = typing.get_type_hints(args_class)
    return {f.name: hints[f.name].__name__ for f in dataclasses.fields(args_class)}


def read_config_file(path: str, args_class) -> dict:
    """The `--config` YAML as {field: value of the field's type}, or a one-line error.

    A relative `dataset` path is joined to the YAML's own directory, so a YAML and the data
    file beside it work from any working directory."""
    import yaml

    if os.path.isdir(path):
        fail("config", f"{path} is a directory", "pass the YAML file of --config")
    if not os.path.isfile(path):
        fail("config", f"no such file {path}", "check the path of --config")
    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail("config", f"{path} is not valid YAML ({first})", "fix the file")
    except OSError as e:
        fail("config", f"cannot read {path} ({e.strerror})", "check the file's permissions")
    if values is None:
        return {}
    if not isinstance(values, dict):
        fail(
            "config",
            f"{path} holds a {type(values).__name__}, not key: value lines",
            "write `key: value` lines",
        )
    types = field_types(args_class)
    unknown = set(values) - set(types)
    if unknown:
        listed = sorted(unknown, key=str)  # YAML keys may be numbers too
        fail("config", f"unknown keys {listed} in {path}", "use the names in `--help`")
    converted = {
        name: convert_value(name, value, types[name], path) for name, value in values.items()
    }
    dataset = os.path.expanduser(converted.get("dataset", ""))
    if dataset and looks_like_path(dataset) and not os.path.isabs(dataset):
        converted["dataset"] = os.path.normpath(os.path.join(os.path.dirname(path), dataset))
    return converted


# ----------------------------------------------------------------------------- parsing
class OneLineErrors:
    """argparse's own errors (unknown flag, missing value) as one line, like every other error."""

    def error(self, message):
        fail("arguments", message, f"see `{self.prog} --help`")


class ConfigFlagParser(OneLineErrors, argparse.ArgumentParser):
    """Reads only `--config`, before the full parser exists (its values become defaults)."""


def build_parser(args_class, program: str, description: str):
    """transformers' HfArgumentParser over `args_class` (a flag per field, with dashes or
    underscores, help from the field's metadata), its values read by `convert_value`."""
    from transformers import HfArgumentParser
    from transformers.hf_argparser import string_to_bool

    readers = {int: "int", float: "float", str: "str", string_to_bool: "bool"}

    class RecipeArgumentParser(OneLineErrors, HfArgumentParser):
        def add_argument(self, *flags, **kwargs):
            """HfArgumentParser calls this once per field (hf_argparser.py,
            `_parse_dataclass_field`): the field's type becomes our reader, whose errors name
            the field (argparse would say `invalid int value`)."""
            if kwargs.get("action") == "store_false":  # the --no_X of a default-true boolean
                kwargs["help"] = f"the same as --{kwargs['dest']} false"
                kwargs["default"] = argparse.SUPPRESS  # --X's default is the one that counts
            type_name = readers.get(kwargs.get("type"))
            if type_name:
                name = flags[0].lstrip("-")
                kwargs["type"] = lambda text: convert_value(
                    name, text, type_name, "the command line"
                )
                kwargs.setdefault("metavar", type_name.upper())
            return super().add_argument(*flags, **kwargs)

    # allow_abbrev=False: --max-step is a typo, not --max-steps
    parser = RecipeArgumentParser(
        args_class, prog=program, description=description, allow_abbrev=False
    )
    parser.add_argument(
        "--config",
        metavar="YAML",
        default=argparse.SUPPRESS,  # read before this parser runs (parse_args); no default shown
        help="YAML file of `field: value` lines (the names above); flags override it",
    )
    return parser


def parse_args(args_class, argv, program: str, description: str):
    """Dataclass defaults < `--config file.yaml` < command-line flags (dashes or underscores)."""
    PROGRAM["name"] = program
    pre = ConfigFlagParser(prog=program, add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    config = pre.parse_known_args(argv)[0].config
    parser = build_parser(args_class, program, description)
    if config:
        parser.set_defaults(**read_config_file(config, args_class))
    # returns (args, [a namespace holding --config when given], flags no field took)
    parsed = parser.parse_args_into_dataclasses(
        argv, return_remaining_strings=True, look_for_args_file=False
    )
    args, unknown = parsed[0], parsed[-1]
    if unknown:
        fail("arguments", f"unrecognized arguments: {' '.join(unknown)}", f"see `{program} --help`")
    return args


# ----------------------------------------------------------------------------- checks
def check_at_least(args, minimum, *names: str) -> None:
    """Each named field >= minimum, else a one-line error."""
    for name in names:
        value = getattr(args, name)
        if value < minimum:
            fix = f"use a positive {name}" if minimum == 1 else f"use {minimum} or more for {name}"
            fail(name, f"{value} is too small", fix)


def check_positive_float(args, *names: str) -> None:
    for name in names:
        if getattr(args, name) <= 0:
            fail(name, f"{getattr(args, name)} must be > 0", f"use a positive {name}")


def check_choice(args, name: str, choices: tuple[str, ...]) -> None:
    if getattr(args, name) not in choices:
        fail(
            name,
            f"{getattr(args, name)!r} is not one of {', '.join(choices)}",
            f"use {' or '.join(choices)}",
        )


def check_run_args(args: RunArgs) -> None:
    """The checks every recipe shares (sizes, steps, learning rate, output dir)."""
    check_at_least(args, 1, "max_steps", "per_device_batch_size", "gradient_accumulation_steps")
    check_at_least(args, 0, "save_every", "save_total_limit")
    check_positive_float(args, "learning_rate")
    if args.max_grad_norm < 0:
        fail(
            "max_grad_norm",
            f"{args.max_grad_norm} is negative",
            "use 0 (no clipping) or a positive norm",
        )
    if not args.output_dir:
        fail("output_dir", "is empty", "pass --output-dir DIR")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        fail("output_dir", f"{args.output_dir} is a file, not a directory", "pass a directory path")
    if args.resume_from and args.overwrite:
        fail(
            "overwrite",
            "--overwrite and --resume-from contradict each other",
            "pass only one of them",
        )
    check_finetuning_args(args)


FINETUNING = ("full", "lora", "qlora")
LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "merge_adapter")


def check_finetuning_args(args: RunArgs) -> None:
    """--finetuning and the LoRA fields: in range, and no LoRA field set for a full fine-tune
    (it would be silently ignored)."""
    check_choice(args, "finetuning", FINETUNING)
    if args.finetuning == "full":
        defaults = {f.name: f.default for f in dataclasses.fields(RunArgs)}
        changed = [name for name in LORA_FIELDS if getattr(args, name) != defaults[name]]
        if changed:
            fail(
                changed[0],
                f"is set but --finetuning is full (the {changed[0]} would be ignored)",
                "add --finetuning lora (or qlora), or drop the flag",
            )
        return
    check_at_least(args, 1, "lora_rank")
    check_positive_float(args, "lora_alpha")
    if not 0 <= args.lora_dropout < 1:
        fail("lora_dropout", f"{args.lora_dropout} is outside [0, 1)", "use e.g. 0.05, or 0")
    names = [name.strip() for name in args.lora_targets.split(",")]
    if not all(names):
        fail(
            "lora_targets",
            f"{args.lora_targets!r} has an empty name",
            "give all-linear, attention, or module names like q_proj,v_proj",
        )
    if args.finetuning == "qlora" and args.merge_adapter:
        fail(
            "merge_adapter",
            "cannot merge into a 4-bit base (the merged weights would be re-quantized)",
            "save the adapter (the default), then merge it into the 16-bit base model",
        )
    if args.finetuning == "qlora" and importlib.util.find_spec("bitsandbytes") is None:
        fail("finetuning", "qlora needs bitsandbytes", "pip install bitsandbytes")
    if importlib.util.find_spec("peft") is None:
        fail("finetuning", f"{args.finetuning} needs peft", "pip install peft")
