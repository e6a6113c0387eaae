"""Wizard flows through questionary's pipe input (no terminal), plan rendering and the command's
rules.

Run: .venv/bin/python -m pytest tests/wizard/test_prompts.py -q
Keys sent: "\\r" Enter, "\\x1b[B" arrow down, "\\x15" Ctrl-U (clear the pre-filled default).
"""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest
from conftest import build_plan
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from zerofit.cli.commands import wizard as cmd
from zerofit.cli.main import main
from zerofit.errors import ZerofitError
from zerofit.planning.answers import Answers, answers_to_dict
from zerofit.planning.plan import Alternative, Decision
from zerofit.wizard import prompts as wizard
from zerofit.wizard import questions as Q

DOWN, CLEAR = "\x1b[B", "\x15"
MODELS = [("qwen2.5-0.5b", "0.5B"), ("qwen2.5-7b", "7.6B"), ("llama-3.1-8b", "8.0B")]


def fake_planner(answers: Answers):
    """Stage 2 by default; peak 90 GiB at stage <= 1 (does not fit an 80 GB H100), 40 at 2, 20 at
    3."""
    stage = 2 if answers.stage is None else answers.stage
    peak = {0: 90.0, 1: 90.0, 2: 40.0, 3: 20.0}[stage]
    fields = answers_to_dict(answers)
    fields.update(
        stage=stage, micro_batch=answers.micro_batch or 2, precision=answers.precision or "bf16"
    )
    p = build_plan(
        params=7_600_000_000, hidden_size=3584, peak_gib=peak, fits=peak <= 79.6 * 0.9, **fields
    )
    return dataclasses.replace(
        p,
        answers=answers,
        breakdown_gib={"weights": peak / 4, "optimizer": peak / 4, "activations": peak / 2},
        decisions=(
            Decision("stage", stage, "smallest stage that fits"),
            Decision("micro_batch", p.micro_batch, "largest that fits"),
        ),
        alternatives=(
            Alternative(2, "none", "none", False, 2, 40.0, True),
            Alternative(1, "none", "none", False, 2, 90.0, False),
        ),
    )


def terminal(inp) -> wizard.Terminal:
    return wizard.Terminal(
        Console(file=io.StringIO(), width=120, color_system=None), inp, DummyOutput()
    )


def questions(base=None, check=None):
    qs = Q.build_questions(base or Answers(), (None, 0), MODELS)
    return tuple(dataclasses.replace(q, check=check) if q.name == "model" else q for q in qs)


def test_single_node_sft_flow_with_an_override():
    with create_pipe_input() as inp:
        inp.send_text(
            CLEAR
            + "qwen2.5-7b\r"  # model
            + DOWN
            + "\r"  # GPU: H100-SXM -> A100-80GB
            + CLEAR
            + "8\r"  # GPUs per node
            + "\r"  # nodes: 1 (no address/port/launcher questions)
            + "\r"  # workload: sft
            + CLEAR
            + "4096\r"  # seq_len
            + "64\r"  # global batch
            + "\r"  # precision: bf16 (A100 has it); no loss question: the loss path does not
            # change this plan's pick (test_questions.py covers when it is asked)
        )
        inp.send_text(DOWN + "\r" + DOWN * 4 + "\r" + "\r")  # change stage -> ZeRO-3  # accept
        term = terminal(inp)
        answers = Q.start_answers(Answers())
        got = wizard.collect_answers(questions(), answers, term)
        reviewed, plan = wizard.review_plan(got, fake_planner, term)
    # precision stays None ("follow the GPU"): the user took the GPU's own default, as
    # `zerofit config` would
    assert got == Answers(
        model="qwen2.5-7b", gpu="A100-80GB", gpus_per_node=8, seq_len=4096, global_batch=64
    )
    assert reviewed == got.replace(stage=3)
    assert plan.stage == 3 and plan.peak_gib == 20.0
    text = term.console.file.getvalue()
    assert "peak 20.0 GiB per GPU of 79.15 GiB" in text
    assert "(was 40.0 GiB, fits)" in text
    assert "? New ZeRO stage" not in text  # prompts go to the prompt output, not the console
    # the re-estimate is shown at once, against the previous plan
    assert re.search(r"stage +3 \* +smallest stage that fits", text)  # overrides are marked
    assert "on 8 x A100-80GB (79.15 GiB) x 1 node, bf16, sft, seq 4096" in text


