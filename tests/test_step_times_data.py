"""The public step-time set is well formed: tests/data/step_times_public.jsonl.

Each row is one measured training configuration quoted from a public source (step time,
throughput, or achieved TFLOPs/MFU), kept as test data for the speed model. The checks are on
the data, not on any model: every row names its source and quote, states a measured number with
its unit in the key, fills every setup field or lists it as missing, says how each field it did
not read verbatim follows, and groups rows into scenarios (same model and GPU, different
configuration) so a predicted order can be compared with the measured one. Sources kept back to
judge the speed model must never appear here.
"""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import combinations
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "step_times_public.jsonl"
SOURCES_TABLE = ROOT / "tests" / "data" / "step_times_public.md"

# The number of rows collected; the set may grow, never shrink below this.
ROWS_COLLECTED = 188

# Held back to judge the speed model: no row may cite or quote them.
RESERVED_SOURCE_PATTERNS = (
    "deepspeed/issues/3901",
    "deepspeedexamples/tree/master/training/autotuning/hf",
    "deepspeedexamples/blob/master/training/autotuning/hf",
    "training/autotuning/hf",
    "belle/issues/402",
    "from-deepspeed-to-fsdp-and-back",
    "deepspeed-to-fsdp-and-back",
    "accelerate/issues/2624",
    "opentau",
)

KINDS = ("step_time", "throughput", "mfu")
MEASURED_KEYS = {
    "step_s", "samples_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
    "fwd_s", "bwd_s", "optimizer_step_s", "run_total_s", "bound",
}
# A row of each kind states at least one of these; run_total_s is the wall time of a fixed amount
# of work, comparable across the rows of one scenario (same data, same steps).
PRIMARY_BY_KIND = {
    "step_time": {"step_s", "fwd_s", "bwd_s", "optimizer_step_s", "run_total_s"},
    "throughput": {"tokens_per_s_per_gpu", "samples_per_s"},
    "mfu": {"tflops_per_gpu", "mfu"},
}

SETUP_FIELDS = (
    "model", "params_b", "gpu", "gpu_norm", "gpus_per_node", "nodes", "interconnect",
    "framework", "stage", "offload_optimizer", "offload_param", "zeropp", "mics",
    "gradient_checkpointing", "micro_batch", "grad_accum", "seq_len", "packing", "precision",
    "attention", "tuning", "workload", "options",
)
# Fields that make two rows of one scenario different configurations (model and GPU type are
# what a scenario holds fixed).
CONFIG_FIELDS = tuple(
    name
    for name in SETUP_FIELDS
    if name not in ("model", "params_b", "gpu", "gpu_norm")
)

GPU_NAMES = (
    "A100", "A100-40GB", "A100-80GB", "A800-80GB", "A10", "H20-96GB", "H100-SXM",
    "H100-96GB-HBM2e", "H200", "B200", "GB200", "GB300", "V100-32GB", "RTX-4090", "RTX-3090",
    "RTX-6000-24GB", "TITAN-RTX-24GB", "A40-48GB",
)
FRAMEWORKS = (
    "deepspeed", "hf-trainer", "accelerate", "llama-factory", "ms-swift", "megatron",
    "megatron-deepspeed", "megatron-bridge", "nemo-automodel", "torchtitan", "xtuner",
    "pytorch-ddp", "fairscale",
)
OFFLOAD = ("none", "cpu", "nvme")
PACKING = ("none", "packed", "padding_free")
PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
ATTENTION = ("eager", "sdpa", "flash", "flash3", "xformers", "te")
TUNING = ("full", "lora", "lora-emb", "qlora")
WORKLOADS = ("pretrain", "sft", "dpo")


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


ROWS = _load(DATA)


def by_id(row: dict) -> str:
    return row["id"]


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# What each setup field may hold when it is known (a field the source leaves open is None and
# named in `missing`).
VALID_SETUP = {
    "model": lambda v: isinstance(v, str) and v.strip() != "",
    "params_b": lambda v: isinstance(v, (int, float)) and v > 0,
    "gpu": lambda v: isinstance(v, str) and v.strip() != "",
    "gpu_norm": lambda v: v in GPU_NAMES,
    "gpus_per_node": _is_positive_int,
    "nodes": _is_positive_int,
    "interconnect": lambda v: isinstance(v, str) and v.strip() != "",
    "framework": lambda v: v in FRAMEWORKS,
    "stage": lambda v: v in (0, 1, 2, 3) and not isinstance(v, bool),
    "offload_optimizer": lambda v: v in OFFLOAD,
    "offload_param": lambda v: v in OFFLOAD,
    "zeropp": lambda v: isinstance(v, bool),
    "mics": lambda v: isinstance(v, bool),
    "gradient_checkpointing": lambda v: isinstance(v, bool) or v == "selective",
    "micro_batch": _is_positive_int,
    "grad_accum": _is_positive_int,
    "seq_len": _is_positive_int,
    "packing": lambda v: v in PACKING,
    "precision": lambda v: v in PRECISIONS,
    "attention": lambda v: v in ATTENTION,
    "tuning": lambda v: v in TUNING,
    "workload": lambda v: v in WORKLOADS,
    "options": lambda v: isinstance(v, dict),
}


