"""Plumbing shared by the recipes (sft.py, dpo.py, grpo.py): arguments, run directory, data files,
the tiny offline model, the accelerate/DeepSpeed setup, checkpoints and metrics.

Each recipe imports this file from its own folder; it needs only torch, accelerate, transformers
and pyyaml (the zerofit package is not required to run a recipe). What a recipe *does* (its data
format, loss and loop) stays in the recipe file; this module holds only what all three share.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import sys

import torch

PROGRAM = {"name": "recipe"}  # set by parse_args: the prefix of every error line ("grpo.py: ...")


# ----------------------------------------------------------------------------- errors
def fail(field: str, problem: str, fix: str) -> None:
    """Bad input: one line on stderr naming the field and the fix, exit 2, no traceback."""
    print(f"{PROGRAM['name']}: {field}: {problem} (fix: {fix})", file=sys.stderr)
    sys.exit(2)


def note(message: str, accelerator=None) -> None:
    """A stated decision (e.g. a DeepSpeed JSON value winning over a flag), printed once."""
    main = accelerator.is_main_process if accelerator else os.environ.get("RANK", "0") == "0"
    if main:
        print(f"{PROGRAM['name']}: note: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- arguments
@dataclasses.dataclass
class RunArgs:
    """Fields every recipe has; a recipe's own Args dataclass inherits them."""

    model: str = ""  # local dir or hub id; "" = tiny random-init Qwen2-style model + char tokenizer
    dataset: str = ""  # .json/.jsonl file or a datasets name; "" = the embedded toy task
    dataset_split: str = "train"
    output_dir: str = "runs/recipe"
    max_steps: int = 100
    per_device_batch_size: int = 16  # rows per micro-batch; a DeepSpeed JSON integer wins
    gradient_accumulation_steps: int = 1  # micro-batches per step; a DeepSpeed JSON integer wins
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0  # 0 = no clipping; fills a DeepSpeed JSON's "auto" gradient_clipping
    gradient_checkpointing: bool = False
    save_every: int = 50  # steps between checkpoints; 0 = only the final model
    save_total_limit: int = 0  # keep only the newest N checkpoints; 0 = keep all
    resume_from: str = ""  # "latest", "auto" (latest if any, else start) or a checkpoint directory
    overwrite: bool = False  # start over in a non-empty --output-dir (deletes old checkpoints)
    seed: int = 0


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
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word in TRUE_WORDS + FALSE_WORDS:
            return word in TRUE_WORDS
        fail(name, f"{value!r} from {source} is not a boolean", "use true/false (or on/off, 1/0)")
    if type_name == "int":
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            fail(name, f"{value!r} from {source} is not a whole number", f"use an integer {name}")
        try:
            return int(value) if not isinstance(value, str) else int(value.strip())
        except ValueError:
            fail(name, f"{value!r} from {source} is not a whole number", f"use an integer {name}")
    if type_name == "float":
        try:
            number = float(value)
        except (TypeError, ValueError):
            fail(name, f"{value!r} from {source} is not a number", f"use a number for {name}")
        if not math.isfinite(number):
            fail(name, f"{value!r} from {source} is not finite", f"use a finite {name}")
        return number
    return str(value)


def read_config_file(path: str, field_names: set[str]) -> dict:
    """The `--config` YAML as a dict of known fields, or a one-line error."""
    import yaml

    if not os.path.isfile(path):
        fail("config", f"no such file {path}", "check the path of --config")
    try:
        with open(path) as f:
            values = yaml.safe_load(f)
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail("config", f"{path} is not valid YAML ({first})", "fix the file")
    if values is None:
        return {}
    if not isinstance(values, dict):
        fail(
            "config",
            f"{path} holds a {type(values).__name__}, not key: value lines",
            "write `key: value` lines",
        )
    unknown = set(values) - field_names
    if unknown:
        fail("config", f"unknown keys {sorted(unknown)} in {path}", "use the names in `--help`")
    return values


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse's own errors (unknown flag, missing value) as one line, like every other error."""

    def error(self, message):
        fail("arguments", message, f"see `{self.prog} --help`")


