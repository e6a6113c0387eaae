"""zerofit's OOM verdict against public reports of real full fine-tunes, LoRA and QLoRA runs.

The reports are tests/data/public_reports.jsonl (the set the estimator was developed against)
and the held-out reports tests/data/public_reports_holdout.jsonl (collected later by people who
did not run the estimator, to judge it on reports it was not built on); the LoRA / QLoRA runs
are tests/data/public_reports_lora.jsonl, scored the same way (its GPTQ, AWQ and int8 bases are
listed as not evaluable: memory/lora.py models 16-bit and NF4 bases). Each held-out record's
``collected`` field numbers the batch it came in (1 first); each batch is a set of its own, and
each set gets its own confusion matrix.

Each report is a run someone described in public (GitHub issue, project README, recipe file): its
configuration as zerofit Answers, and what really happened (OOM or ran, sometimes a measured
number).
This script runs `zerofit estimate` on each one and prints:

- the confusion matrix: real outcome (oom / ran) x predicted (does NOT fit / fits);
- every miss by id (a real OOM predicted to fit, or a run that worked predicted not to fit), with
  the caveats its record names;
- the error on the measured numbers;
- reports that cannot be estimated yet (a GPU or model missing from zerofit), with the reason;
- the held-out sets together, also split into records that list nothing their report leaves
  open and records with caveats (``verdict_counts``), and what one uniform safety margin could do
  with the estimates unchanged (``margin_sweep``): how separable the real outcomes are by the
  estimate at all.

The verdict rule (printed at the top of the output): a report is predicted to fit when the GPU
holds everything zerofit models (`fits_gpu`: the allocated peak + allocator fragmentation + NCCL
buffers + CUDA context + a colocated vLLM's share + the safety margin <= the GPU's memory as torch
reports it), and, only where the report states its node's RAM (`host_ram_gib`), when the offload
buffers fit in it. A report that does not state its host RAM is not judged on host RAM: the RAM
of the machine running this script says nothing about the reporter's node.

A report's DeepSpeed JSON (`ds_config`) goes through the same path as `zerofit estimate
--ds-config FILE` (cli/commands/estimate.py:estimate_from_files), the report's stated answers
acting as the command-line flags that override the file.

    PYTHONPATH=src python benchmarks/public_reports.py          # table
    PYTHONPATH=src python benchmarks/public_reports.py --json   # machine-readable
    PYTHONPATH=src python benchmarks/public_reports.py --gpu-proxies   # A800/A40/H20 stand-ins
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "public_reports.jsonl"
HOLDOUT = ROOT / "tests" / "data" / "public_reports_holdout.jsonl"
sys.path.insert(0, str(ROOT / "src"))  # the checkout's zerofit, not an older installed copy

# How a measured number compares with the estimate:
# - alloc_lower_bound: "already allocated + tried to allocate" from an OOM traceback, a floor
#   under torch.cuda.max_memory_allocated(): compared with peak_gib;
# - device_used: nvidia-smi style memory in use (CUDA context and allocator cache included):
#   compared with everything the estimate says the GPU holds (peak + allocator fragmentation +
#   NCCL + CUDA context + vLLM), the safety margin left out. The allocator may cache more than
#   it needs, so a device_used above the prediction is not by itself a miss.
# - reserved: torch.cuda.max_memory_reserved() as a trainer logs it (ms-swift's memory column):
#   what the caching allocator held at most, no CUDA context; compared with the peak plus the
#   allocator fragmentation zerofit counts. On a GPU with room to spare the cache keeps freed
#   blocks, so a reserved figure above the prediction is not by itself a miss either.
# - allocated: torch.cuda.max_memory_allocated() as a recipe table reports it (torchtune's
#   "peak memory"): compared with the peak itself.
# - reserved_whole_run: torch.cuda.max_memory_reserved() read once after a whole epoch of rows of
#   varying length on a GPU with room to spare (ms-swift 1.x's benchmark). The caching allocator
#   gives cached segments back only when cudaMalloc fails (CUDACachingAllocator.cpp: malloc ->
#   release_cached_blocks), so every differently sized step can leave more cached: the figure
#   depends on the order of the rows, not on the setup alone (ms-swift's own table falls from
#   512 to 1024 tokens for chatglm3-6b and baichuan2-7b). What it does bound is the step's
#   allocated peak (max_memory_allocated <= max_memory_reserved): a ceiling, the mirror of
#   alloc_lower_bound, consistent when the predicted peak is at or below it.
MEASURED_KINDS = (
    "alloc_lower_bound",
    "device_used",
    "reserved",
    "allocated",
    "reserved_whole_run",
)
# kinds that bound the real peak instead of measuring it: checked, not scored as an error
BOUND_KINDS = ("alloc_lower_bound", "reserved_whole_run")
# the LoRA reports' ``quantization`` (tests/data/public_reports_lora.md): none (16-bit base) and
# nf4 (bitsandbytes, QLoRA) are what memory/lora.py models; GPTQ, AWQ and int8 bases are not
LORA_REPORTS = ROOT / "tests" / "data" / "public_reports_lora.jsonl"
MODELLED_QUANTIZATION = ("none", "nf4")
VERDICT_RULE = (
    "fits = the GPU holds peak + allocator + NCCL + CUDA context + vLLM + safety "
    "margin within its memory, and the offload buffers fit the node's RAM only where "
    "the report states it (unknown host RAM is not limiting)"
)

# --gpu-proxies: GPUs the catalog lacks today, stood in for by the entry with the same usable
# memory, so the verdict can be read on every report before the catalog grows. Not the default:
# a proxy shares memory, not the name (the memory helper adds the real entries).
# A800 80GB: the A100 80GB with slower NVLink, same 80 GB HBM2e.
# A40: 48 GB GDDR6 with ECC, nvidia-smi shows 46068 MiB total, like the L40S.
# H20: 96 GB HBM3; the nearest smaller catalog entry is the H100 NVL (94 GB), a conservative proxy.
GPU_PROXIES = {"A800": "A100-80GB", "A40": "L40S", "H20": "H100-NVL"}


def load_reports(path: Path = DATA) -> list[dict]:
    """Every report of the JSONL file, in file order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def report_sets(path: Path) -> dict[str, list[dict]]:
    """A reports file as the sets it holds, by name: the whole file, or, when its records say
    which batch they were collected in (``collected``), one set per batch in collection order."""
    reports = load_reports(path)
    batches = sorted({report["collected"] for report in reports if "collected" in report})
    if not batches:
        return {path.name: reports}
    missing = [report["id"] for report in reports if "collected" not in report]
    if missing:
        raise SystemExit(f"{path}: records without a collected batch: {', '.join(missing)}")
    return {
        f"{path.name}, collected {batch}": [r for r in reports if r["collected"] == batch]
        for batch in batches
    }