def test_multi_node_grpo_flow_asks_the_conditional_questions_and_rechecks_the_model():
    checked = []

    def check(ref):
        checked.append(ref)
        return True if ref == "qwen2.5-0.5b" else f"model: unknown model {ref!r}"

    with create_pipe_input() as inp:
        inp.send_text(
            CLEAR
            + "qwen9\r"  # fails the check after Enter: asked again
            + CLEAR
            + "qwen2.5-0.5b\r"
            + "\r"
            + CLEAR
            + "4\r"
            + CLEAR
            + "2\r"  # H100-SXM, 4 GPUs, 2 nodes
            + CLEAR
            + "10.0.0.1\r"
            + CLEAR
            + "29511\r"  # main address and port
            + DOWN
            + "\r"  # launcher: torchrun
            + "1024\r"  # the nodes' RAM: asked, the plan is for other machines
            + "\r"  # the network between nodes: blank, 100 Gbit/s
            + DOWN * 2
            + "\r"  # workload: grpo
            + CLEAR
            + "8\r"
            + CLEAR
            + "512\r"  # num_generations, completion_len
            + CLEAR
            + "1024\r"
            + "32\r"
            + "\r"  # seq_len, global batch, precision
            + "\r"
            + "\r"  # stack, weights dtype: the predicted fastest plan differs by them: defaults
        )
        term = terminal(inp)
        got = wizard.collect_answers(questions(check=check), Q.start_answers(Answers()), term)
    assert checked == ["qwen9", "qwen2.5-0.5b"]
    assert "model: unknown model 'qwen9'" in term.console.file.getvalue()
    assert got == Answers(
        model="qwen2.5-0.5b",
        gpus_per_node=4,
        num_nodes=2,
        main_process_ip="10.0.0.1",
        main_process_port=29511,
        launcher="torchrun",
        host_ram_gib=1024.0,
        workload="grpo",
        num_generations=8,
        completion_len=512,
        seq_len=1024,
        global_batch=32,
    )


def test_an_override_that_does_not_fit_is_warned_not_blocked():
    with create_pipe_input() as inp:
        inp.send_text(DOWN + "\r" + DOWN * 2 + "\r" + "\r")  # stage -> ZeRO-1, then accept
        term = terminal(inp)
        reviewed, plan = wizard.review_plan(Answers(), fake_planner, term)
    assert reviewed.stage == 1 and plan.fits is False
    assert (
        "warning: this plan is estimated NOT to fit in GPU memory" in term.console.file.getvalue()
    )


def test_a_planner_error_after_an_override_undoes_it():
    def planner(a):
        if a.offload_param == "cpu" and a.stage != 3:
            raise ZerofitError("offload_param", "needs ZeRO-3", "set stage 3")
        return fake_planner(a)

    with create_pipe_input() as inp:
        # parameter offload -> cpu (refused); the same question comes back: keep auto; accept
        inp.send_text(DOWN * 3 + "\r" + DOWN * 2 + "\r" + "\r" + "\r")
        term = terminal(inp)
        reviewed, _ = wizard.review_plan(Answers(), planner, term)
    assert reviewed == Answers()
    shown = term.console.file.getvalue()
    assert "offload_param: needs ZeRO-3 (fix: set stage 3) - override undone" in shown


