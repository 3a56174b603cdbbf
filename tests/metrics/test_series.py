"""The report's ``series``: each checked against a direct count over the records."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from servesim import EngineConfig, Report, Role, RunConfig, Sla, parse_engine_args, run
from servesim.metrics import series
from servesim.metrics.collector import Terminal, facts_of, latencies
from servesim.metrics.series import NUM_POINTS, quantiles
from servesim.metrics.stats import rank
from servesim.simulation import pool_shapes
from tests.support import write_trace

# Ten requests on two workers, some sharing a prefix, one too long for the KV cache.
ROWS = [
    (0, 1000, 10, [1, 2]),
    (100, 3000, 50, [3, 4, 5, 6, 7, 8]),
    (200, 1200, 30, [1, 2, 9]),
    (300, 500, 40, [10]),
    (300, 9000, 5, list(range(20, 38))),
    (2000, 2000, 20, [11, 12, 13, 14]),
    (2100, 1000, 60, [1, 2]),
    (2500, 700, 1, [15, 16]),
    (4000, 2500, 25, [3, 4, 5, 6, 7]),
    (4100, 800, 80, [17, 18]),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    trace = write_trace(tmp_path_factory.mktemp("series") / "trace.jsonl", ROWS)
    engine = EngineConfig(block_size=64, num_gpu_blocks=120)
    return run(RunConfig(trace=trace, engine=engine, num_workers=2))


def test_quantiles_are_the_summary_percentiles() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    q = quantiles(values)
    assert len(q) == 101 and q[0] == 1.0 and q[100] == 5.0
    assert q[50] == sorted(values)[rank(5, 50.0)] == 3.0
    assert quantiles([]) == []


def test_distributions_hold_every_completed_requests_latency(report: Report) -> None:
    assert report.summary["rejected_requests"] == 1
    dists = report.series["distributions"]
    done = [latencies(r) for r in report.records if r.terminal_status is Terminal.COMPLETED]
    assert dists["ttft_ms"][0] == round(min(x.ttft for x in done if x.ttft is not None), 4)
    assert dists["ttft_ms"][100] == round(report.summary["max_ttft_ms"], 4)
    assert dists["e2e_latency_ms"][90] == round(report.summary["p90_e2e_latency_ms"], 4)
    assert dists["itl_ms"][99] == round(report.summary["p99_tpot_ms"], 4)


def test_over_time_counts_add_up_to_the_run(report: Report) -> None:
    ot = report.series["over_time"]
    seconds = ot["bucket_ms"] / 1000.0
    assert len(ot["t_ms"]) == NUM_POINTS
    end = max(r.terminal_time_ms for r in report.records if r.terminal_time_ms is not None)
    assert ot["bucket_ms"] == round(end / NUM_POINTS, 4)
    completed = sum(v * seconds for v in ot["request_throughput_rps"])
    assert completed == pytest.approx(report.summary["completed_requests"], rel=1e-3)
    tokens = sum(v * seconds for v in ot["output_throughput_tok_s"])
    assert tokens == pytest.approx(sum(r.output_length for r in report.records), rel=1e-3)


def test_pool_state_matches_a_direct_count_at_every_bucket_start(report: Report) -> None:
    (pool,) = report.series["pools"]
    assert pool["name"] == "aggregated" and pool["num_ranks"] == 2 and pool["per_rank"]
    bucket = report.series["over_time"]["bucket_ms"]
    end = max(r.terminal_time_ms for r in report.records if r.terminal_time_ms is not None)
    exact_bucket = end / NUM_POINTS
    for k in range(NUM_POINTS):
        t = k * exact_bucket
        for rank_id in range(2):
            mine = [r for r in report.records if r.decode_worker_idx == rank_id]
            running = [
                r
                for r in mine
                if r.first_admit_ms is not None
                and r.first_admit_ms
                <= t
                < (r.terminal_time_ms if r.terminal_time_ms is not None else math.inf)
            ]
            queued = [
                r
                for r in mine
                if r.arrival_time_ms + r.queue_wait_ms <= t
                and t
                < (r.first_admit_ms if r.first_admit_ms is not None else r.terminal_time_ms or 0)
            ]
            assert pool["running_requests"][rank_id][k] == len(running), (k, rank_id)
            assert pool["queued_requests"][rank_id][k] == len(queued), (k, rank_id)
            held = 0.0
            for r in running:
                assert r.first_token_ms is not None and r.last_token_ms is not None
                if t < r.first_token_ms:
                    held += r.input_length
                elif t < r.last_token_ms:
                    share = (t - r.first_token_ms) / (r.last_token_ms - r.first_token_ms)
                    held += r.input_length + 1 + (r.output_length - 1) * share
                else:
                    held += r.input_length + r.output_length
            assert pool["kv_usage_ratio"][rank_id][k] == pytest.approx(
                held / (120 * 64), abs=1e-4
            ), (k, rank_id)
    assert bucket > 0


def test_prefix_reuse_per_rank_is_the_completed_requests_share(report: Report) -> None:
    (pool,) = report.series["pools"]
    for rank_id in range(2):
        done = [
            r
            for r in report.records
            if r.decode_worker_idx == rank_id and r.terminal_status is Terminal.COMPLETED
        ]
        expected = sum(r.first_admission_reused_input_tokens for r in done) / sum(
            r.input_length for r in done
        )
        assert pool["prefix_reuse_ratio"][rank_id] == round(expected, 4)


def test_disaggregated_runs_have_both_pools_and_transfer_times(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", ROWS[:4])
    transfer = {"kv_transfer_bandwidth": 64, "kv_transfer_bytes_per_token": 131072}
    keys = {"block_size": 64, "num_gpu_blocks": 200, **transfer}
    report = run(
        RunConfig(
            trace=trace,
            prefill_engine=parse_engine_args(keys, role=Role.PREFILL),
            decode_engine=parse_engine_args(keys, role=Role.DECODE),
            num_prefill_workers=1,
            num_decode_workers=2,
        )
    )
    assert [p["name"] for p in report.series["pools"]] == ["prefill", "decode"]
    transfers = report.series["transfers"]
    moves = sorted(
        r.destination_activated_ms - r.destination_reserved_ms
        for r in report.records
        if r.destination_activated_ms is not None and r.destination_reserved_ms is not None
    )
    assert len(moves) == 4 and transfers["kv_transfer_ms"][100] == round(moves[-1], 4)
    assert transfers["kv_transfer_ms"][0] == round(moves[0], 4) > 0
    assert len(transfers["handoff_ms"]) == 101


@pytest.mark.parametrize("disaggregated", [False, True])
def test_a_run_without_records_reports_the_same_series_and_summary(
    tmp_path: Path, disaggregated: bool
) -> None:
    # Without records (the CLI's default, no --per-request-jsonl) each ended request is
    # folded into a row of facts; a disaggregated one only when its handoff retires,
    # since its source may be released after the request ended.
    trace = write_trace(tmp_path / "trace.jsonl", ROWS)
    keys = {"block_size": 64, "num_gpu_blocks": 120}
    cluster: dict[str, Any] = (
        {
            "num_prefill_workers": 1,
            "num_decode_workers": 2,
            "prefill_engine": parse_engine_args(keys, role=Role.PREFILL),
            "decode_engine": parse_engine_args(keys, role=Role.DECODE),
        }
        if disaggregated
        else {"num_workers": 2, "engine": parse_engine_args(keys)}
    )
    sla = Sla(ttft_ms=400.0, itl_ms=15.0)
    kept = run(RunConfig(trace=trace, sla=sla, **cluster))
    folded = run(RunConfig(trace=trace, sla=sla, keep_records=False, **cluster))
    assert folded.records == [] and kept.series["distributions"]["ttft_ms"]
    assert folded.series == kept.series
    wall = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    assert {k: v for k, v in folded.summary.items() if k not in wall} == {
        k: v for k, v in kept.summary.items() if k not in wall
    }


def test_large_pools_report_mean_and_max_over_ranks(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", ROWS[:4])
    report = run(RunConfig(trace=trace, engine=EngineConfig(block_size=64), num_workers=65))
    (pool,) = report.series["pools"]
    assert not pool["per_rank"] and pool["num_ranks"] == 65
    assert set(pool["running_requests"]) == {"mean", "max"}
    assert max(pool["running_requests"]["max"]) == 1.0
    # Four requests completed, each on its own rank: none finds another's prefix there.
    assert pool["prefix_reuse_ratio"]["ranks"] == 4
    assert pool["prefix_reuse_ratio"]["min"] == pool["prefix_reuse_ratio"]["max"] == 0.0


def test_a_large_pool_gives_the_same_mean_and_max_chunk_by_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", ROWS)
    config = RunConfig(trace=trace, engine=EngineConfig(block_size=64), num_workers=70)
    report = run(config)
    monkeypatch.setattr(series, "RANKS_PER_CHUNK", 8)
    chunked = series.build_series(facts_of(report.records), pool_shapes(config))
    assert chunked == report.series
    (pool,) = chunked["pools"]
    assert max(pool["queued_requests"]["max"]) >= 0 and max(pool["kv_usage_ratio"]["max"]) > 0