def parse_args(args_class, argv, program: str, description: str):
    """Dataclass defaults < `--config file.yaml` < command-line flags (dashes or underscores)."""
    PROGRAM["name"] = program
    fields = {f.name: f for f in dataclasses.fields(args_class)}
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", help="YAML file of defaults; flags override it")
    known, _ = pre.parse_known_args(argv)
    from_file = read_config_file(known.config, set(fields)) if known.config else {}

    parser = OneLineArgumentParser(
        prog=program, description=description, parents=[pre], allow_abbrev=False
    )  # --max-step is a typo, not --max-steps
    for name, field in fields.items():
        flags = sorted({f"--{name}", f"--{name.replace('_', '-')}"})
        parser.add_argument(
            *flags,
            dest=name,
            default=None,
            metavar=str(field.type).upper(),
            help=f"default {field.default!r}",
        )
    given = vars(parser.parse_args(argv))
    values = {}
    for name, field in fields.items():
        if given[name] is not None:
            values[name] = convert_value(name, given[name], field.type, "the command line")
        elif name in from_file:
            values[name] = convert_value(name, from_file[name], field.type, known.config)
    return args_class(**values)


def check_at_least(args, minimum, *names: str) -> None:
    """Each named field >= minimum, else a one-line error."""
    for name in names:
        value = getattr(args, name)
        if value < minimum:
            word = "positive" if minimum == 1 else f"at least {minimum}"
            fail(
                name,
                f"{value} is too small",
                f"use a {word} {name}" if minimum != 0 else f"use 0 or more for {name}",
            )


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


# ----------------------------------------------------------------------------- data files
def looks_like_path(value: str) -> bool:
    """A dataset/model value meant as a local path rather than a hub name."""
    return (
        value.startswith((".", "/", "~"))
        or value.count("/") > 1
        or value.endswith((".json", ".jsonl", ".csv", ".parquet", ".txt"))
    )


def read_rows(dataset: str, split: str) -> list[dict]:
    """Rows of a .jsonl (one JSON object per line) or .json (a list) file, or of a datasets name."""
    if os.path.isfile(dataset):
        return read_json_rows(dataset)
    if looks_like_path(dataset):
        fail("dataset", f"no such file {dataset}", "check the path (run from the repository root?)")
    try:
        import datasets  # optional: only for hub datasets
    except ImportError:
        fail(
            "dataset",
            f"{dataset!r} is not a local file and `datasets` is not installed",
            "pass a .jsonl/.json file or `pip install datasets`",
        )
    try:
        return list(datasets.load_dataset(dataset, split=split))
    except Exception as e:  # network, unknown name, bad split: one line in the library's words
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail(
            "dataset",
            f"cannot load {dataset!r} split {split!r}: {first}",
            "check the name and split",
        )


def read_json_rows(path: str) -> list[dict]:
    with open(path) as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            fail("dataset", f"{path} is not JSON (line {e.lineno}: {e.msg})", "fix the file")
        if not isinstance(rows, list):
            fail(
                "dataset",
                f"{path} holds a {type(rows).__name__}, not a list of rows",
                "write a JSON list of objects, or one object per line in a .jsonl file",
            )
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail(
                "dataset", f"{path} line {number} is not JSON ({e.msg})", "one JSON object per line"
            )
    return rows


def check_rows(rows: list, fields: tuple[str, ...], where: str) -> None:
    """Every row an object with each field a string; the first bad row gets a one-line error."""
    wanted = " and ".join(f"`{f}`" for f in fields)
    if not rows:
        fail("dataset", f"{where} has no rows", f"give rows with {wanted}")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            fail(
                "dataset",
                f"{where} row {number} is a {type(row).__name__}, not an object",
                f"give rows with {wanted}",
            )
        for field in fields:
            if field not in row:
                fail(
                    field,
                    f"{where} row {number} has no `{field}`: needs rows with {wanted}",
                    "rename your columns",
                )
            if not isinstance(row[field], str):
                fail(
                    field,
                    f"{where} row {number}: `{field}` is a {type(row[field]).__name__}, "
                    "not a string",
                    f"make `{field}` a string",
                )


