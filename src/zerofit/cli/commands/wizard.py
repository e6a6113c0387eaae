"""`zerofit wizard`: ask a few questions, show the plan, let the user change it, write the configs.

Only stdlib and light zerofit modules at import time (cli imports every command to register it);
questionary, rich and the planner are imported in ``run``, after argument parsing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zerofit.cli.answer_flags import add_answer_flags, answers_from_args
from zerofit.errors import ZerofitError

DEFAULT_OUT = "zerofit_out"
SCRIPT = "your_script.py"  # placeholder in the printed launch commands


def register(sub) -> None:
    p = sub.add_parser(
        "wizard",
        help="interactive: ask about model, GPUs and workload; show the plan; write the configs",
        description="Ask about the model, GPUs, nodes and workload (flags and --answers pre-fill "
        "the answers), show the plan with its memory breakdown, let you override any decision or "
        "change any answer, then write ds_config.json, accelerate.yaml and answers.yaml into "
        "--out. Nothing is written before the end; Ctrl-C leaves no file. `zerofit config "
        "--answers OUT/answers.yaml --out OUT` reproduces the same files.",
    )
    add_answer_flags(p)
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"directory to write into (default: {DEFAULT_OUT})",
    )
    p.add_argument("--force", action="store_true", help="overwrite existing files in --out")
    p.add_argument(
        "--save-default",
        action="store_true",
        help="also write accelerate.yaml as accelerate's default config "
        "($HF_HOME/accelerate/default_config.yaml), so `accelerate launch "
        "script.py` uses it",
    )
    p.add_argument(
        "--defaults",
        action="store_true",
        help="accept every default without prompting (with --answers: use the file as is)",
    )
    p.set_defaults(func=run)


def given_fields(args) -> set[str]:
    """Answers fields the user fixed with a flag or in the --answers file (detection must not
    override them)."""
    from zerofit.planning.answers import Answers, answers_to_dict

    names = answers_to_dict(Answers())  # every Answers field, dataclass or not
    given = {name for name in names if getattr(args, name, None) is not None}
    if getattr(args, "answers", None):
        import yaml

        try:
            data = yaml.safe_load(Path(args.answers).read_text()) or {}
        except (OSError, yaml.YAMLError):
            data = {}  # answers_from_args already reported an unreadable file
        given |= set(data) if isinstance(data, dict) else set()
    return given


def prefill(base, given: set[str], detected: tuple[str | None, int]):
    """``base`` with the detected GPU type and count where the user gave neither."""
    key, count = detected
    changes = {}
    if key and "gpu" not in given:
        changes["gpu"] = key
    if count and "gpus_per_node" not in given:
        changes["gpus_per_node"] = count
    return base.replace(**changes) if changes else base


def _builtin_models() -> list[tuple[str, str]]:
    from zerofit.models.resolve import BUILTIN_MODELS, model_names

    out = []
    for name in model_names():
        spec = BUILTIN_MODELS.get(name)
        out.append((name, f"{spec.params / 1e9:.1f}B" if spec else ""))
    return out


def _check_out(out: Path, force: bool) -> None:
    """Fail before the first question, not after the last, when --out already holds the files."""
    from zerofit.configs.outputs import FILE_NAMES

    existing = [str(out / n) for n in FILE_NAMES if (out / n).exists()]
    if existing and not force:
        raise ZerofitError(
            "--out",
            f"{', '.join(existing)} already exist",
            "pass --force to overwrite, " "or choose another --out directory",
        )


def run(args) -> int:
    interactive = not args.defaults and sys.stdin.isatty() and sys.stdout.isatty()
    if not interactive and not args.defaults and not args.answers:
        raise ZerofitError(
            "wizard",
            "needs a terminal to ask its questions",
            "pass --defaults to accept every default, or --answers FILE to use an answers.yaml",
        )
    from zerofit.cli.commands.config import check_out_dir

    out = check_out_dir(args.out)
    _check_out(out, args.force)
    base = answers_from_args(args)
    from zerofit import hardware

    detected = hardware.detect_local_gpus()
    base = prefill(base, given_fields(args), detected)

    from zerofit.wizard import prompts as wizard
    from zerofit.wizard.questions import build_questions, start_answers

    # rich costs ~60 ms: created on first print, after the first question is on screen.
    console = wizard.LazyConsole(
        highlight=False, soft_wrap=True
    )  # commands and paths stay copy-pastable
    term = wizard.Terminal(console)
    questions = build_questions(base, detected, _builtin_models() if interactive else ())
    start = start_answers(base)
    answers = wizard.collect_answers(questions, start, term, defaults=not interactive)
    if interactive:
        from zerofit.planning.plan import plan as planner

        reviewed = wizard.review_plan(answers, planner, term, questions, start)
        if reviewed is None:
            console.print("nothing written")
            return 1
        answers = reviewed[0]
    return finish(
        answers,
        out,
        args.force,
        console,
        show=not interactive,
        save_default=getattr(args, "save_default", False),
    )


def finish(
    answers, out: Path, force: bool, console, show: bool = False, save_default: bool = False
) -> int:
    """Build and write the files exactly as `zerofit config --out OUT` does, then print the launch
    commands."""
    from zerofit.configs.outputs import build_files
    from zerofit.files import write_files
    from zerofit.wizard import prompts as wizard

    # Same ds_config_file as `zerofit config`, so `config --answers OUT/answers.yaml --out OUT`
    # reproduces these files byte for byte.
    plan, files = build_files(answers, ds_config_file=str(Path(out).resolve() / "ds_config.json"))
    if show:
        wizard.show_plan(plan, console)
    default = None
    if save_default:
        from zerofit.cli.commands.config import check_default_target

        default = check_default_target(force)  # before writing anything: all files or none
    paths = write_files(out, files, force=force)
    if default is not None:
        from zerofit.cli.commands.config import save_default as write_default

        paths += write_default(files["accelerate.yaml"], default, force)
    for path in paths:
        console.print(f"wrote {path}")
    console.print()
    for line in render_launch_lines(plan, out):
        console.print(line)
    return 0


def render_launch_lines(plan, out: Path, script: str = SCRIPT) -> list[str]:
    """What to run on each node: one accelerate command per machine_rank, or the launcher's form.

    accelerate.yaml already holds the node count, main address/port and launcher, and a flag given
    on the command line overrides the file, so node R only adds ``--machine_rank R``.
    """
    cfg = str(out / "accelerate.yaml")
    a = plan.answers
    if a.num_nodes == 1:
        return ["Run it:", f"  accelerate launch --config_file {cfg} {script}"]
    if a.launcher == "torchrun":
        from zerofit.configs.accelerate_yaml import build_accelerate_config
        from zerofit.launch.cluster_config import build_spec
        from zerofit.launch.commands import build_torchrun_cmd
        from zerofit.launch.render import quote_cmd

        config = build_accelerate_config(plan, ds_config_file=str(out / "ds_config.json"))
        spec, _ = build_spec([config], (cfg,), style="torchrun", script=script)
        env = "".join(f"  export {k}={v}\n" for k, v in spec.accelerate_env)
        return [
            f"Run the same commands on each of the {a.num_nodes} nodes (c10d assigns the ranks):",
            env + "  " + quote_cmd(build_torchrun_cmd(spec, 0), tail=1, indent="    "),
        ]
    lines = [f"Run on each of the {a.num_nodes} nodes (only --machine_rank differs):"]
    lines += [
        f"  node {r}: accelerate launch --config_file {cfg} --machine_rank {r} {script}"
        for r in range(a.num_nodes)
    ]
    if a.launcher != "accelerate":
        lines += [
            f"{a.launcher} scripts:",
            f"  zerofit launch --config {cfg} --style {a.launcher} --out launch -- {script}",
        ]
    else:
        lines += [
            "Per-node scripts with NCCL settings:",
            f"  zerofit launch --config {cfg} --out launch -- {script}",
        ]
    return lines
