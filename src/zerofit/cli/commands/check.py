"""`zerofit check FILE|DIR...`: validate DeepSpeed JSON and accelerate YAML, alone and together,
and zerofit's own answers.yaml as answers; `zerofit check --training X` alone: the training setup
against the DeepSpeed JSON it names."""

from __future__ import annotations

import json
from pathlib import Path

from zerofit.errors import ZerofitError


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="validate DeepSpeed JSON and accelerate YAML files",
        description="Report every problem in DeepSpeed JSON / accelerate YAML files at once, each "
        "with its field path and fix. A YAML's deepspeed_config_file is checked with it, as "
        "DeepSpeed JSON whatever its name. Keys and values are judged by the installed "
        "DeepSpeed and accelerate (their own config classes and loader); zerofit's cross-file "
        "rules come on top. With --training and no FILE, the DeepSpeed JSON the training "
        "setup names is checked with it. A directory stands for its *.json / *.yaml / *.yml "
        "files, so `zerofit check OUT` checks what `zerofit config --out OUT` wrote; zerofit's "
        "own answers.yaml is checked as `zerofit config --answers` reads it, not as accelerate. "
        "Exit 0 clean or warnings only, 1 errors (or warnings with --strict), 2 usage error.",
    )
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="*.json (DeepSpeed) and *.yaml (accelerate, or zerofit's answers) files, or a "
        "directory of them (optional with --training)",
    )
    p.add_argument("--gpu", help="target GPU type (checks bf16 support), e.g. V100")
    p.add_argument(
        "--client",
        choices=("trainer", "accelerate", "deepspeed"),
        help='who runs the files, which decides the "auto" values that get filled: trainer '
        "(HF Trainer / TRL), accelerate (your loop under accelerate launch), deepspeed "
        "(deepspeed.initialize / the deepspeed launcher: no \"auto\" at all)",
    )
    p.add_argument("--trainer", action="store_true", help="same as --client trainer")
    p.add_argument(
        "--training",
        metavar="YAML_OR_COMMAND",
        help="how the model is trained: a TRL / LLaMA-Factory YAML, or the training command in "
        "quotes ('accelerate launch ... train.py --load_in_4bit ...'); adds the LoRA / QLoRA / "
        "pre-quantized model rules under ZeRO-3, and reads the DeepSpeed JSON it names",
    )
    p.add_argument("--strict", action="store_true", help="warnings count as errors (exit 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ZerofitError(path, "does not exist", "give an existing file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ZerofitError(
            path,
            f"cannot be read ({getattr(exc, 'strerror', None) or exc})",
            "give a readable text file",
        ) from None


def run(args) -> int:
    from zerofit.configs.check import answers_files, check_files, engine

    if not args.files and not args.training:
        raise ZerofitError(
            "check",
            "no file to check",
            "give DeepSpeed JSON / accelerate YAML files, or --training YAML_OR_COMMAND",
        )
    gpu_bf16 = None
    if args.gpu:
        from zerofit.hardware import lookup

        gpu_bf16 = lookup(args.gpu).bf16
    client = args.client or ("trainer" if args.trainer else None)
    texts = {path: _read(path) for path in _expand_directories(args.files)}
    training = _read_training(args.training, texts) if args.training else None
    texts.update(_referenced(texts))
    problems = check_files(
        texts,
        gpu_bf16=gpu_bf16,
        client=client,
        exists=lambda p: Path(p).is_file(),
        training=training,
    )
    judge = engine()
    errors = [p for p in problems if p.severity != "warning" or args.strict]
    answers = answers_files(texts)
    if args.json:
        report = {
            "files": list(texts),
            "answers_files": answers,
            "checked_with": judge,
            "problems": [p.to_dict() for p in problems],
        }
        print(json.dumps(report, indent=2))
        return 1 if errors else 0
    for name in answers:
        print(
            f"note: {name} is zerofit's answers file: checked as `zerofit config --answers` "
            "reads it, not as an accelerate config"
        )
    for p in problems:
        prefix = "warning: " if p.severity == "warning" else ""
        print(prefix + p.render())
    if not errors:
        n = f"{len(texts)} file{'s' if len(texts) != 1 else ''}"
        warned = len(problems)
        print(
            f"ok: {n}"
            + (f", {warned} warning{'s' if warned != 1 else ''}" if warned else ", no problems")
            + f" (checked with {judge})"
        )
    return 1 if errors else 0


def _expand_directories(paths: list[str]) -> list[str]:
    """``paths`` with each directory replaced by its *.json, *.yaml and *.yml files, sorted (not
    its subdirectories): `zerofit config --out DIR` writes its files side by side there."""
    expanded: list[str] = []
    for path in paths:
        if not Path(path).is_dir():
            expanded.append(path)
            continue
        found = sorted(
            str(Path(path) / entry.name)
            for entry in Path(path).iterdir()
            if entry.is_file() and entry.suffix.lower() in (".json", ".yaml", ".yml")
        )
        if not found:
            raise ZerofitError(
                path,
                "is a directory with no .json, .yaml or .yml file to check",
                "give the directory `zerofit config --out` wrote, or the files themselves",
            )
        expanded += [name for name in found if name not in expanded]
    return expanded


def _read_training(value: str, texts: dict[str, str]):
    """The ``--training`` setup, with the files it names added to ``texts``: the DeepSpeed JSON
    of a TRL / LLaMA-Factory YAML or `--deepspeed` flag when that file exists, and the accelerate
    YAML of `accelerate launch --config_file X` (whose deepspeed_config_file check then reads).
    Without any FILE, those are all there is to judge the setup against, so one must be named
    and exist."""
    from zerofit.configs.check.training import read_training

    training = read_training(value, _read)
    given_files = bool(texts)
    for named in (training.deepspeed, training.accelerate_config):
        if named and named not in texts and (Path(named).is_file() or not given_files):
            texts[named] = _read(named)  # a named file that is missing is a one-line error
    if not texts:
        where = "the command" if training.source == "command" else training.source
        raise ZerofitError(
            "--training",
            f"{where} names no DeepSpeed config (no `deepspeed:` key, --deepspeed flag or "
            "accelerate --config_file) to check it against",
            "give the DeepSpeed JSON or accelerate YAML too: zerofit check ds_config.json "
            "--training ...",
        )
    return training


def _referenced(texts: dict[str, str]) -> dict[str, str]:
    """Files named by a given YAML's deepspeed_config_file, read when they exist (check reads
    them as DeepSpeed JSON whatever their name, as accelerate does)."""
    from zerofit.configs.check import referenced_files

    extra = {}
    for ref in referenced_files(texts):
        if not Path(ref).is_file() or any(
            Path(n).resolve() == Path(ref).resolve() for n in [*texts, *extra]
        ):
            continue
        try:
            extra[ref] = Path(ref).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return extra