def sample_indices(step: int, num_rows: int, per_step: int, seed: int) -> list[int]:
    """Rows used at `step`: a fixed function of the step, so a resumed run sees the same order.

    >>> sample_indices(0, 4, 3, 0) + sample_indices(1, 4, 3, 0) == sample_indices(0, 4, 6, 0)
    True
    """
    out, perms = [], {}
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(pos, num_rows)  # reshuffle every epoch, seeded by (seed, epoch)
        if epoch not in perms:
            generator = torch.Generator().manual_seed(seed * 1000 + epoch)
            perms[epoch] = torch.randperm(num_rows, generator=generator)
        out.append(int(perms[epoch][i]))
    return out


def rank_indices(step: int, num_rows: int, per_rank: int, world: int, rank: int, seed: int):
    """This rank's rows for `step` (1-based): its slice of the step's global batch."""
    everyone = sample_indices(step - 1, num_rows, per_rank * world, seed)
    return everyone[rank * per_rank : (rank + 1) * per_rank]


def micro_batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def pad_right(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


# ----------------------------------------------------------------------------- tiny model
TINY_CHARS = "0123456789+-*=()., "
# role-free template: the prompt text, then the answer and EOS for assistant turns
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}<eos>"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)


def build_tiny_tokenizer():
    """Character-level tokenizer for the toy tasks, built locally (no download)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *TINY_CHARS])}
    # no merges: one token per character
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def build_tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2):
    """Random-init Qwen2-architecture causal LM sized for CPU tests."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)


def load_tokenizer(args: RunArgs):
    """`--model`'s tokenizer (the tiny one without --model), padding left, with a pad token."""
    if not args.model:
        tok = build_tiny_tokenizer()
    else:
        check_model_path(args.model)
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(args.model)
        except Exception as e:  # OSError (not found / offline), ValueError (not a tokenizer), ...
            fail(
                "model",
                f"cannot load a tokenizer from {args.model!r}: {first_line(e)}",
                "pass a local model directory or a hub id reachable from here",
            )
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


def load_model(args: RunArgs, tokenizer):
    """`--model` as a causal LM (the tiny random-init one without --model)."""
    if not args.model:
        return build_tiny_model(tokenizer, args.seed)
    from transformers import AutoModelForCausalLM

    try:  # fp32 master weights; DeepSpeed/autocast compute in the config's bf16/fp16
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    except Exception as e:
        fail(
            "model",
            f"cannot load a causal LM from {args.model!r}: {first_line(e)}",
            "pass a local model directory (config.json + weights) or a hub id",
        )


def check_model_path(model: str) -> None:
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            fail("model", f"{model} has no config.json", "pass a saved model directory")
    elif os.path.exists(model):
        fail("model", f"{model} is a file, not a model directory", "pass the directory holding it")
    elif looks_like_path(model):
        fail(
            "model", f"no such directory {model}", "check the path, or give a hub id like org/name"
        )


