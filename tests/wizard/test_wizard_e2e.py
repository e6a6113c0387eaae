"""End to end: the real `zerofit wizard` process in a pseudo-terminal, every question answered by
keys.

Run: .venv/bin/python -m pytest tests/wizard/test_wizard_e2e.py -q
(~15 s, most of it importing accelerate and deepspeed to load the written files)
Regenerate the README transcript (needs `pip install pyte`, a terminal emulator):
  ZEROFIT_TRANSCRIPT=docs/wizard_transcript.txt \
    .venv/bin/python -m pytest tests/wizard/test_wizard_e2e.py -q
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pexpect
import pytest

from zerofit.cli.main import main

DOWN, CLEAR = "\x1b[B", "\x15"  # arrow down; Ctrl-U clears the pre-filled default
ROWS, COLS = 300, 110


def spawn(cwd: Path, log=None) -> pexpect.spawn:
    """`zerofit wizard --out out` started in ``cwd`` (relative paths keep the commands short)."""
    exe = Path(sys.executable).with_name("zerofit")
    env = {**os.environ, "COLUMNS": str(COLS), "LINES": str(ROWS), "TERM": "xterm-256color"}
    # pexpect is no terminal: it never answers prompt_toolkit's cursor-position requests, and each
    # prompt would wait 1 s for the reply on exit.
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    child = pexpect.spawn(
        str(exe),
        ["wizard", "--out", "out"],
        cwd=str(cwd),
        env=env,
        dimensions=(ROWS, COLS),
        encoding="utf-8",
        timeout=60,
    )
    child.logfile_read = log
    return child


def answer(child: pexpect.spawn, question: str, keys: str) -> None:
    child.expect_exact(question)
    child.send(keys)


def test_wizard_in_a_pty_writes_files_that_accelerate_and_deepspeed_load(
    tmp_path, free_port, monkeypatch
):
    out = tmp_path / "out"
    log = io.StringIO()
    child = spawn(tmp_path, log)
    answer(child, "Model", CLEAR + "qwen2.5-7b\r")
    answer(child, "GPU", DOWN + "\r")  # H100-SXM -> A100-80GB
    answer(child, "GPUs per node", CLEAR + "2\r")
    answer(child, "Number of nodes", CLEAR + "2\r")
    answer(child, "Main node address", CLEAR + "127.0.0.1\r")
    answer(child, "Main node port", CLEAR + f"{free_port}\r")
    answer(child, "Launch with", "\r")  # accelerate
    # two nodes: offload is budgeted with their RAM, not this machine's
    answer(child, "Host RAM per training node", "1024\r")
    answer(child, "Network between nodes", "25\r")  # Gbit/s
    answer(child, "Workload", DOWN * 3 + "\r")  # "← back", the last choice ...
    answer(child, "Network between nodes", "\r")  # ... shows 25 again: keep it
    answer(child, "Workload", DOWN * 2 + "\r")  # grpo
    answer(child, "completions per prompt", CLEAR + "4\r")
    answer(child, "generated tokens per completion", CLEAR + "128\r")
    answer(child, "Sequence length", CLEAR + "512\r")
    answer(child, "Global batch", CLEAR + "16\r")
    answer(child, "Precision", "\r")  # bf16 (A100 has it)
    # the weights' dtype is not asked: at 25 Gbit/s between nodes plain DDP is not the predicted
    # fastest fit whatever the dtype, so it does not change the plan
    answer(child, "Accept this plan?", DOWN + "\r")  # change the ZeRO stage ...
    answer(child, "New ZeRO stage", DOWN * 4 + "\r")  # ... to 3
    child.expect_exact("(was ")  # re-estimated at once
    answer(child, "Accept this plan?", DOWN * 6 + "\r")  # change an answer ...
    answer(child, "Which answer?", DOWN * 12 + "\r")  # ... the sequence length
    answer(child, "Sequence length", CLEAR + "1024\r")
    child.expect_exact("seq 1024")  # replanned with it
    answer(child, "Accept this plan?", "\r")
    child.expect(pexpect.EOF)
    child.close()
    _save_transcript(log.getvalue())
    assert child.exitstatus == 0, log.getvalue()[-2000:]
    node_1 = "node 1: accelerate launch --config_file out/accelerate.yaml --machine_rank 1"
    assert node_1 + " your_script.py" in log.getvalue()

    files = {
        name: (out / name).read_text()
        for name in ("ds_config.json", "accelerate.yaml", "answers.yaml")
    }
    from accelerate.commands.config.config_args import load_config_from_file

    cluster = load_config_from_file(str(out / "accelerate.yaml"))
    assert (cluster.num_machines, cluster.num_processes, cluster.machine_rank) == (2, 4, 0)
    assert (cluster.main_process_ip, cluster.main_process_port) == ("127.0.0.1", free_port)
    # absolute: workers open it from whatever directory they were launched in
    assert cluster.deepspeed_config["deepspeed_config_file"] == str(
        out.resolve() / "ds_config.json"
    )

    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    ds = json.loads(files["ds_config.json"])
    assert DeepSpeedZeroConfig(**ds["zero_optimization"]).stage == 3
    # "auto" where the HF Trainer fills it from its arguments (answers.yaml's flavor)
    batch = "auto" if "flavor: auto\n" in files["answers.yaml"] else 16
    assert ds["train_batch_size"] == batch and ds["bf16"]["enabled"] in (True, "auto")
    assert "host_ram_gib: 1024.0\n" in files["answers.yaml"]
    assert "inter_node_gbps: 25.0\n" in files["answers.yaml"]
    assert "seq_len: 1024\n" in files["answers.yaml"]

    # The flag path reproduces the wizard's files byte for byte from its answers.yaml.
    saved = tmp_path / "answers.yaml"
    saved.write_text(files["answers.yaml"])
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--answers", str(saved), "--out", "out", "--force"]) == 0
    assert {name: (out / name).read_text() for name in files} == files


def test_ctrl_c_leaves_no_file(tmp_path):
    out = tmp_path / "out"
    child = spawn(tmp_path)
    answer(child, "Model", "\r")
    child.expect_exact("GPU")
    child.sendcontrol("c")
    child.expect_exact("aborted, nothing written")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert not out.exists()


def _save_transcript(raw: str) -> None:
    """Render the pty stream as the final screen text (what a viewer of the session saw)."""
    target = os.environ.get("ZEROFIT_TRANSCRIPT")
    if not target:
        return
    pyte = pytest.importorskip("pyte")
    screen = pyte.Screen(COLS, ROWS)
    pyte.Stream(screen).feed(raw)
    lines = [line.rstrip() for line in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    text = "$ zerofit wizard --out out\n" + "\n".join(lines) + "\n"
    Path(target).write_text(text)