def answer_fields() -> set[str]:
    """The field names Answers has in this version of zerofit."""
    from zerofit.planning.answers import Answers

    return {f.name for f in dataclasses.fields(Answers)}


def answers_dict(
    report: dict, known: set[str], proxies: dict[str, str] | None = None
) -> tuple[dict, list[str]]:
    """The report's answers limited to fields Answers knows, and the names it dropped.

    Model paths in the data are relative to the repository root; they are made absolute so the
    script runs from any directory. ``proxies`` maps a GPU name the catalog lacks to a stand-in.
    """
    data = dict(report["answers"])
    if proxies and data.get("gpu") in proxies:
        data["gpu"] = proxies[data["gpu"]]
    model = data.get("model", "")
    if model.endswith(".json") and not Path(model).is_absolute():
        data["model"] = str(ROOT / model)
    dropped = sorted(k for k in data if k not in known)
    return {k: v for k, v in data.items() if k in known}, dropped


def estimate_report(
    report: dict, known: set[str], tmpdir: Path, proxies: dict[str, str] | None = None
) -> dict:
    """Run zerofit's estimate on one report: status ok with the verdict, or error with its line."""
    from zerofit.cli.commands.estimate import estimate_from_files
    from zerofit.errors import ZerofitError

    data, dropped = answers_dict(report, known, proxies)
    if report.get("not_evaluable"):
        # the record names what zerofit cannot model in that run (a loss kernel, activation
        # offloading, another quantizer): scoring another setup would say nothing
        return {"status": "error", "error": report["not_evaluable"], "dropped": dropped}
    quantization = report["answers"].get("quantization", "none")
    if quantization not in MODELLED_QUANTIZATION:
        # a GPTQ / AWQ / int8 base: its packed weights and kernels are not in the memory model
        return {
            "status": "error",
            "error": f"quantization: {quantization} is not modelled (fix: none, or nf4 as QLoRA)",
            "dropped": dropped,
        }
    ds_path = None
    if "ds_config" in report:
        ds_path = tmpdir / f"{report['id']}.ds_config.json"
        ds_path.write_text(json.dumps(report["ds_config"]))
    try:
        result = estimate_from_files(data, ds_config=str(ds_path) if ds_path else None)
    except ZerofitError as err:
        return {"status": "error", "error": str(err), "dropped": dropped}
    host_known = report["answers"].get("host_ram_gib") is not None
    fits = result["fits_gpu"] and (result["fits_host"] or not host_known)
    total = result["gpu_need_gib"] - result["safety_margin_gib"]
    return {
        "status": "ok",
        "fits": bool(fits),
        "peak_gib": result["peak_gib"],
        "gpu_total_gib": round(total, 3),
        # the estimate's own allocator-fragmentation figure (what a logged "reserved" adds)
        "allocator_gib": result["outside_peak_gib"]["allocator_fragmentation"],
        "budget_gib": result.get("budget_gib"),
        "gpu_need_gib": result["gpu_need_gib"],
        "host_ram_known": host_known,
        # the node's stated RAM cannot hold the offload buffers: no GPU margin changes the verdict
        "host_limited": host_known and not result["fits_host"],
        "cpu_gib": result["cpu_gib"],
        "peak_phase": result.get("peak_phase"),
        "loss_path": result["loss_path"],
        "optimizer": result["optimizer"],
        "breakdown": result["breakdown"],
        "from_files": result["from_files"],
        "dropped": dropped,
    }