def test_a_refused_override_asks_the_same_question_not_the_menu():
    """After a refusal one Enter must not write the files: it answers the re-asked question."""
    asked = []

    def planner(a):
        asked.append(a.offload_param)
        if a.offload_param == "cpu" and a.stage != 3:
            raise ZerofitError("offload_param", "needs ZeRO-3", "set stage 3")
        return fake_planner(a)

    with create_pipe_input() as inp:
        # offload -> cpu (refused), then at the re-asked question pick "none", then accept
        inp.send_text(DOWN * 3 + "\r" + DOWN * 2 + "\r" + DOWN + "\r" + "\r")
        term = terminal(inp)
        reviewed, plan = wizard.review_plan(Answers(), planner, term)
    assert reviewed.offload_param == "none"
    assert asked == [None, "cpu", "none"]


def test_an_override_answers_refuses_is_asked_again(monkeypatch):
    """Answers' own validation refusing a value re-asks it instead of returning to the menu."""
    real = Answers.replace
    calls = []

    def picky(self, **changes):
        calls.append(changes)
        if changes.get("stage") == 0:
            raise ZerofitError("stage", "0 is refused here", "pick another")
        return real(self, **changes)

    monkeypatch.setattr(Answers, "replace", picky)
    with create_pipe_input() as inp:
        # stage -> ZeRO-0 (refused), asked again -> ZeRO-3, then accept
        inp.send_text(DOWN + "\r" + DOWN + "\r" + DOWN * 4 + "\r" + "\r")
        term = terminal(inp)
        reviewed, _ = wizard.review_plan(Answers(), fake_planner, term)
    assert reviewed.stage == 3
    assert [c.get("stage") for c in calls] == [0, 3]


def test_loopback_main_address_and_bad_ports_are_warned():
    assert "loopback" in Q.warn_main_address("127.0.0.1", {"num_nodes": 2})
    assert Q.warn_main_address("127.0.0.1", {"num_nodes": 1}) is None
    assert Q.warn_main_address("10.0.0.1", {"num_nodes": 2}) is None
    assert "ssh" in Q.warn_main_port(22, {})
    assert "privileged" in Q.warn_main_port(80, {})
    assert Q.warn_main_port(29500, {}) is None


def test_quit_returns_none():
    with create_pipe_input() as inp:
        inp.send_text("\x1b[A\r")  # up from "accept" wraps to "quit"
        assert wizard.review_plan(Answers(), fake_planner, terminal(inp)) is None


def test_defaults_take_the_same_walk_without_prompting():
    base = Answers(gpu="V100-32GB", gpus_per_node=2)
    got = wizard.collect_answers(questions(base), Q.start_answers(base), None, defaults=True)
    assert got == base  # fp16 is what V100 gets anyway: precision stays None


def test_memory_bar_against_capacity():
    plan = dataclasses.replace(
        build_plan(gpu="H100-SXM", peak_gib=40.0, headroom=0.9),
        breakdown_gib={"weights": 20.0, "optimizer": 10.0, "activations": 10.0},
    )
    plan = dataclasses.replace(
        plan, breakdown_gib={**plan.breakdown_gib, "cuda_context (not in peak)": 0.5}
    )
    # 79.6 GiB / 20 cells = 3.98 GiB per cell; the limit (0.9 x 79.6 = 71.6) falls in cell 18
    assert wizard.render_memory_bar(plan, width=20).plain.split("\n") == [
        "[█████▓▓▓▒▒·······|··]",
        "  █ weights 20.0",  # the legend wraps at the bar's width
        "  ▓ optimizer 10.0",
        "  ▒ activations 10.0",
        "  not drawn: cuda_context (not in peak) 0.5",
    ]
    assert (
        wizard.render_memory_bar(plan, width=60).plain.split("\n")[1]
        == "  █ weights 20.0  ▓ optimizer 10.0  ▒ activations 10.0"
    )