def first_line(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__


# ----------------------------------------------------------------------------- accelerate setup
def build_accelerator(args: RunArgs, project: str):
    """Accelerator with gloo on CPU (else each rank silently trains alone: STACK.md), and the
    DeepSpeed JSON reconciled with the flags: its integers win (stated), its "auto" values are
    filled from the flags. Returns (accelerator, zero_stage); zero_stage is -1 without DeepSpeed."""
    import importlib.util

    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    on_cpu = multi and not torch.cuda.is_available()
    handlers = [InitProcessGroupKwargs(backend="gloo")] if on_cpu else []
    # A DDP (MULTI_GPU) config on a machine without GPUs: accelerate only picks MULTI_CPU (real
    # DDP over gloo) when asked for the CPU, else every rank trains alone (state.py,
    # AcceleratorState._prepare_backend). DeepSpeed configs bring their own distributed setup.
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    tracker = "tensorboard" if importlib.util.find_spec("tensorboard") else None
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        kwargs_handlers=handlers,
        log_with=tracker,
        project_dir=args.output_dir,
        cpu=on_cpu and not deepspeed,
    )
    if multi and accelerator.distributed_type.value == "NO":
        fail(
            "accelerate config",
            f"{os.environ['WORLD_SIZE']} processes started but accelerate "
            "set up no distributed training (each rank would train alone)",
            "check the accelerate config's distributed_type",
        )
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return accelerator, -1
    cfg = plugin.deepspeed_config
    for block in ("optimizer", "scheduler"):
        if block in cfg:
            fail(
                "deepspeed_config",
                f"the DeepSpeed JSON has an `{block}` block, but the recipe "
                "builds its own AdamW and constant learning rate",
                f"delete the `{block}` block",
            )
    reconcile_with_deepspeed(args, cfg, accelerator)
    zero_stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
    if zero_stage == 3:  # the final save needs the 16-bit weights gathered (STACK.md)
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    accelerator.gradient_accumulation_steps = args.gradient_accumulation_steps
    return accelerator, zero_stage


