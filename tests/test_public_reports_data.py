"""The public-reports sets are well formed: tests/data/public_reports.jsonl (the set the
estimator was developed against) and tests/data/public_reports_holdout.jsonl (collected later,
in numbered batches, without running the estimator, to judge it on reports it was not built on).

Checks the data, not the estimator: every report has a source URL, a verbatim quote, a known
outcome, its inferred fields named with a reason, and answers that load into Answers once the
fields Answers does not know yet are dropped. The verdict itself is benchmarks/public_reports.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import load_benchmark

from zerofit.errors import ZerofitError
from zerofit.hardware import CATALOG, lookup
from zerofit.memory.losses import LOSS_KERNELS
from zerofit.memory.optimizers import OPTIMIZERS
from zerofit.models.builtin import BUILTIN_CONFIGS
from zerofit.planning.answers import Answers, answers_from_dict

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "public_reports.jsonl"
HOLDOUT = ROOT / "tests" / "data" / "public_reports_holdout.jsonl"
MODELS = ROOT / "tests" / "data" / "public_report_models"

# Answers fields every record states (what the stack-aware memory model reads), and the values
# the data may hold for them.
NEW_FIELDS = {
    "stack": lambda v: v in ("hf", "accelerate", "deepspeed"),
    "optimizer": lambda v: v in (None, *OPTIMIZERS),
    "loss_kernel": lambda v: v in LOSS_KERNELS,
    "precompute_ref": lambda v: isinstance(v, bool),
    "vllm_gpu_memory_utilization": lambda v: v is None or (isinstance(v, float) and 0 < v < 1),
    "steps_per_generation": lambda v: v is None or (isinstance(v, int) and v >= 1),
    "host_ram_gib": lambda v: v is None or (isinstance(v, (int, float)) and v > 0),
    "weights_dtype": lambda v: v in (None, "fp32", "bf16"),
}
# GPUs a report may name before the catalog has them (all are in it now); a report on one the
# catalog lacks names it in `missing`.
GPUS_BEING_ADDED = ("A800", "H800", "H20", "A40", "L20", "MI250X", "MI300X")
MEASURED_KINDS = ("alloc_lower_bound", "device_used", "reserved", "reserved_whole_run")
ANSWER_FIELDS = {f.name for f in dataclasses.fields(Answers)}


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


REPORTS = _load(DATA)
HELD_OUT = _load(HOLDOUT)
EVERY_REPORT = REPORTS + HELD_OUT


def by_id(report: dict) -> str:
    return report["id"]


def test_the_set_is_big_enough_and_mixed():
    outcomes = {r["outcome"] for r in REPORTS}
    workloads = {r["answers"]["workload"] for r in REPORTS}
    assert len(REPORTS) >= 30
    assert outcomes == {"oom", "ran"}
    assert workloads == {"sft", "dpo", "grpo"}
    assert len({r["id"] for r in EVERY_REPORT}) == len(EVERY_REPORT), "ids must be unique"
    assert len(HELD_OUT) >= 15 and {r["outcome"] for r in HELD_OUT} == {"oom", "ran"}


def test_held_out_records_name_their_batch_in_collection_order():
    """Every held-out record says which batch it was collected in (1, 2, ... in file order, no
    gaps), so the benchmark judges each batch as a set of its own; the developed-on set has
    none."""
    batches = [report["collected"] for report in HELD_OUT]
    assert all(isinstance(batch, int) for batch in batches)
    assert batches == sorted(batches) and sorted(set(batches)) == list(range(1, max(batches) + 1))
    assert not any("collected" in report for report in REPORTS)


def test_the_benchmark_judges_each_collected_batch_as_a_set():
    bench = load_benchmark("public_reports")
    sets = bench.report_sets(HOLDOUT)
    assert len(sets) == HELD_OUT[-1]["collected"]
    assert [r["id"] for reports in sets.values() for r in reports] == [r["id"] for r in HELD_OUT]
    assert next(iter(sets)) == "public_reports_holdout.jsonl, collected 1"
    assert list(bench.report_sets(DATA)) == ["public_reports.jsonl"]


@pytest.mark.parametrize("report", EVERY_REPORT, ids=by_id)
def test_report_has_source_quote_outcome_and_named_inferences(report):
    assert report["source"].startswith("https://")
    assert isinstance(report["quote"], str) and len(report["quote"]) >= 20
    assert report["outcome"] in ("oom", "ran")
    assert isinstance(report["inferred"], dict)
    for field, reason in report["inferred"].items():
        assert (
            field and isinstance(reason, str) and reason.strip()
        ), f"inferred {field!r} needs a reason"
    if "measured_gib" in report:
        assert report["measured_gib"] > 0
        assert report["measured_kind"] in MEASURED_KINDS
        assert report["measured_what"].strip()


@pytest.mark.parametrize("report", EVERY_REPORT, ids=by_id)
def test_answers_load_into_answers(report):
    answers = dict(report["answers"])
    unknown = set(answers) - ANSWER_FIELDS - set(NEW_FIELDS)
    assert not unknown, f"fields neither in Answers nor in NEW_FIELDS: {sorted(unknown)}"
    for name, valid in NEW_FIELDS.items():
        assert name in answers, f"new field {name} missing"
        assert valid(answers[name]), f"{name}={answers[name]!r} is not an allowed value"
    gpu = answers["gpu"]
    try:
        lookup(gpu)
    except ZerofitError:
        assert gpu in GPUS_BEING_ADDED, f"gpu {gpu!r} is neither in the catalog nor being added"
        assert any(
            m.startswith("gpu:") for m in report.get("missing", [])
        ), "say the GPU is missing"
        answers["gpu"] = next(iter(CATALOG))  # check every other field against Answers
    model = answers["model"]
    if model.endswith(".json"):
        assert (ROOT / model).is_file(), f"no model config {model}"
        assert (ROOT / model).parent == MODELS
    else:
        assert model in BUILTIN_CONFIGS, f"{model!r} is not a built-in model"
    loaded = answers_from_dict({k: v for k, v in answers.items() if k in ANSWER_FIELDS})
    assert loaded.world_size == answers["gpus_per_node"] * answers["num_nodes"]


@pytest.mark.parametrize("report", [r for r in EVERY_REPORT if "ds_config" in r], ids=by_id)
def test_ds_config_agrees_with_the_answers(report):
    zero = report["ds_config"]["zero_optimization"]
    answers = report["answers"]
    assert zero["stage"] == answers["stage"]
    assert zero.get("offload_optimizer", {}).get("device", "none") == answers["offload_optimizer"]
    # DeepSpeed hands offload_param to ZeRO-3 only (engine.py:_configure_zero_optimizer)
    offload_param = (
        zero.get("offload_param", {}).get("device", "none") if zero["stage"] == 3 else "none"
    )
    assert offload_param == answers["offload_param"]
    assert "ds_config" in report["inferred"], "say where the JSON comes from"


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.json")), ids=lambda p: p.name)
def test_report_model_configs_carry_their_shape(path):
    """Each config names its source and resolves to a shape (transformers' field names, or a
    trust_remote_code family's own, which models/resolve.py reads)."""
    from zerofit.models.resolve import resolve_model

    config = json.loads(path.read_text())
    assert config["_source"] and config["model_type"]
    spec = resolve_model(str(path))
    assert spec.params > 0 and spec.num_layers > 0 and spec.vocab_size > 0


def test_the_benchmark_drops_only_fields_answers_does_not_know():
    bench = load_benchmark("public_reports")
    report = REPORTS[0]
    kept, dropped = bench.answers_dict(report, ANSWER_FIELDS)
    assert set(dropped) == set(report["answers"]) - ANSWER_FIELDS
    assert set(kept) == set(report["answers"]) & ANSWER_FIELDS
    assert Path(kept["model"]).is_absolute() or not kept["model"].endswith(".json")


def test_the_benchmark_reads_ds_configs_and_judges_host_ram_only_when_stated(tmp_path):
    """A report's DeepSpeed JSON goes through `zerofit estimate --ds-config`'s own path, and the
    RAM of the machine running the benchmark never judges a reporter's node."""
    bench = load_benchmark("public_reports")
    report = next(r for r in REPORTS if r["id"] == "lf5977-3090x8-llama3-8b-z3-offload")
    row = bench.estimate_report(report, ANSWER_FIELDS, tmp_path)
    assert row["status"] == "ok" and "buckets" in row["from_files"]
    assert row["host_ram_known"] is False and row["fits"] is True
    # the same run on a node stated to have 16 GiB of RAM cannot hold the offloaded states
    small = {**report, "answers": {**report["answers"], "host_ram_gib": 16.0}}
    row = bench.estimate_report(small, ANSWER_FIELDS, tmp_path)
    assert row["cpu_gib"] > 16 and row["fits"] is False


def _row(outcome: str, spare: float, budget: float = 80.0, host_limited: bool = False) -> dict:
    """A benchmark row whose GPU has ``spare`` GiB left after everything zerofit counts."""
    return {
        "status": "ok",
        "outcome": outcome,
        "id": f"{outcome}{spare:+}",
        "budget_gib": budget,
        "gpu_total_gib": budget - spare,
        "host_limited": host_limited,
    }


def test_the_margin_sweep_finds_the_limits_of_one_uniform_margin():
    """Runs with 5 and 2 GiB to spare, OOMs with 3, -1, -4 and one over its host RAM: keeping
    both runs fitting allows a margin of 2 GiB, which catches the host one and the two below
    it; catching 14/15 of the four OOMs (all four) needs a margin above 3 GiB, which fails the
    run with 2 GiB to spare; one OOM has more to spare than that run."""
    bench = load_benchmark("public_reports")
    rows = [
        _row("ran", 5.0),
        _row("ran", 2.0),
        _row("oom", 3.0),
        _row("oom", -1.0),
        _row("oom", -4.0),
        _row("oom", 10.0, host_limited=True),
        {"status": "error", "outcome": "oom", "id": "not evaluable"},
    ]
    sweep = bench.margin_sweep(rows)
    assert sweep["ooms"] == 4 and sweep["runs"] == 2
    assert sweep["tightest_run"] == "ran+2.0"
    assert sweep["keep_every_run"] == {"margin": 2.0, "ooms_caught": 3, "runs_fitting": 2}
    assert sweep["catch_target_share"] == {"margin": 3.01, "ooms_caught": 4, "runs_fitting": 1}
    assert sweep["ooms_beyond_the_tightest_run"] == 1
    at_zero = next(c for c in sweep["grid"] if c["margin"] == 0.0)
    assert at_zero == {"margin": 0.0, "ooms_caught": 3, "runs_fitting": 2}
    # as a share of an 80 GiB GPU, 2 GiB to spare is 2.5 %
    relative = bench.margin_sweep(rows, relative=True)
    assert relative["keep_every_run"]["margin"] == 0.025
    assert "OOMs caught 3/4, runs fitting 2/2" in "\n".join(bench.render_sweep(sweep))


def test_the_pooled_counts_split_by_whether_the_record_names_open_facts():
    """`together` counts the held-out rows, then again split into those whose record lists
    nothing its report leaves open and those with caveats; an unevaluable row counts nowhere."""
    bench = load_benchmark("public_reports")
    rows = [
        {**_row("ran", 5.0), "fits": True, "caveated": False},
        {**_row("oom", -1.0), "fits": False, "caveated": False},
        {**_row("oom", 3.0), "fits": True, "caveated": True},
        {**_row("ran", -2.0), "fits": False, "caveated": True},
        {"status": "error", "outcome": "oom", "id": "not evaluable", "caveated": True},
    ]
    held_out = {"public_reports_holdout.jsonl, collected 1": {"rows": rows, "evaluated": 4}}
    summary = bench.together(held_out)
    assert (summary["ooms_caught"], summary["ooms"]) == (1, 2)
    assert (summary["runs_fitting"], summary["runs"]) == (1, 2)
    assert summary["by_caveats"] == {
        "no caveat": {"ooms_caught": 1, "ooms": 1, "runs_fitting": 1, "runs": 1},
        "caveated": {"ooms_caught": 0, "ooms": 1, "runs_fitting": 0, "runs": 1},
    }
    text = bench.render_together(summary)
    assert "no caveat (the record lists nothing its report leaves open): OOMs caught 1/1" in text


def test_a_reserved_figure_is_compared_with_the_peak_plus_fragmentation():
    """A trainer's logged max_memory_reserved holds the allocator's blocks but no CUDA context:
    it is judged against the peak plus the fragmentation zerofit counts, nothing else."""
    bench = load_benchmark("public_reports")
    pred = {
        "status": "ok",
        "peak_gib": 70.0,
        "gpu_total_gib": 73.0,
        "allocator_gib": 1.5,
    }
    report = {"id": "r", "measured_gib": 72.0, "measured_kind": "reserved"}
    assert bench.measured_error(report, pred)["predicted_gib"] == 71.5
    used = {**report, "measured_kind": "device_used"}
    assert bench.measured_error(used, pred)["predicted_gib"] == 73.0