def test_memory_bar_when_the_plan_overflows():
    plan = dataclasses.replace(
        build_plan(gpu="A10", peak_gib=44.0, fits=False), breakdown_gib={"all": 44.0}
    )
    bar = wizard.render_memory_bar(plan, width=10).plain.split("\n")[0]
    assert bar == "[████!█████]"  # capacity 22 GiB of 44 -> the "!" sits at cell 5


def test_no_tty_without_defaults_or_answers_exits_2(capsys):
    assert main(["wizard"]) == 2
    err = capsys.readouterr().err
    assert "--defaults" in err and "--answers" in err and "Traceback" not in err


def test_existing_out_fails_before_any_question(tmp_path, capsys):
    (tmp_path / "ds_config.json").write_text("{}")
    assert main(["wizard", "--defaults", "--out", str(tmp_path)]) == 2
    assert "already exist" in capsys.readouterr().err


@pytest.mark.parametrize("out", ["", "cfg\nrm -rf x"])
def test_an_empty_or_multiline_out_fails_before_any_question(tmp_path, capsys, monkeypatch, out):
    # the directory's path is written into accelerate.yaml, where a newline ends the line early
    monkeypatch.chdir(tmp_path)
    assert main(["wizard", "--defaults", "--out", out]) == 2
    assert "--out" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_detection_fills_only_what_the_user_did_not_give(tmp_path):
    parser_args = cmd.given_fields
    path = tmp_path / "answers.yaml"
    path.write_text("gpu: L40S\n")
    ns = type("Args", (), {"answers": str(path), "gpus_per_node": None})()
    given = parser_args(ns)
    assert given == {"gpu"}
    got = cmd.prefill(Answers(gpu="L40S"), given, ("H100-SXM", 8))
    assert (got.gpu, got.gpus_per_node) == ("L40S", 8)
    assert cmd.prefill(Answers(), set(), (None, 0)) == Answers()


def test_launch_lines_per_node(tmp_path):
    plan = fake_planner(
        Answers(gpus_per_node=8, num_nodes=2, main_process_ip="10.0.0.1", global_batch=32)
    )
    lines = cmd.render_launch_lines(plan, Path("out"))
    assert lines == [
        "Run on each of the 2 nodes (only --machine_rank differs):",
        "  node 0: accelerate launch --config_file out/accelerate.yaml --machine_rank 0 "
        "your_script.py",
        "  node 1: accelerate launch --config_file out/accelerate.yaml --machine_rank 1 "
        "your_script.py",
        "Per-node scripts with NCCL settings:",
        "  zerofit launch --config out/accelerate.yaml --out launch -- your_script.py",
    ]
    torchrun = cmd.render_launch_lines(
        dataclasses.replace(plan, answers=plan.answers.replace(launcher="torchrun")), Path("out")
    )
    assert "export ACCELERATE_USE_DEEPSPEED=true" in torchrun[1]
    assert "--rdzv_endpoint 10.0.0.1:29500" in torchrun[1] and "--nproc_per_node 8" in torchrun[1]
    single = cmd.render_launch_lines(fake_planner(Answers()), Path("out"))
    assert single == [
        "Run it:",
        "  accelerate launch --config_file out/accelerate.yaml your_script.py",
    ]