# (DeepSpeed JSON key, recipe field)
DEEPSPEED_OWNED = (
    ("train_micro_batch_size_per_gpu", "per_device_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ("gradient_clipping", "max_grad_norm"),
)


@dataclasses.dataclass
class Run:
    """One process's place in the job: its accelerator and the batch arithmetic of a step."""

    accelerator: object
    zero_stage: int
    world: int
    rank: int
    per_rank: int  # rows (examples, pairs) this rank trains on per optimizer step
    rows_per_step: int


def setup_run(args: RunArgs, project: str) -> tuple[Run, str]:
    """Accelerator + batch arithmetic + output directory; returns (run, checkpoint to resume).

    For recipes that train on rows (sft, dpo); grpo counts prompts x generations instead.
    """
    accelerator, zero_stage = build_accelerator(args, project)
    per_rank = args.per_device_batch_size * args.gradient_accumulation_steps
    run = Run(
        accelerator,
        zero_stage,
        accelerator.num_processes,
        accelerator.process_index,
        per_rank,
        per_rank * accelerator.num_processes,
    )
    return run, claim_output_dir(accelerator, args)


def checkpoint_on_schedule(run: Run, args: RunArgs, step: int) -> None:
    """Every `--save-every` steps and at the last one, a checkpoint of a row-based recipe (sft,
    dpo): its state records how many rows a step takes, which a resume checks."""
    if not args.save_every or (step % args.save_every and step != args.max_steps):
        return
    state = {
        "step": step,
        "rows_per_step": run.rows_per_step,
        "rows_seen": step * run.rows_per_step,
    }
    save_checkpoint(run.accelerator, args.output_dir, step, state, args.save_total_limit)


def start_progress(accelerator, project: str, args, start_step: int):
    """Trackers (tensorboard if installed) and the progress bar of the main loop."""
    from tqdm.auto import tqdm

    accelerator.init_trackers(project, config=dataclasses.asdict(args))
    return tqdm(
        total=args.max_steps,
        initial=start_step,
        desc=project,
        disable=not accelerator.is_main_process,
    )


def reconcile_with_deepspeed(args: RunArgs, cfg: dict, accelerator) -> None:
    """A number in the JSON wins over the flag (said when they differ); "auto" takes the flag."""
    for key, field in DEEPSPEED_OWNED:
        flag = getattr(args, field)
        value = cfg.get(key, "auto")
        if value == "auto":
            cfg[key] = flag
        elif value != flag:
            note(
                f"{field} {flag} -> {value}: the DeepSpeed config's `{key}` wins "
                "(set it to \"auto\" to use the flag)",
                accelerator,
            )
            setattr(args, field, type(flag)(value))


def prepare_reference(ref, accelerator, zero_stage: int, dtype):
    """Frozen reference model: sharded through its own DeepSpeed engine under ZeRO-3 (its
    parameters would not fit replicated), else a replica on each device in the policy's dtype."""
    ref.requires_grad_(False).eval()
    if zero_stage != 3:
        return ref.to(accelerator.device, dtype=dtype)
    import deepspeed

    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    cfg = {k: v for k, v in ds_config.items() if k not in ("optimizer", "scheduler")}
    engine = deepspeed.initialize(model=ref, config=cfg)[0]
    engine.eval()  # DeepSpeedEngine.eval() returns None, so not chained
    return engine


def describe_setup(accelerator, zero_stage: int) -> str:
    stage = zero_stage if zero_stage >= 0 else "off"
    return f"{accelerator.num_processes} process(es), ZeRO stage {stage}"


# ----------------------------------------------------------------------------- run directory
ARTIFACTS = re.compile(
    r"^(checkpoint-\d+|\.tmp-.*|latest|latest\.tmp|metrics\.jsonl|final"
    r"|ref_logps\.pt|sft|dpo|grpo)$"
)  # the last three: tensorboard logs


def decide_start(args: RunArgs) -> str:
    """Where this run starts: a checkpoint directory to resume from, or "" for a fresh start.

    Every rank calls it before any rank writes (the caller waits for everyone afterwards).
    A fresh start in a non-empty directory needs --overwrite, so a crash can never resume an
    older run's `latest`."""
    out = args.output_dir
    if args.resume_from in ("latest", "auto"):
        found = find_resumable_checkpoint(out)
        if found:
            return found
        if args.resume_from == "latest":
            fail(
                "resume_from",
                f"no complete checkpoint in {out}",
                "start without --resume-from, or use --resume-from auto",
            )
    elif args.resume_from:
        problem = checkpoint_problem(args.resume_from)
        if problem:
            fail(
                "resume_from",
                f"{args.resume_from}: {problem}",
                "pass `latest` or a complete checkpoint-STEP directory",
            )
        return args.resume_from
    if os.path.isdir(out) and os.listdir(out) and not args.overwrite and args.resume_from != "auto":
        fail(
            "output_dir",
            f"{out} is not empty (an earlier run?)",
            "add --resume-from latest to continue it, --overwrite to start over, "
            "or pick another --output-dir",
        )
    return ""


def claim_output_dir(accelerator, args: RunArgs) -> str:
    """decide_start on every rank, then (fresh start) the main process clears old artifacts.
    Returns the checkpoint to resume from, or ""."""
    resume_path = decide_start(args)
    accelerator.wait_for_everyone()  # every rank decided before the main process touches files
    if accelerator.is_main_process and not resume_path:
        start_fresh_directory(args.output_dir)
    accelerator.wait_for_everyone()
    return resume_path


def check_resume_state(state: dict, key: str, value: int, what: str) -> None:
    """The data order is a function of (step, rows per step): a different batch would shift it."""
    if state.get(key) != value:
        fail(
            "resume_from",
            f"the checkpoint used {state.get(key)} {what} per step, this run {value}",
            "resume with the same global batch (micro-batch x processes x accumulation)",
        )


def start_fresh_directory(output_dir: str) -> None:
    """Main process, fresh start: remove what an earlier run of a recipe left (nothing else)."""
    os.makedirs(output_dir, exist_ok=True)
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if not ARTIFACTS.match(name):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


# ----------------------------------------------------------------------------- checkpoints
def fsync_path(path: str) -> None:
    """Flush a file's or a directory's entry to disk (a directory fsync makes renames durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, text: str) -> None:
    """Write via a temp file + fsync + rename, then fsync the directory: old or new, never torn."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def list_files(root: str) -> dict[str, int]:
    """{relative path: size} of every file under root."""
    sizes = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            sizes[os.path.relpath(path, root)] = os.path.getsize(path)
    return sizes


def checkpoint_step(name: str) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(os.path.normpath(name)))
    return int(match.group(1)) if match else -1


