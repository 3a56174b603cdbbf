"""End-to-end: servesim against stored outputs of the reference (Dynamo 1.6.1).

Each scenario file is a copy of ``shared/reference/scenarios/<name>.json``;
beside it is the reference's summary for it, produced by
``refcheck.py reference``. The comparison mirrors ``refcheck.py``: counts
exactly, latencies by relative error, cache reuse by absolute difference,
within the scenario's tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesim.cli import main

HERE = Path(__file__).resolve().parent / "reference"
METRICS = [
    ("completed_requests", "exact"),
    ("total_output_tokens", "exact"),
    ("duration_ms", "rel"),
    ("mean_ttft_ms", "rel"),
    ("median_ttft_ms", "rel"),
    ("p99_ttft_ms", "rel"),
    ("mean_tpot_ms", "rel"),
    ("mean_itl_ms", "rel"),
    ("mean_e2e_latency_ms", "rel"),
    ("p99_e2e_latency_ms", "rel"),
    ("prefix_cache_reused_ratio", "abs"),
]
SCENARIOS = sorted(p.name.removesuffix(".scenario.json") for p in HERE.glob("*.scenario.json"))


def scenario_argv(sc: dict[str, Any], shared: Path, workdir: Path, report: Path) -> list[str]:
    """The servesim command line for a scenario, as refcheck.py builds it."""
    argv = ["replay"]
    if "trace" in sc:
        trace = workdir / "trace.jsonl"
        lines = (shared / sc["trace"]).read_text().splitlines(keepends=True)
        trace.write_text("".join(lines[: sc.get("max_requests", len(lines))]))
        argv += [str(trace), "--trace-block-size", str(sc.get("trace_block_size", 512))]
        if sc.get("arrival_speedup_ratio", 1.0) != 1.0:
            argv += ["--arrival-speedup-ratio", str(sc["arrival_speedup_ratio"])]
    else:
        syn = sc["synthetic"]
        argv += [
            "--input-tokens",
            str(syn["input_tokens"]),
            "--output-tokens",
            str(syn["output_tokens"]),
            "--request-count",
            str(syn["request_count"]),
        ]
        if syn.get("arrival_interval_ms") is not None:
            argv += ["--arrival-interval-ms", str(syn["arrival_interval_ms"])]
    if sc.get("replay_concurrency") is not None:
        argv += ["--replay-concurrency", str(sc["replay_concurrency"])]
    overrides = sc.get("servesim_engine_overrides", {})
    argv += [
        "--router-mode",
        sc.get("router_mode", "round_robin"),
        "--report-json",
        str(report),
        "--quiet",
    ]
    if "prefill_engine" in sc or "decode_engine" in sc:
        argv += [
            "--num-prefill-workers", str(sc.get("num_prefill_workers", 1)),
            "--num-decode-workers", str(sc.get("num_decode_workers", 1)),
            "--prefill-engine-args", json.dumps({**sc.get("prefill_engine", {}), **overrides}),
            "--decode-engine-args", json.dumps({**sc.get("decode_engine", {}), **overrides}),
        ]  # fmt: skip
    else:
        argv += [
            "--num-workers", str(sc.get("num_workers", 1)),
            "--extra-engine-args", json.dumps({**sc.get("engine", {}), **overrides}),
        ]  # fmt: skip
    return argv


def compare(
    sc: dict[str, Any],
    ref: dict[str, Any],
    ours: dict[str, Any],
    spread: dict[str, dict[str, float]] | None = None,
) -> list[str]:
    """Metrics outside the scenario's tolerance, described.

    With a spread (the reference's KV router breaks ties at random, so its
    runs differ), a value passes within tolerance of any reference run's
    range [min, max]; otherwise of the one stored run.
    """
    tol = sc.get("tolerance", {})
    failures = []
    for key, kind in METRICS:
        o = ours[key]
        low, high = (spread[key]["min"], spread[key]["max"]) if spread else (ref[key], ref[key])
        if kind == "exact":
            good = low <= o <= high
        elif kind == "abs":
            limit = tol.get(key, tol.get("abs", 0.01))
            good = low - limit <= o <= high + limit
        else:
            limit = tol.get(key, tol.get("rel", 0.01))
            good = low - limit * abs(low) <= o <= high + limit * abs(high)
        if not good:
            failures.append(f"{key}: reference {low}..{high}, servesim {o}")
    return failures


@pytest.mark.parametrize("name", SCENARIOS)
def test_matches_reference(name: str, shared_dir: Path, tmp_path: Path) -> None:
    """servesim's summary is within the scenario tolerance of the reference's."""
    sc = json.loads((HERE / f"{name}.scenario.json").read_text())
    ref = json.loads((HERE / f"{name}.summary.json").read_text())["summary"]
    report = tmp_path / "report.json"
    assert main(scenario_argv(sc, shared_dir, tmp_path, report)) == 0
    ours = json.loads(report.read_text())["summary"]
    spread_file = HERE / f"{name}.spread.json"
    spread = json.loads(spread_file.read_text())["metrics"] if spread_file.exists() else None
    assert compare(sc, ref, ours, spread) == []


def test_two_runs_are_byte_identical_but_for_wall_time(shared_dir: Path, tmp_path: Path) -> None:
    """Same inputs give the same report, except the host wall-time fields."""
    sc = json.loads((HERE / "agg_rr_pressure.scenario.json").read_text())
    texts = []
    for i in range(2):
        report = tmp_path / f"r{i}.json"
        jsonl = tmp_path / f"r{i}.jsonl"
        assert (
            main(
                [
                    *scenario_argv(sc, shared_dir, tmp_path, report),
                    "--per-request-jsonl",
                    str(jsonl),
                ]
            )
            == 0
        )
        summary = json.loads(report.read_text())["summary"]
        for key in ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"):
            summary.pop(key)
        texts.append((json.dumps(summary, sort_keys=True), jsonl.read_bytes()))
    assert texts[0] == texts[1]