def test_no_heavy_import_before_the_first_question(tmp_path):
    """torch/deepspeed/transformers/accelerate cost seconds each; none may load before the first
    prompt."""
    import subprocess
    import sys

    code = f"""
import sys
from zerofit.wizard import prompts as wizard
from zerofit.cli.main import main

class Tty:
    def __init__(self, f): self.f = f
    def isatty(self): return True
    def __getattr__(self, name): return getattr(self.f, name)

def first_prompt(q, answers, term, *args, **kwargs):
    heavy = [m for m in ("torch", "deepspeed", "transformers", "accelerate") if m in sys.modules]
    print("first question:", q.name, "heavy:", heavy, file=sys.__stderr__)
    raise KeyboardInterrupt

wizard.prompt = first_prompt
sys.stdin, sys.stdout = Tty(sys.stdin), Tty(sys.stdout)
sys.exit(main(["wizard", "--out", {str(tmp_path / "out")!r}]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert "first question: model heavy: []" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_defaults_match_the_flag_path_byte_for_byte(tmp_path, monkeypatch, capsys):
    """`wizard --defaults` and `config` with the same flags write identical files (no GPU detected
    here)."""
    monkeypatch.setattr("zerofit.hardware.detect_local_gpus", lambda: (None, 0))
    flags = [
        "--model",
        "qwen2.5-1.5b",
        "--gpus-per-node",
        "2",
        "--workload",
        "dpo",
        "--seq-len",
        "1024",
        "--out",
        "out",
    ]
    texts = []
    for name, argv in (("wizard", ["wizard", "--defaults"]), ("config", ["config"])):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        assert main(argv + flags) == 0, capsys.readouterr().err
        # the DeepSpeed JSON is named by its absolute path, which differs between the two runs
        out_dir = str(Path("out").resolve())
        texts.append(
            {p.name: p.read_text().replace(out_dir, "OUT") for p in sorted(Path("out").iterdir())}
        )
    assert {"accelerate.yaml", "answers.yaml"} <= set(texts[0])  # ds_config.json from stage 1
    assert texts[0] == texts[1]
    assert (
        "accelerate launch --config_file out/accelerate.yaml your_script.py"
        in capsys.readouterr().out
    )


def test_answers_file_without_a_tty_is_used_as_is(tmp_path, monkeypatch):
    monkeypatch.setattr("zerofit.hardware.detect_local_gpus", lambda: ("L40S", 4))
    answers = tmp_path / "answers.yaml"
    answers.write_text("model: qwen2.5-0.5b\ngpu: A10\nstage: 3\n")
    assert main(["wizard", "--answers", str(answers), "--out", str(tmp_path / "out")]) == 0
    written = (tmp_path / "out" / "answers.yaml").read_text()
    assert "gpu: A10\n" in written and "stage: 3\n" in written
    assert "gpus_per_node: 4\n" in written  # not in the file, so the detected count fills it


def test_host_ram_shortfall_is_not_called_a_gpu_oom():
    """Issue 13 item 5: when offload needs more host RAM than the node has, the warning says so
    instead of "NOT fit in GPU memory"."""
    from rich.console import Console

    plan = dataclasses.replace(
        build_plan(gpu="RTX4090", peak_gib=3.9, fits=False),
        failing_budget="host",
        cpu_gib=141.9,
        host_ram_gib=64.0,
        host_ram_source="given",
        gpu_need_gib=5.5,
    )
    console = Console(width=200, record=True)
    for part in wizard.render_plan(plan):
        console.print(part)
    text = console.export_text()
    assert "fits on the GPU but needs 141.9 GiB of host RAM" in text and "given: 64.0 GiB" in text
    assert "NOT to fit in GPU memory" not in text and "the GPU holds 5.5" in text


# --- the nodes' RAM, going back, the plan menu's answers, Esc, offload wording -----------------

UP, ESC_ENTER = "\x1b[A", "\x1b\r"
# model .. precision: the questions every flow below asks; the training-stack questions after
# them are asked only where they change the plan, which these tests do not pin
THROUGH_PRECISION = 15


def real_plan(answers: Answers):
    from zerofit.planning.plan import plan

    return plan(answers)


def test_a_cluster_plan_budgets_offload_with_the_nodes_ram_not_this_machines():
    """70B on 2 x 8 x A100-80GB with a remote main node: the wizard asks the training nodes' RAM
    and the plan budgets offload with it ("you gave"), not with this machine's MemTotal."""
    with create_pipe_input() as inp:
        inp.send_text(
            CLEAR
            + "llama-3.1-70b\r"
            + DOWN
            + "\r"  # GPU: H100-SXM -> A100-80GB
            + CLEAR
            + "8\r"
            + CLEAR
            + "2\r"  # 8 GPUs, 2 nodes
            + CLEAR
            + "10.0.0.1\r"
            + "\r"  # port 29500
            + "\r"  # launcher: accelerate
        )
        inp.send_text(CLEAR + "abc\r" + CLEAR + "1024\r")  # refused as typed, then 1024 GiB
        inp.send_text("\r")  # the network between nodes: blank, 100 Gbit/s
        inp.send_text("\r" + "\r" + "\r" + "\r")  # sft, seq_len 2048, batch: planner, bf16
        term = terminal(inp)
        qs = questions()[:THROUGH_PRECISION]
        got = wizard.collect_answers(qs, Q.start_answers(Answers()), term)
    assert got.host_ram_gib == 1024.0 and got.num_nodes == 2
    plan = real_plan(got)
    assert plan.host_ram_source == "given" and plan.host_ram_gib == 1024.0
    reasons = " ".join(d.reason for d in plan.decisions)
    assert "you gave 1024.0 GiB" in reasons and "this node has" not in reasons
    assert plan.fits  # 16 x A100-80GB offloading to 1 TiB nodes: the 23 GiB laptop was the limit


