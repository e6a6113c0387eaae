"""recipes/sft.py without training: the masked completion loss against hand-computed numbers,
tokenisation (prompt masked, EOS learned), packing, chat-template rows and data-format errors.

Run: .venv/bin/python -m pytest tests/recipes/test_sft.py -q   (~10 s)
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from recipe_runs import load_recipe

sft = load_recipe("sft")
IGNORE = sft.IGNORE


def test_masked_completion_loss_by_hand():
    # vocab of 3; sequence of 3 tokens -> positions 0 and 1 predict tokens 1 and 2.
    # position 0 logits [0, 0, 0] -> p(label 2) = 1/3; position 1 [ln 3, 0, 0] -> p(label 0) = 3/5
    logits = torch.tensor([[[0.0, 0.0, 0.0], [math.log(3), 0.0, 0.0], [9.0, 9.0, 9.0]]])
    labels = torch.tensor([[IGNORE, 2, 0]])  # the prompt token (position 0) takes no loss
    expected = (math.log(3) + math.log(5 / 3)) / 2
    assert sft.sft_loss(logits, labels).item() == pytest.approx(expected)
    masked = torch.tensor([[IGNORE, IGNORE, 0]])  # only the last token is completion
    assert sft.sft_loss(logits, masked).item() == pytest.approx(math.log(5 / 3))
    # an explicit normaliser (this rank's step tokens / accumulation) replaces the batch count
    assert sft.sft_loss(logits, labels, num_tokens=4).item() == pytest.approx(expected * 2 / 4)


def test_loss_ignores_padding_and_matches_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[IGNORE, IGNORE, 3, 4, 1], [IGNORE, 2, 1, IGNORE, IGNORE]])
    flat = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1), ignore_index=IGNORE
    )
    assert sft.sft_loss(logits, labels).item() == pytest.approx(flat.item(), rel=1e-6)


def test_tokenize_masks_prompt_and_appends_eos():
    tok = sft.common.build_tiny_tokenizer()
    ids, labels = sft.tokenize_row(tok, {"prompt": "3+4=", "completion": "7"}, max_seq_len=64)
    assert tok.decode(ids) == "3+4=7<eos>"
    assert labels == [IGNORE] * 4 + [ids[4], tok.eos_token_id]
    ids, labels = sft.tokenize_row(tok, {"prompt": "3+4=", "completion": "17"}, max_seq_len=5)
    assert len(ids) == 5 and labels == [IGNORE] * 4 + [ids[4]]  # cut at the end


def test_messages_rows_use_the_chat_template():
    tok = sft.common.build_tiny_tokenizer()
    row = {"messages": [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]}
    ids, labels = sft.tokenize_row(tok, row, max_seq_len=64)
    assert tok.decode(ids) == "3+4=7<eos>"  # the template closes assistant turns with EOS
    assert [t for t in labels if t != IGNORE] == ids[4:]


def test_packing_doctest_and_blocks():
    assert doctest.testmod(sft).failed == 0
    blocks = sft.pack([([1, 2, 3], [IGNORE, 2, 3])] * 5, block=4)
    assert len(blocks) == 3 and all(len(ids) == 4 for ids, _ in blocks)


def test_collate_pads_right():
    batch = sft.collate([([5, 6, 7], [IGNORE, 6, 7]), ([5], [IGNORE])], pad_id=0, device="cpu")
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6, 7], [IGNORE, IGNORE, IGNORE]]


def one_line_error(capsys, call) -> str:
    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


BAD_ROWS = [
    ([{"prompt": "a"}], "sft.py: completion: d.jsonl row 1 has no `completion`"),
    (
        [{"prompt": "a", "completion": 7}],
        "sft.py: completion: d.jsonl row 1: `completion` is a int",
    ),
    ([{"messages": "hi"}], "sft.py: messages: d.jsonl row 1: `messages` is missing or not a list"),
    ([{"messages": [{"role": "user"}]}], "sft.py: messages: d.jsonl row 1: a turn lacks"),
    (
        [{"messages": [{"role": "user", "content": "x"}]}],
        "sft.py: messages: d.jsonl row 1: the last turn is 'user'",
    ),
    ([], "sft.py: dataset: d.jsonl has no rows"),
]


@pytest.mark.parametrize("rows,start", BAD_ROWS)
def test_bad_rows_name_the_field(rows, start, capsys):
    sft.parse_args([])  # sets the program name for error lines
    assert one_line_error(capsys, lambda: sft.check_sft_rows(rows, "d.jsonl")).startswith(start)


def test_too_short_max_seq_len(capsys):
    args = sft.parse_args(["--max-seq-len", "4"])
    tok = sft.common.build_tiny_tokenizer()
    err = one_line_error(capsys, lambda: sft.build_examples(args, tok, sft.toy_rows()))
    assert err.startswith("sft.py: max_seq_len: 4 tokens leave no completion token to learn")
