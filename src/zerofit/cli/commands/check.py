"""`zerofit check FILE...`: validate DeepSpeed JSON and accelerate YAML, alone and together."""

from __future__ import annotations

import json
from pathlib import Path

from zerofit.errors import ZerofitError


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="validate DeepSpeed JSON and accelerate YAML files",
        description="Report every problem in DeepSpeed JSON / accelerate YAML files at once, each with its "
        "field path and fix. A YAML's deepspeed_config_file is checked with it. Keys and values "
        "are judged by the installed DeepSpeed and accelerate (their own config classes and "
        "loader); zerofit's cross-file rules come on top. "
        "Exit 0 clean or warnings only, 1 errors (or warnings with --strict), 2 usage error.",
    )
    p.add_argument(
        "files", nargs="+", metavar="FILE", help="*.json (DeepSpeed) and *.yaml (accelerate) files"
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
    from zerofit.configs.check import check_files

    gpu_bf16 = None
    if args.gpu:
        from zerofit.hardware import lookup

        gpu_bf16 = lookup(args.gpu).bf16
    from zerofit.configs.check import engine

    client = args.client or ("trainer" if args.trainer else None)
    texts = {path: _read(path) for path in args.files}
    texts.update(_referenced(texts))
    problems = check_files(
        texts, gpu_bf16=gpu_bf16, client=client, exists=lambda p: Path(p).is_file()
    )
    judge = engine()
    errors = [p for p in problems if p.severity != "warning" or args.strict]
    if args.json:
        print(
            json.dumps(
                {
                    "files": list(texts),
                    "checked_with": judge,
                    "problems": [p.to_dict() for p in problems],
                },
                indent=2,
            )
        )
    else:
        for p in problems:
            prefix = "warning: " if p.severity == "warning" else ""
            print(prefix + p.render())
        n = f"{len(texts)} file{'s' if len(texts) != 1 else ''}"
        if not errors:
            warned = len(problems)
            print(
                f"ok: {n}"
                + (f", {warned} warning{'s' if warned != 1 else ''}" if warned else ", no problems")
                + f" (checked with {judge})"
            )
        elif "tables" in judge:
            print(
                f"note: checked with {judge}; install deepspeed and accelerate for their own checks"
            )
    return 1 if errors else 0


def _referenced(texts: dict[str, str]) -> dict[str, str]:
    """DeepSpeed JSON files named by a given YAML's deepspeed_config_file, read when they exist."""
    import yaml

    extra = {}
    for name, text in texts.items():
        if not name.lower().endswith((".yaml", ".yml")):
            continue
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        ds = data.get("deepspeed_config") if isinstance(data, dict) else None
        ref = ds.get("deepspeed_config_file") if isinstance(ds, dict) else None
        if (
            isinstance(ref, str)
            and Path(ref).is_file()
            and not any(Path(n).resolve() == Path(ref).resolve() for n in texts)
        ):
            try:
                extra[ref] = Path(ref).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
    return extra
