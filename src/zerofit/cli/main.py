"""`zerofit` entry point: argument parsing and error reporting; commands live in cli/commands/.

Start-up must stay fast: nothing here (or in a command's ``register``) may import torch,
deepspeed or transformers; commands import heavy modules inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from zerofit import __version__
from zerofit.errors import ZerofitError

# Each name is a module zerofit.cli.commands.<name> with register(subparsers) that sets `func`.
COMMANDS = ("wizard", "estimate", "plan", "config", "check", "presets", "launch", "doctor")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="zerofit",
        description="Fit accelerate + DeepSpeed ZeRO configs to your model, GPUs and workload.",
    )
    parser.add_argument("--version", action="version", version=f"zerofit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"zerofit.cli.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 problems found, 2 usage error)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        if sys.stdin.isatty() and sys.stdout.isatty():
            argv = ["wizard"]
        else:
            parser.print_help()
            return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its message
        return int(exc.code or 0)
    try:
        return int(args.func(args) or 0)
    except ZerofitError as err:
        print(f"zerofit: error: {err.render()}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("zerofit: aborted, nothing written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `zerofit plan | head`: the reader left; silence the flush at exit too.
        sys.stdout = open(os.devnull, "w")
        return 0


if __name__ == "__main__":
    sys.exit(main())