def test_back_returns_to_the_previous_question_with_its_answer():
    """'← back' on a select and '<' typed into a text go to the previous question asked."""
    gpus = [key for key, _ in Q.gpu_choices()]
    to_back = DOWN * (len(gpus) - gpus.index("H100-SXM"))  # "← back" is the select's last choice
    with create_pipe_input() as inp:
        inp.send_text(CLEAR + "qwen2.5-7b\r")  # model
        inp.send_text(to_back + "\r")  # GPU: back to the model, shown with its answer
        inp.send_text("\r")  # model: keep qwen2.5-7b
        inp.send_text("\r")  # GPU: H100-SXM
        inp.send_text(CLEAR + "<\r")  # GPUs per node: back to the GPU, which starts on H100-SXM
        inp.send_text(DOWN + "\r")  # GPU: A100-80GB
        inp.send_text(CLEAR + "4\r" + "\r" + "\r" + "\r" + "\r" + "\r")  # 4 GPUs, defaults
        term = terminal(inp)
        got = wizard.collect_answers(
            questions()[:THROUGH_PRECISION], Q.start_answers(Answers()), term
        )
    assert (got.model, got.gpu, got.gpus_per_node) == ("qwen2.5-7b", "A100-80GB", 4)


def test_going_back_to_fewer_nodes_drops_the_cluster_answers():
    """Back from the port to the node count, 2 -> 1: the address typed for 2 nodes is not kept,
    and the nodes' RAM is not asked (the plan is for this machine again)."""
    with create_pipe_input() as inp:
        inp.send_text("\r" + "\r" + "\r" + CLEAR + "2\r")  # model, GPU, 1 GPU, 2 nodes
        inp.send_text(CLEAR + "10.0.0.1\r")  # main address
        inp.send_text(CLEAR + "<\r")  # port: back to the address
        inp.send_text(CLEAR + "<\r")  # address: back to the node count
        inp.send_text(CLEAR + "1\r" + "\r" + "\r" + "\r" + "\r")  # 1 node, sft, defaults
        term = terminal(inp)
        got = wizard.collect_answers(
            questions()[:THROUGH_PRECISION], Q.start_answers(Answers()), term
        )
    assert got.num_nodes == 1 and got.main_process_ip == "127.0.0.1"
    assert got.host_ram_gib is None


