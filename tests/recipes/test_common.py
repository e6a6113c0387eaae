"""recipes/common.py: data files, `--model` checks (a local directory, a hub id probed within
seconds), the rank that dies with its launcher, the DeepSpeed JSON against the flags, and bad
input refused before torch is imported. No training.

Run: .venv/bin/python -m pytest tests/recipes/test_common.py -q   (~30 s; a few subprocesses)
"""

from __future__ import annotations

import doctest
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from recipe_runs import RECIPES, load_recipe, one_line_error, save_tiny_model

grpo = load_recipe("grpo")
common = grpo.common  # the instance grpo uses
grpo.parse_args([])  # names the program in error lines: "grpo.py: ..."


# ----------------------------------------------------------------------------- data files
def test_dataset_path_that_does_not_exist(capsys):
    err = one_line_error(capsys, lambda: common.read_rows("data/math.jsonl", "train"))
    assert err.startswith("grpo.py: dataset: no such file data/math.jsonl")


def test_jsonl_line_that_is_not_json(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n')
    err = one_line_error(capsys, lambda: common.read_rows(str(data), "train"))
    assert err.startswith(f"grpo.py: dataset: {data} line 2 is not JSON")


def test_row_missing_a_field_names_it(capsys):
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b"}]
    err = one_line_error(capsys, lambda: common.check_rows(rows, ("prompt", "answer"), "d.jsonl"))
    assert err.startswith("grpo.py: answer: d.jsonl row 2 has no `answer`")
    err = one_line_error(
        capsys,
        lambda: common.check_rows([{"prompt": 3, "answer": "1"}], ("prompt", "answer"), "d.jsonl"),
    )
    assert err.startswith("grpo.py: prompt: d.jsonl row 1: `prompt` is a int, not a string")


def test_common_doctests():
    result = doctest.testmod(common)
    assert result.attempted >= 1 and result.failed == 0


# ----------------------------------------------------------------------------- --model
@pytest.mark.parametrize(
    "model,start",
    [
        ("./no/such/model", "grpo.py: model: no such directory ./no/such/model"),
        ("not-an-org/not-a-model-zz", "grpo.py: model: cannot load a tokenizer from 'not-an-org/"),
    ],
)
def test_missing_or_garbage_model(model, start, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = grpo.parse_args(["--model", model])
    assert one_line_error(capsys, lambda: common.load_tokenizer(args)).startswith(start)


def test_model_dir_without_config(tmp_path, capsys):
    (tmp_path / "weights.bin").write_text("garbage")
    args = grpo.parse_args(["--model", str(tmp_path)])
    err = one_line_error(capsys, lambda: common.load_tokenizer(args))
    assert err == (
        f"grpo.py: model: {tmp_path} has no config.json (fix: pass a saved model directory)"
    )
    args = grpo.parse_args(["--model", str(tmp_path / "weights.bin")])
    err = one_line_error(capsys, lambda: common.load_tokenizer(args))
    assert "is a file, not a model directory" in err


def silent_hub() -> socket.socket:
    """A TCP server that accepts connections and never answers: a hub behind a dead proxy."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server


def hub_env(server: socket.socket, cache) -> dict:
    offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # tests/conftest.py sets them
    env = {k: v for k, v in os.environ.items() if k not in offline}
    port = server.getsockname()[1]
    return {**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(cache)}


def test_unreachable_hub_model_fails_within_seconds(tmp_path):
    """An uncached hub id with no answer from the hub: one line in seconds (transformers'
    from_pretrained retried for ~54 s, and much longer against a silent server)."""
    server = silent_hub()
    port = server.getsockname()[1]
    try:
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, str(RECIPES / "sft.py"), "--model", "some-org/some-model"]
            + ["--output-dir", str(tmp_path / "run")],
            env=hub_env(server, tmp_path / "hub"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        seconds = time.monotonic() - started
    finally:
        server.close()
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip() == (
        f"sft.py: model: no answer from the Hugging Face Hub (http://127.0.0.1:{port}) about "
        "'some-org/some-model' in 2 s (fix: check the network (or HF_ENDPOINT), or download the "
        "model and pass its directory)"
    )
    assert seconds < 20, seconds  # python + the probe's 2 s; the old path took minutes
    assert not (tmp_path / "run").exists()  # refused before the run directory was touched


def test_cached_hub_model_needs_no_network(tmp_path):
    """A hub id already in the local cache passes the check with the hub unreachable."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--some-org--some-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    save_tiny_model(snapshot)
    (cache / "models--some-org--some-model" / "refs").mkdir()
    (cache / "models--some-org--some-model" / "refs" / "main").write_text("0" * 40)
    server = silent_hub()
    code = (
        f"import sys; sys.path.insert(0, {str(RECIPES)!r}); import common\n"
        "common.check_model('some-org/some-model'); print('ok')"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=hub_env(server, cache),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.close()
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ----------------------------------------------------------------------------- the launcher
def test_rank_dies_with_its_launcher():
    """A torch elastic worker runs in a session of its own; SIGKILL to the launcher must still
    end it. Here a parent starts a child the way the agent does (new session,
    TORCHELASTIC_RUN_ID set); the child arms exit_with_launcher; the parent is SIGKILLed."""
    child = (
        f"import sys, time; sys.path.insert(0, {str(RECIPES)!r}); import common\n"
        "common.exit_with_launcher(); print('armed', flush=True); time.sleep(120)"
    )
    parent = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True)\n"
        "print(child.pid, flush=True); time.sleep(120)"
    )
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test"}
    launcher = subprocess.Popen(
        [sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, env=env
    )
    rank = int(launcher.stdout.readline())
    assert launcher.stdout.readline().strip() == "armed"  # the child shares the parent's stdout
    launcher.kill()
    launcher.wait()
    assert wait_until_gone(rank, seconds=10), f"rank {rank} outlived its launcher"


def wait_until_gone(pid: int, seconds: float) -> bool:
    """True once `pid` has exited (a zombie waiting for its new parent to reap it counts)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)  # do not leave it behind
    except ProcessLookupError:
        pass
    return False


def test_plain_python_run_is_not_tied_to_its_parent():
    """Without torch elastic (plain `python recipes/x.py`, e.g. under nohup) nothing is armed."""
    code = (
        f"import sys; sys.path.insert(0, {str(RECIPES)!r}); import common, ctypes\n"
        "common.exit_with_launcher()\n"
        "libc = ctypes.CDLL(None); sig = ctypes.c_int(-1)\n"
        "libc.prctl(2, ctypes.byref(sig), 0, 0, 0); print(sig.value)"  # PR_GET_PDEATHSIG
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "0", out.stderr[-2000:]


# ----------------------------------------------------------------------------- before torch
@pytest.mark.parametrize("name", ["sft", "dpo", "grpo"])
def test_bad_input_is_refused_before_torch_is_imported(name, tmp_path):
    """A non-empty --output-dir is refused by main() with torch, accelerate and deepspeed
    unimportable: each rank of a launch used to import them all (and start DeepSpeed) first."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    code = (
        "import sys, builtins\nreal = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] in ('torch', 'accelerate', 'deepspeed'):\n"
        "        raise AssertionError('imported ' + name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        f"sys.path.insert(0, {str(RECIPES)!r})\n"
        f"import {name}\n"
        f"{name}.main(['--output-dir', {str(out)!r}])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().startswith(f"{name}.py: output_dir: {out} is not empty")
    assert len(res.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- DeepSpeed JSON
def test_deepspeed_integer_wins_and_is_stated(capsys):
    args = grpo.parse_args(["--per-device-batch-size", "16", "--max-grad-norm", "0.5"])
    cfg = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    common.reconcile_with_deepspeed(args, cfg, None)
    assert args.per_device_batch_size == 8  # the JSON's number wins ...
    assert cfg == {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
    }  # ... and "auto" takes the flag
    err = capsys.readouterr().err
    assert (
        "note: per_device_batch_size 16 -> 8: the DeepSpeed config's "
        "`train_micro_batch_size_per_gpu` wins" in err
    )


def test_recipes_import_without_zerofit(tmp_path):
    """A recipe needs torch + accelerate + transformers, not the zerofit package."""
    code = (
        "import sys, builtins\nreal = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    assert not name.startswith('zerofit'), name\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        f"sys.path.insert(0, {str(RECIPES)!r})\n"
        "import sft, dpo, grpo\nprint('ok')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