def test_the_set_is_big_enough_with_unique_ids_and_every_kind():
    assert len(ROWS) >= ROWS_COLLECTED
    ids = [row["id"] for row in ROWS]
    assert len(set(ids)) == len(ids), "ids must be unique"
    assert {row["kind"] for row in ROWS} == set(KINDS)


@pytest.mark.parametrize("row", ROWS, ids=by_id)
def test_row_names_its_source_quote_and_kind(row):
    assert set(row) == {
        "id", "source", "quote", "kind", "measured", "setup", "derived", "missing", "scenario",
    }
    assert row["id"] == row["id"].strip() and " " not in row["id"]
    assert row["source"].startswith("https://")
    assert isinstance(row["quote"], str) and len(row["quote"]) >= 20
    assert row["kind"] in KINDS
    assert isinstance(row["scenario"], str) and row["scenario"].strip()


@pytest.mark.parametrize("row", ROWS, ids=by_id)
def test_row_states_a_measured_number_with_its_unit(row):
    measured = row["measured"]
    unknown = set(measured) - MEASURED_KEYS
    assert not unknown, f"measured keys must carry their unit and be known: {sorted(unknown)}"
    numbers = {key: value for key, value in measured.items() if key != "bound"}
    assert numbers and all(
        isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        for value in numbers.values()
    )
    assert set(numbers) & PRIMARY_BY_KIND[row["kind"]], (
        f"a {row['kind']} row states one of {sorted(PRIMARY_BY_KIND[row['kind']])}"
    )
    assert measured.get("bound", "lower") in ("lower", "upper")
    if "mfu" in measured:
        assert measured["mfu"] <= 1


@pytest.mark.parametrize("row", ROWS, ids=by_id)
def test_setup_fields_are_known_values_or_listed_missing(row):
    setup = row["setup"]
    assert set(setup) == set(SETUP_FIELDS)
    missing = set(row["missing"])
    unknown = missing - set(SETUP_FIELDS)
    assert not unknown, f"unknown missing fields {sorted(unknown)}"
    for name in SETUP_FIELDS:
        value = setup[name]
        if value is None:
            assert name in missing, f"{name} is None but not listed in missing"
        else:
            assert name not in missing, f"{name} has a value but is listed missing"
            assert VALID_SETUP[name](value), f"{name}={value!r} is not an allowed value"


@pytest.mark.parametrize("row", ROWS, ids=by_id)
def test_every_derived_field_says_how_it_follows(row):
    derived = row["derived"]
    assert isinstance(derived, dict)
    for name, reason in derived.items():
        assert name in SETUP_FIELDS, f"derived names a field that is not a setup field: {name}"
        assert row["setup"][name] is not None, f"{name} is derived yet left empty"
        assert isinstance(reason, str) and reason.strip(), f"derived {name!r} needs a reason"


def _scenarios() -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in ROWS:
        groups[row["scenario"]].append(row)
    return groups


def _configuration(row: dict) -> str:
    return json.dumps({name: row["setup"][name] for name in CONFIG_FIELDS}, sort_keys=True)


MULTI_ROW = {name: rows for name, rows in _scenarios().items() if len(rows) >= 2}


def test_enough_scenarios_compare_several_configurations():
    assert len(MULTI_ROW) >= 20
    assert sum(len(rows) for rows in MULTI_ROW.values()) >= 120


@pytest.mark.parametrize("scenario", sorted(MULTI_ROW))
def test_scenario_holds_model_and_gpu_and_varies_the_configuration(scenario):
    rows = MULTI_ROW[scenario]
    assert len({row["setup"]["model"] for row in rows}) == 1, "one model per scenario"
    assert len({row["setup"]["gpu_norm"] for row in rows}) == 1, "one GPU type per scenario"
    assert len({row["kind"] for row in rows}) == 1, "one kind of measurement per scenario"
    shared = set.intersection(*(set(row["measured"]) - {"bound"} for row in rows))
    assert shared, "the rows of a scenario must state one measured quantity in common"
    for first, second in combinations(rows, 2):
        assert _configuration(first) != _configuration(second), (
            f"{first['id']} and {second['id']} share every configuration field"
        )


@pytest.mark.parametrize("row", ROWS, ids=by_id)
def test_no_reserved_source_appears(row):
    text = " ".join((row["source"], row["quote"], json.dumps(row["derived"]))).lower()
    for pattern in RESERVED_SOURCE_PATTERNS:
        assert pattern not in text, f"reserved source {pattern!r} appears in {row['id']}"


def test_the_sources_table_lists_every_source():
    table = SOURCES_TABLE.read_text(encoding="utf-8")
    for source in {row["source"].split("#")[0] for row in ROWS}:
        assert source in table, f"{source} is not in {SOURCES_TABLE.name}"
    for pattern in RESERVED_SOURCE_PATTERNS:
        assert pattern not in table.lower()
