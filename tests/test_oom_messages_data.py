"""The OOM-message survey is well formed: tests/data/oom_messages_outside_allocator.jsonl.

Each record is one public CUDA OOM message of an LLM training run; its numbers must be the ones
the quote states, and ``non_pytorch_gib`` the memory the process held beyond PyTorch's allocator
(in use - allocated - reserved but unallocated). Checks the data only: the comparison with
zerofit's terms is benchmarks/outside_allocator.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "oom_messages_outside_allocator.jsonl"
ENGINES = ("deepspeed", "torch", "fsdp", "unknown")


def _records() -> list[dict]:
    with open(DATA, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


RECORDS = _records()


def test_the_survey_has_distinct_messages_from_at_least_25_runs():
    ids = [r["id"] for r in RECORDS]
    assert len(ids) == len(set(ids))
    # two ranks of one run name each other in same_run: the run counts once
    runs = {min(r["id"], r["same_run"] or r["id"]) for r in RECORDS}
    assert len(runs) >= 25


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["id"])
def test_each_record_is_the_arithmetic_of_its_quote(record):
    assert record["source"].startswith("https://") and len(record["quote"]) >= 40
    expected = record["in_use_gib"] - record["allocated_gib"] - record["reserved_unallocated_gib"]
    assert record["non_pytorch_gib"] == pytest.approx(expected, abs=0.002)
    # every number it rests on is written in the quote (GiB, or MiB for small reservations)
    stated = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", record["quote"])}
    for key in ("total_capacity_gib", "in_use_gib", "allocated_gib"):
        assert record[key] in stated, key
    unallocated = record["reserved_unallocated_gib"]
    assert unallocated in stated or round(unallocated * 1024, 2) in stated
    assert record["engine"] in ENGINES
    assert record["zero_stage"] in (None, 1, 2, 3)
    assert record["zero_stage"] is None or record["engine"] == "deepspeed"