def test_the_plan_menu_changes_an_answer_a_suggestion_names_and_replans():
    """"use 2 nodes": the menu changes the node count, asks what 2 nodes call for (main address,
    port, launcher, the nodes' RAM, a global batch no longer a multiple of the GPUs) and replans."""
    base = Answers(model="qwen2.5-7b", gpu="A100-80GB", gpus_per_node=8, global_batch=8)
    with create_pipe_input() as inp:
        inp.send_text(DOWN * 6 + "\r")  # Change an answer ...
        inp.send_text(DOWN * 3 + "\r")  # ... number of nodes
        inp.send_text(CLEAR + "2\r")  # 2 nodes
        inp.send_text(CLEAR + "10.0.0.1\r" + "\r" + "\r")  # address, port, launcher
        inp.send_text("512\r")  # the nodes' RAM
        inp.send_text("\r")  # the network between nodes: blank, 100 Gbit/s
        inp.send_text(CLEAR + "16\r")  # global batch 8 is no multiple of 16 GPUs: asked again
        inp.send_text("\r")  # accept
        term = terminal(inp)
        qs = questions(base)[:THROUGH_PRECISION]
        reviewed, plan = wizard.review_plan(base, real_plan, term, qs, Q.start_answers(base))
    assert reviewed == base.replace(
        num_nodes=2, main_process_ip="10.0.0.1", host_ram_gib=512.0, global_batch=16
    )
    assert plan.answers == reviewed and plan.world_size == 16
    shown = term.console.file.getvalue()
    assert "on 8 x A100-80GB (79.15 GiB) x 2 nodes" in shown and "(was " in shown


def test_the_answer_list_goes_back_to_the_plan_unchanged():
    base = Answers(model="qwen2.5-7b", gpu="A100-80GB")
    qs = questions(base)[:THROUGH_PRECISION]
    with create_pipe_input() as inp:
        # Change an answer, "← back to the plan" (the list's last entry, one up from the top),
        # then accept
        inp.send_text(DOWN * 6 + "\r" + UP + "\r" + "\r")
        term = terminal(inp)
        reviewed, _ = wizard.review_plan(base, real_plan, term, qs, Q.start_answers(base))
    assert reviewed == base
    shown = term.console.file.getvalue()
    assert shown.count("(79.15 GiB) x 1 node") == 1  # nothing changed: not replanned


def test_esc_enter_on_a_select_asks_the_same_question_again():
    """Esc then Enter ends questionary's select with an empty answer: it is not recorded (it
    used to fail Answers' validation four questions later), the same select comes back."""
    with create_pipe_input() as inp:
        inp.send_text("\r")  # model
        inp.send_text(ESC_ENTER)  # GPU: no choice picked ...
        inp.send_text(DOWN + "\r")  # ... asked again: A100-80GB
        inp.send_text("\r" * 6)  # the rest: defaults
        term = terminal(inp)
        got = wizard.collect_answers(
            questions()[:THROUGH_PRECISION], Q.start_answers(Answers()), term
        )
    assert got.gpu == "A100-80GB"
    assert "no choice picked: use the arrow keys and Enter" in term.console.file.getvalue()


def test_esc_enter_on_the_plan_menu_asks_again():
    with create_pipe_input() as inp:
        inp.send_text(ESC_ENTER + "\r")  # nothing picked, then accept
        term = terminal(inp)
        reviewed, plan = wizard.review_plan(Answers(), fake_planner, term)
    assert reviewed == Answers() and plan.stage == 2


def test_overriding_one_offload_labels_only_that_one_as_yours():
    base = Answers(model="qwen2.5-7b", gpu="A100-80GB", gpus_per_node=2)
    with create_pipe_input() as inp:
        # optimizer offload -> cpu (auto, none, cpu, nvme), then accept
        inp.send_text(DOWN * 2 + "\r" + DOWN * 2 + "\r" + "\r")
        term = terminal(inp)
        reviewed, plan = wizard.review_plan(base, real_plan, term)
    assert reviewed.offload_optimizer == "cpu" and reviewed.offload_param is None
    offload = next(d.reason for d in plan.decisions if d.field == "offload")
    assert offload.startswith(
        "optimizer states offloaded to cpu: set by you; params stay on the GPU: planner's choice"
    )
    assert "on none" not in offload
