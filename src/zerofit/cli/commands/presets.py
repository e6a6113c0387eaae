"""`zerofit presets`: list the shipped DeepSpeed/accelerate presets, or regenerate them."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser(
        "presets",
        help="list the deepspeed_configs/ presets, or write them",
        description="List the preset DeepSpeed JSON and accelerate YAML files with when to use "
        "each; --write regenerates them from the builder.",
    )
    p.add_argument("--write", action="store_true", help="write the presets into --dir")
    p.add_argument(
        "--dir", default="deepspeed_configs", help="target directory (default: deepspeed_configs)"
    )
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from zerofit.configs.presets import describe_presets, render_presets

    if args.write:
        from zerofit.files import write_files

        for path in write_files(args.dir, render_presets(), force=args.force):
            print(f"wrote {path}")
        return 0
    rows = describe_presets()
    if args.json:
        print(json.dumps([{"file": f, "use_when": why} for f, why in rows], indent=2))
        return 0
    width = max(len(f) for f, _ in rows)
    for f, why in rows:
        print(f"{f:<{width}}  {why}")
    print("\nfiles live in deepspeed_configs/ (regenerate: zerofit presets --write --force)")
    return 0