def dominant_terms(breakdown: dict[str, float], n: int = 4) -> str:
    """The ``n`` largest terms of an estimate's breakdown, "name GiB" each."""
    top = sorted(breakdown.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {gib:.2f}" for name, gib in top)


def measured_error(report: dict, pred: dict) -> dict | None:
    """Predicted vs measured for a report with a number; relative error of the prediction."""
    if "measured_gib" not in report or pred["status"] != "ok":
        return None
    kind = report["measured_kind"]
    if kind in ("alloc_lower_bound", "allocated", "reserved_whole_run"):
        predicted = pred["peak_gib"]
    elif kind == "reserved":
        predicted = round(pred["peak_gib"] + pred["allocator_gib"], 3)
    else:
        predicted = pred["gpu_total_gib"]
    measured = report["measured_gib"]
    return {
        "id": report["id"],
        "kind": kind,
        "measured_gib": measured,
        "predicted_gib": predicted,
        "error": round((predicted - measured) / measured, 4),
        # a lower bound is only violated when the prediction is below it, a ceiling when above
        "consistent": (
            predicted >= measured
            if kind == "alloc_lower_bound"
            else predicted <= measured if kind == "reserved_whole_run" else None
        ),
    }


def scored_errors(measured: list[dict]) -> dict | None:
    """Median and largest |error| over the exact figures (bounds are checked, not scored), and
    how many bounds the predictions keep; None when there is nothing measured."""
    exact = sorted(abs(m["error"]) for m in measured if m["kind"] not in BOUND_KINDS)
    bounds = [m for m in measured if m["kind"] in BOUND_KINDS]
    if not exact and not bounds:
        return None
    return {
        "exact": len(exact),
        "median_abs_error": statistics.median(exact) if exact else None,
        "max_abs_error": exact[-1] if exact else None,
        "bounds": len(bounds),
        "bounds_kept": sum(1 for m in bounds if m["consistent"]),
    }


def evaluate(reports: list[dict], proxies: dict[str, str] | None = None) -> dict:
    """Predictions, confusion matrix, misses and measured errors for all reports.

    ``proxies``: GPUs the catalog lacks, mapped to a stand-in with the same memory (only those
    the catalog does not know yet are replaced).
    """
    known = answer_fields()
    proxies = {k: v for k, v in (proxies or {}).items() if not _in_catalog(k)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for report in reports:
            pred = estimate_report(report, known, Path(tmp), proxies)
            rows.append(
                {
                    "id": report["id"],
                    "outcome": report["outcome"],
                    "workload": report["answers"].get("workload"),
                    # the record names facts the report leaves open (its ``missing`` list)
                    "caveated": bool(report.get("missing")),
                    **pred,
                }
            )
    matrix = {
        "oom": {"predicted_oom": 0, "predicted_fits": 0},
        "ran": {"predicted_oom": 0, "predicted_fits": 0},
    }
    misses, errors = [], []
    caveats = {report["id"]: report.get("missing", []) for report in reports}
    for row in rows:
        if row["status"] != "ok":
            errors.append({"id": row["id"], "error": row["error"]})
            continue
        predicted = "predicted_fits" if row["fits"] else "predicted_oom"
        matrix[row["outcome"]][predicted] += 1
        wrong = (row["outcome"] == "oom") == row["fits"]
        if wrong:
            misses.append(
                {
                    "id": row["id"],
                    "miss": (
                        "real OOM predicted to fit"
                        if row["outcome"] == "oom"
                        else "ran, predicted not to fit"
                    ),
                    "peak_gib": row["peak_gib"],
                    "gpu_need_gib": row["gpu_need_gib"],
                    "budget_gib": row["budget_gib"],
                    "phase": row["peak_phase"],
                    "loss_path": row["loss_path"],
                    "optimizer": row["optimizer"],
                    "terms": dominant_terms(row["breakdown"]),
                    # what the record says the report leaves open (its ``missing`` list)
                    "caveats": caveats[row["id"]],
                }
            )
    measured = [m for r, p in zip(reports, rows, strict=True) if (m := measured_error(r, p))]
    dropped = sorted({name for row in rows for name in row["dropped"]})
    return {
        "reports": len(reports),
        "evaluated": len(rows) - len(errors),
        "matrix": matrix,
        "gpu_proxies": proxies,
        "misses": misses,
        "measured": measured,
        "not_evaluable": errors,
        "dropped_fields": dropped,
        "rule": VERDICT_RULE,
        "rows": rows,
    }


# The target: at least 14 of every 15 real OOMs predicted not to fit, and every run to fit.
TARGET_OOM_SHARE = 14 / 15
# margins (GiB, then as a share of the GPU's memory) the sweep prints besides its two extremes
SWEEP_GIB = (-8.0, -4.0, -2.0, 0.0, 1.0, 2.0, 4.0, 8.0, 16.0)
SWEEP_SHARE = (-0.1, -0.05, 0.0, 0.0125, 0.05, 0.1, 0.2)


def margin_sweep(rows: list[dict], relative: bool = False) -> dict:
    """What one uniform safety margin could do with every estimate left as it is.

    A report is predicted to fit under margin ``m`` when the GPU has at least ``m`` to spare
    after everything zerofit counts (``budget_gib - gpu_total_gib``; with ``relative``, that spare
    as a share of the GPU) and its stated host RAM holds the offload buffers. Sweeping ``m``
    shows how far the reports' outcomes are separable by the estimate at all: the largest margin
    that keeps every run fitting, the smallest that catches the target's share of OOMs, and the
    OOMs with more to spare than the tightest run (no margin catches those without failing it).
    """
    ok = [r for r in rows if r["status"] == "ok"]

    def spare(row: dict) -> float:
        left = row["budget_gib"] - row["gpu_total_gib"]
        return left / row["budget_gib"] if relative else left

    ooms = [r for r in ok if r["outcome"] == "oom"]
    runs = [r for r in ok if r["outcome"] == "ran" and not r["host_limited"]]
    failed_runs = sum(1 for r in ok if r["outcome"] == "ran" and r["host_limited"])
    host_caught = sum(1 for r in ooms if r["host_limited"])
    oom_spares = sorted(spare(r) for r in ooms if not r["host_limited"])

    def counts(margin: float) -> dict:
        return {
            "margin": round(margin, 4),
            "ooms_caught": host_caught + sum(1 for x in oom_spares if x < margin),
            "runs_fitting": sum(1 for r in runs if spare(r) >= margin),
        }

    tightest = min(runs, key=spare) if runs else None
    keep_runs = counts(spare(tightest)) if tightest else None
    needed = math.ceil(TARGET_OOM_SHARE * len(ooms)) - host_caught
    if needed <= 0:
        catch = counts(min([*oom_spares, 0.0]))
    elif needed <= len(oom_spares):
        # just above the needed-th smallest spare among the OOMs
        catch = counts(oom_spares[needed - 1] + (1e-4 if relative else 0.01))
    else:
        catch = None
    beyond = sum(1 for x in oom_spares if tightest and x >= spare(tightest))
    grid = SWEEP_SHARE if relative else SWEEP_GIB
    return {
        "relative": relative,
        "ooms": len(ooms),
        "runs": len(runs) + failed_runs,
        "runs_failed_on_host_ram": failed_runs,
        "keep_every_run": keep_runs,
        "tightest_run": tightest["id"] if tightest else None,
        "catch_target_share": catch,
        "ooms_beyond_the_tightest_run": beyond,
        "grid": [counts(m) for m in grid],
    }


def render_sweep(sweep: dict) -> list[str]:
    """The margin sweep as lines of text."""
    unit = "of the GPU" if sweep["relative"] else "GiB"

    def margin(m: float) -> str:
        return f"{100 * m:+.2f} % {unit}" if sweep["relative"] else f"{m:+.2f} {unit}"

    def result(c: dict) -> str:
        return (
            f"OOMs caught {c['ooms_caught']}/{sweep['ooms']}, runs fitting "
            f"{c['runs_fitting']}/{sweep['runs']}"
        )

    lines = []
    if sweep["keep_every_run"]:
        keep = sweep["keep_every_run"]
        lines.append(
            f"  largest margin keeping every run fitting: {margin(keep['margin'])} "
            f"({sweep['tightest_run']}): {result(keep)}"
        )
    if sweep["catch_target_share"]:
        catch = sweep["catch_target_share"]
        lines.append(
            f"  smallest margin catching {TARGET_OOM_SHARE:.1%} of OOMs: "
            f"{margin(catch['margin'])}: {result(catch)}"
        )
    lines.append(
        f"  OOMs with at least as much to spare as the tightest run: "
        f"{sweep['ooms_beyond_the_tightest_run']}/{sweep['ooms']}"
    )
    if sweep["runs_failed_on_host_ram"]:
        lines.append(
            f"  runs predicted not to fit their stated host RAM, whatever the margin: "
            f"{sweep['runs_failed_on_host_ram']}"
        )
    lines += [f"  margin {margin(c['margin'])}: {result(c)}" for c in sweep["grid"]]
    return lines


def together(results: dict[str, dict]) -> dict:
    """Every held-out set's rows as one set: its confusion counts and margin sweeps."""
    held_out = [result for name, result in results.items() if name != DATA.name]
    rows = [row for result in held_out for row in result["rows"]]

    return {
        "sets": [name for name in results if name != DATA.name],
        "evaluated": sum(result["evaluated"] for result in held_out),
        **verdict_counts(rows),
        "by_caveats": {
            "no caveat": verdict_counts([row for row in rows if not row["caveated"]]),
            "caveated": verdict_counts([row for row in rows if row["caveated"]]),
        },
        "sweep_gib": margin_sweep(rows),
        "sweep_share": margin_sweep(rows, relative=True),
    }


def verdict_counts(rows: list[dict]) -> dict:
    """OOMs caught and runs predicted to fit among ``rows`` (the evaluated ones)."""
    ok = [row for row in rows if row["status"] == "ok"]
    ooms = [row for row in ok if row["outcome"] == "oom"]
    runs = [row for row in ok if row["outcome"] == "ran"]
    return {
        "ooms_caught": sum(not row["fits"] for row in ooms),
        "ooms": len(ooms),
        "runs_fitting": sum(row["fits"] for row in runs),
        "runs": len(runs),
    }


def render_together(summary: dict) -> str:
    """The held-out sets as one: the verdict's counts, then what any uniform margin could do."""
    lines = [
        f"held-out reports: {summary['evaluated']} evaluated in {len(summary['sets'])} sets",
        f"OOMs caught: {summary['ooms_caught']}/{summary['ooms']}; runs that worked predicted "
        f"to fit: {summary['runs_fitting']}/{summary['runs']}",
        *render_by_caveats(summary["by_caveats"]),
        "",
        "what one uniform safety margin could do, every estimate unchanged (a report fits when "
        "the GPU has at least the margin to spare after everything zerofit counts):",
        " in GiB:",
        *render_sweep(summary["sweep_gib"]),
        " as a share of the GPU's memory:",
        *render_sweep(summary["sweep_share"]),
    ]
    return "\n".join(lines)


def render_by_caveats(by_caveats: dict) -> list[str]:
    """The pooled counts split by whether the record names facts its report leaves open."""
    what = {
        "no caveat": "the record lists nothing its report leaves open",
        "caveated": "the record names facts the report leaves open",
    }
    return [
        f" {name} ({what[name]}): OOMs caught {c['ooms_caught']}/{c['ooms']}; runs predicted "
        f"to fit {c['runs_fitting']}/{c['runs']}"
        for name, c in by_caveats.items()
    ]


def _in_catalog(name: str) -> bool:
    from zerofit.errors import ZerofitError
    from zerofit.hardware import lookup

    try:
        lookup(name)
    except ZerofitError:
        return False
    return True


def render(result: dict) -> str:
    """The human-readable report."""
    m = result["matrix"]
    lines = [
        f"public reports: {result['reports']}, evaluated: {result['evaluated']}, "
        f"not evaluable yet: {len(result['not_evaluable'])}"
    ]
    if result["gpu_proxies"]:
        lines.append(
            "note: GPUs missing from the catalog stood in for by the same memory: "
            + ", ".join(f"{k} -> {v}" for k, v in result["gpu_proxies"].items())
        )
    if result["dropped_fields"]:
        lines.append(
            "note: Answers does not know these report fields yet, dropped: "
            + ", ".join(result["dropped_fields"])
        )
    lines.append("verdict rule: " + result["rule"])
    lines += [
        "",
        f"{'real / predicted':<18}{'does NOT fit':>14}{'fits':>8}",
        f"{'oom':<18}{m['oom']['predicted_oom']:>14}{m['oom']['predicted_fits']:>8}",
        f"{'ran':<18}{m['ran']['predicted_oom']:>14}{m['ran']['predicted_fits']:>8}",
    ]
    oom_total = m["oom"]["predicted_oom"] + m["oom"]["predicted_fits"]
    ran_total = m["ran"]["predicted_oom"] + m["ran"]["predicted_fits"]
    lines.append(
        f"OOMs caught: {m['oom']['predicted_oom']}/{oom_total}; "
        f"runs that worked predicted to fit: {m['ran']['predicted_fits']}/{ran_total}"
    )
    lines += ["", "misses:"]
    for x in result["misses"]:
        lines.append(
            f"  {x['id']}: {x['miss']}: the GPU must hold {x['gpu_need_gib']:.2f} GiB "
            f"of {x['budget_gib']} (peak {x['peak_gib']:.2f} in {x['phase']}; "
            f"loss {x['loss_path']}, {x['optimizer']})"
        )
        lines.append(f"      dominant terms (GiB): {x['terms']}")
        lines += [f"      caveat in the record: {note}" for note in x["caveats"]]
    lines += ["", "measured numbers (predicted vs measured, GiB):"]
    scores = scored_errors(result["measured"])
    if scores and scores["exact"]:
        lines.append(
            f"  exact figures: {scores['exact']}, median |error| "
            f"{100 * scores['median_abs_error']:.1f}%, largest "
            f"{100 * scores['max_abs_error']:.1f}%"
        )
    if scores and scores["bounds"]:
        lines.append(f"  bounds kept: {scores['bounds_kept']}/{scores['bounds']}")
    for x in result["measured"]:
        note = _bound_note(x)
        lines.append(
            f"  {x['id']}: {x['kind']} measured {x['measured_gib']:.2f}, predicted "
            f"{x['predicted_gib']:.2f}, error {100 * x['error']:+.1f}%{note}"
        )
    lines += ["", "not evaluable yet:"]
    lines += [f"  {x['id']}: {x['error']}" for x in result["not_evaluable"]]
    return "\n".join(lines)


def _bound_note(row: dict) -> str:
    """How a bound figure is met: above a floor, below a ceiling ("" for an exact figure)."""
    if row["consistent"] is None:
        return ""
    if row["kind"] == "reserved_whole_run":
        return "  ok: below the ceiling" if row["consistent"] else "  ABOVE the measured ceiling"
    return "  ok: above the floor" if row["consistent"] else "  BELOW the measured floor"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--data",
        type=Path,
        action="append",
        help="a reports file (JSONL), one set per collected batch; repeat for several (default: "
        "the main, held-out and LoRA sets)",
    )
    parser.add_argument(
        "--gpu-proxies",
        action="store_true",
        help="estimate GPUs the catalog lacks (A800, A40, H20) on a same-memory entry",
    )
    args = parser.parse_args(argv)
    proxies = GPU_PROXIES if args.gpu_proxies else None
    results = {}
    for path in args.data or [DATA, HOLDOUT, LORA_REPORTS]:
        for name, reports in report_sets(path).items():
            results[name] = evaluate(reports, proxies)
    summary = together(results) if len(results) > 1 else None
    if args.json:
        extra = {"held_out_together": summary} if summary else {}
        print(json.dumps({**results, **extra}, indent=2))
        return 0
    for name, result in results.items():
        print(f"=== {name}")
        print(render(result))
        print()
    if summary and summary["sets"]:
        print("=== the held-out sets together")
        print(render_together(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
