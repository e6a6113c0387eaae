"""Reward functions, data order, batch arithmetic and the progress bar of recipes/grpo.py
(no training).

Run: .venv/bin/python -m pytest tests/recipes/test_grpo_rewards.py -q   (~15 s; one subprocess)
"""

from __future__ import annotations

import doctest
import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "grpo.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("grpo_recipe_rewards", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


grpo = load_recipe()

ACCURACY = [  # (completion, answer, reward)
    ("7", "7", 1.0),
    ("the sum is 7", "7", 1.0),  # last number counts
    ("7 or 8", "7", 0.0),  # ... so a hedge ending in a wrong number fails
    ("", "7", 0.0),  # nothing to compare
    ("-3", "-3", 1.0),
    ("1,250", "#### 1250", 1.0),  # GSM8K-style answer, thousands separator
    ("12.0", "12", 1.0),  # numeric, not string, comparison
    ("seven", "7", 0.0),
    ("7", "no number", 0.0),  # an answer without a number never matches
]

FORMAT = [  # (completion, finished with EOS, reward)
    ("7", True, 1.0),
    (" 12 ", True, 1.0),  # surrounding spaces are fine
    ("-3.5", True, 1.0),
    ("7+", True, 0.0),
    ("7=7", True, 0.0),
    ("", True, 0.0),
    ("77777777", False, 0.0),  # cut off at the length limit: not a finished answer
]


@pytest.mark.parametrize("completion,answer,reward", ACCURACY)
def test_accuracy_reward_table(completion, answer, reward):
    assert grpo.accuracy_reward(["p"], [completion], answer=[answer]) == [reward]


@pytest.mark.parametrize("completion,finished,reward", FORMAT)
def test_format_reward_table(completion, finished, reward):
    assert grpo.format_reward(["p"], [completion], finished=[finished]) == [reward]


def test_rewards_ignore_extra_columns_and_registry():
    assert grpo.accuracy_reward(["p"], ["3"], answer=["3"], finished=[True], level=["easy"]) == [
        1.0
    ]
    assert set(grpo.REWARDS) == {"accuracy", "format"}


def test_doctests_pass():
    result = doctest.testmod(grpo)
    assert result.failed == 0 and result.attempted >= 6


def test_toy_rows_are_all_single_digit_sums():
    rows = grpo.toy_rows()
    assert len(rows) == 100 and rows[34] == {"prompt": "3+4=", "answer": "7"}


def test_prompt_indices_deterministic_and_epoch_complete():
    first = grpo.prompt_indices(0, 10, 5, seed=3) + grpo.prompt_indices(1, 10, 5, seed=3)
    assert sorted(first) == list(range(10))  # one epoch = every row once
    assert grpo.prompt_indices(1, 10, 5, seed=3) == grpo.prompt_indices(1, 10, 5, seed=3)
    assert grpo.prompt_indices(2, 10, 5, seed=3) != grpo.prompt_indices(
        0, 10, 5, seed=3
    )  # reshuffled


def test_tiny_tokenizer_round_trip():
    tok = grpo.common.build_tiny_tokenizer()
    ids = tok("12+5=")["input_ids"]
    assert len(ids) == 5 and tok.decode(ids) == "12+5="
    assert (
        tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "12+5="
    )


def test_progress_bar_leads_with_reward():
    """At ratio 1 (one update per rollout, no KL) the loss is -mean(advantages) = 0 by
    construction: the bar showed `loss=-0.0000` first every step (tqdm sorts keyword postfixes)
    and looked broken. It shows the reward first, and the loss only when it carries signal."""
    from tqdm import tqdm

    metrics = {"reward": 0.8125, "completion_len": 2.5, "loss": -0.0, "kl": 0.0123}
    plain = grpo.progress_postfix(metrics, grpo.parse_args([]))
    assert plain == {"reward": "0.812", "len": "2.5"}
    with_kl = grpo.progress_postfix(metrics, grpo.parse_args(["--beta", "0.04"]))
    assert list(with_kl) == ["reward", "len", "kl", "loss"]
    shown = io.StringIO()
    bar = tqdm(total=3, file=shown, desc="grpo", mininterval=0)
    bar.set_postfix(plain)
    bar.close()
    assert "grpo" in shown.getvalue() and "reward=0.812, len=2.5]" in shown.getvalue()


def test_bad_batch_arithmetic_is_one_line(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(RECIPE),
            "--per-device-batch-size",
            "3",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "grpo.py: num_generations: per_device_batch_size 3 x processes 1 x "
        "gradient_accumulation_steps 1 = 3 completions per step is not divisible by "
        "num_generations 8 "
        "(fix: change one of them so the product is a multiple of num_generations)"
    )
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_bad_dataset_columns(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    out = subprocess.run(
        [sys.executable, str(RECIPE), "--dataset", str(data), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "needs rows with `prompt` and `answer`" in out.stderr
    assert "Traceback" not in out.stderr