def save_checkpoint(accelerator, output_dir: str, step: int, state: dict, keep: int = 0) -> None:
    """checkpoint-STEP via a temp dir, fsynced, renamed; then `latest` moves; then old ones rotate.

    A SIGKILL at any moment leaves `latest` naming a complete checkpoint. `trainer_state.json`
    is written last and lists every file with its size, so a truncated file is detected."""
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp = os.path.join(output_dir, f".tmp-checkpoint-{step}")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that a crash cut short
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)  # every rank writes its own shards + RNG state
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        files = list_files(tmp)
        for name in files:
            fsync_path(os.path.join(tmp, name))
        write_atomic(os.path.join(tmp, "trainer_state.json"), json.dumps({**state, "files": files}))
        shutil.rmtree(final, ignore_errors=True)  # a broken one from before a resume
        os.replace(tmp, final)
        fsync_path(output_dir)
        write_atomic(os.path.join(output_dir, "latest"), os.path.basename(final))
        if keep:
            rotate_checkpoints(output_dir, keep)
    accelerator.wait_for_everyone()


def rotate_checkpoints(output_dir: str, keep: int) -> None:
    """Delete all but the newest `keep` checkpoint-STEP directories (--save-total-limit)."""
    steps = sorted(checkpoint_step(n) for n in os.listdir(output_dir) if checkpoint_step(n) >= 0)
    for step in steps[:-keep]:
        shutil.rmtree(os.path.join(output_dir, f"checkpoint-{step}"), ignore_errors=True)


def checkpoint_problem(path: str) -> str:
    """ "" when `path` is a complete checkpoint, else what is wrong with it."""
    state_path = os.path.join(path, "trainer_state.json")
    if not os.path.isfile(state_path):
        return "no trainer_state.json (not a checkpoint, or its save was cut off)"
    try:
        with open(state_path) as f:
            state = json.load(f)
    except (OSError, json.JSONDecodeError):
        return "trainer_state.json is unreadable"
    for name, size in state.get("files", {}).items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f"{name} is missing"
        if os.path.getsize(file) != size:
            return f"{name} has {os.path.getsize(file)} of {size} bytes"
    return ""


def find_resumable_checkpoint(output_dir: str) -> str:
    """The newest complete checkpoint in output_dir ("" if none); damaged newer ones are named."""
    if not os.path.isdir(output_dir):
        return ""
    names = [n for n in os.listdir(output_dir) if checkpoint_step(n) >= 0]
    for name in sorted(names, key=checkpoint_step, reverse=True):
        path = os.path.join(output_dir, name)
        problem = checkpoint_problem(path)
        if not problem:
            return path
        note(f"skipping {path}: {problem}; trying the one before")
    return ""


def read_checkpoint_state(path: str) -> dict:
    with open(os.path.join(path, "trainer_state.json")) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- metrics
class MetricsLog:
    """metrics.jsonl: one JSON line per step, written by the main process only.

    On resume, lines of steps after the checkpoint (lost in the crash) and a torn last line are
    dropped, so every step appears exactly once."""

    def __init__(self, accelerator, output_dir: str, start_step: int):
        self.accelerator = accelerator
        self.path = os.path.join(output_dir, "metrics.jsonl")
        if accelerator.is_main_process:
            kept = [row for row in read_metrics(self.path) if row["step"] <= start_step]
            write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in kept))

    def write(self, metrics: dict) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as f:
                f.write(json.dumps(metrics) + "\n")


def read_metrics(path: str) -> list[dict]:
    """Rows of a metrics.jsonl; a torn (half-written) line is skipped."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
    return rows


# ----------------------------------------------------------------------------- final model
def save_final_model(accelerator, model, tokenizer, output_dir: str, program: str) -> None:
    """The model in HF format in output_dir/final (16-bit weights gathered under ZeRO-3).

    Written to a temp dir and renamed, so `final` is never half-written. Reload it in a separate
    process: loading on rank 0 inside the run hangs the other ranks (STACK.md)."""
    state_dict = accelerator.get_state_dict(model)  # collective: every rank must call it
    if accelerator.is_main_process:
        final = os.path.join(output_dir, "final")
        tmp = os.path.join(output_dir, ".tmp-final")
        shutil.rmtree(tmp, ignore_errors=True)
        accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        accelerator.print(f"{program}: final model in {final}")
    accelerator.wait_for_everyone()
