"""Worker lifecycle under a scaling policy: starting, active, draining, removed.

The runs are small aggregated and disaggregated replays under fixed timing
(a pass costs 10 ms if it prefills and 1 ms if it decodes), driven by a
scripted schedule of pool sizes (``tests.support.Schedule``). Requests of
100 prompt and 20 output tokens arrive every 100 ms, so each runs 10 + 19 x 1
= 29 ms alone, and round robin alternates them over the active workers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.cluster.runtime import Stage
from servesim.config import Role
from servesim.metrics.report import request_row
from servesim.simulation import Report
from tests.support import Schedule, paid_worker_seconds, state_at

AGG, PREFILL, DECODE = Stage.AGGREGATED, Stage.PREFILL, Stage.DECODE
FIXED = {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}


def _agg(
    steps: Sequence[tuple[float, Mapping[Stage, int]]],
    *,
    workers: int = 2,
    startup_s: float = 10.0,
    count: int = 40,
    router: str = "round_robin",
    dp_size: int = 1,
    telemetry_ms: float | None = None,
) -> Report:
    engine = {"block_size": 16, "timing_model": FIXED, "startup_time": startup_s}
    return run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=100, output_tokens=20, request_count=count, arrival_interval_ms=100
            ),
            num_workers=workers,
            router_mode=router,
            engine=parse_engine_args({**engine, "dp_size": dp_size}),
            telemetry_interval_ms=telemetry_ms,
        ),
        scaling=Schedule(steps),
    )


def _transitions(report: Report) -> list[tuple[float, int, str | None, str]]:
    return [
        (t["at_ms"], t["worker_id"], t["prior_state"], t["state"])
        for t in report.sections["lifecycle_transitions"]
    ]


def test_startups_are_cancelled_before_active_workers_drain() -> None:
    """Up to 4 at 500 ms (workers 2 and 3 start, 10 s startup), down to 3 at 1,000 (worker 3's
    startup is cancelled), down to 1 at 1,310 (worker 2's startup is cancelled, then worker 1,
    the highest active id, drains). Worker 1 is then serving the request that arrived at 1,300:
    it is removed when that request ends, at 1,329, not before."""
    report = _agg([(500.0, {AGG: 4}), (1000.0, {AGG: 3}), (1310.0, {AGG: 1})])
    assert _transitions(report) == [
        (500.0, 2, None, "starting"),
        (500.0, 3, None, "starting"),
        (1000.0, 3, "starting", "removed"),
        (1310.0, 2, "starting", "removed"),
        (1310.0, 1, "active", "draining"),
        (1329.0, 1, "draining", "removed"),
    ]
    by_arrival = sorted(report.records, key=lambda r: r.arrival_time_ms)
    assert by_arrival[13].worker == 1 and by_arrival[13].terminal_time_ms == 1329.0
    # No placement on the draining worker, nor on the starting ones.
    assert {r.worker for r in by_arrival if r.arrival_time_ms > 1310.0} == {0}
    assert {r.worker for r in by_arrival} == {0, 1}
    # Paid: 2 workers to 500, 4 to 1,000, 3 to 1,310, 2 (one draining) to 1,329, then 1,
    # to the last request's end at 3,929.
    assert report.summary["duration_ms"] == 3929.0
    expected = (2 * 500 + 4 * 500 + 3 * 310 + 2 * 19 + 1 * (3929 - 1329)) / 1000
    assert math.isclose(report.summary["decode_worker_seconds"], expected, rel_tol=1e-12)


def test_telemetry_lists_workers_by_lifecycle_state() -> None:
    """The schedule above, sampled every 440 ms: starting workers are listed apart (no gauges),
    a draining one with its gauges, a removed one not at all."""
    report = _agg([(500.0, {AGG: 4}), (1000.0, {AGG: 3}), (1310.0, {AGG: 1})], telemetry_ms=440.0)
    samples = {s["sampled_at_ms"]: s for s in report.sections["telemetry"]["samples"]}

    def ids(at: float) -> tuple[list[int], list[int], list[int], list[int]]:
        s = samples[at]
        rows = [m["worker_id"] for m in s["decode_scheduler_metrics"]]
        return s["active_decode_ids"], s["starting_decode_ids"], s["draining_decode_ids"], rows

    assert ids(440.0) == ([0, 1], [], [], [0, 1])
    assert ids(880.0) == ([0, 1], [2, 3], [], [0, 1])
    assert ids(1320.0) == ([0], [], [1], [0, 1])  # worker 1 drains until 1,329
    assert ids(1760.0) == ([0], [], [], [0])


def test_a_started_worker_takes_requests_once_ready() -> None:
    """One worker, up to 2 at 500 ms with a 1 s startup: worker 1 is ready at 1,500 (before
    that instant's arrival, as the reference applies readiness before arrivals) and from then
    on round robin alternates over both."""
    report = _agg([(500.0, {AGG: 2})], workers=1, startup_s=1.0)
    assert _transitions(report) == [
        (500.0, 1, None, "starting"),
        (1500.0, 1, "starting", "active"),
    ]
    on_1 = sorted(r.arrival_time_ms for r in report.records if r.worker == 1)
    assert on_1[0] == 1500.0 and len(on_1) == 13  # every other of the 25 arrivals from 1,500


def test_without_startup_time_a_worker_is_active_at_once() -> None:
    """No startup time: the added worker is active at the tick itself."""
    report = _agg([(500.0, {AGG: 2})], workers=1, startup_s=0.0)
    assert _transitions(report) == [(500.0, 1, None, "active")]
    assert min(r.arrival_time_ms for r in report.records if r.worker == 1) == 600.0


def test_kv_router_places_only_on_active_workers() -> None:
    """The KV router: worker 3, started at 500 (1 s startup), takes requests from 1,500; down to
    2 at 2,000 drains the highest ids, 3 then 2 (each idle at the tick: removed at once, as
    the reference lists an idle worker's drain and removal together), and
    nothing is placed on them afterwards."""
    report = _agg(
        [(500.0, {AGG: 4}), (2000.0, {AGG: 2})], workers=3, startup_s=1.0, router="kv_router"
    )
    assert _transitions(report) == [
        (500.0, 3, None, "starting"),
        (1500.0, 3, "starting", "active"),
        (2000.0, 3, "active", "draining"),
        (2000.0, 3, "draining", "removed"),
        (2000.0, 2, "active", "draining"),
        (2000.0, 2, "draining", "removed"),
    ]
    for r in report.records:
        assert r.worker not in (2, 3) or r.arrival_time_ms < 2000.0
        assert r.worker != 3 or r.arrival_time_ms >= 1500.0
    assert any(r.worker == 3 for r in report.records)


def test_dp_ranks_of_an_added_worker_are_routed() -> None:
    """Two ranks a worker: the worker added at 500 (no startup) gets requests on both ranks."""
    report = _agg([(500.0, {AGG: 2})], workers=1, startup_s=0.0, dp_size=2)
    ranks = {(r.worker, r.dp_rank) for r in report.records if r.arrival_time_ms > 500.0}
    assert ranks == {(0, 0), (0, 1), (1, 0), (1, 1)}


def _disagg(steps: Sequence[tuple[float, Mapping[Stage, int]]]) -> Report:
    engine = {"block_size": 16, "timing_model": FIXED, "startup_time": 0.5}
    return run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=100, output_tokens=200, request_count=30, arrival_interval_ms=50
            ),
            prefill_engine=parse_engine_args(engine, role=Role.PREFILL),
            decode_engine=parse_engine_args(engine, role=Role.DECODE),
            num_prefill_workers=1,
            num_decode_workers=2,
        ),
        scaling=Schedule(steps),
    )


def test_disaggregated_pools_scale_separately() -> None:
    """Prefill up to 2 at 300 ms (ready at 800), decode down to 1 at 400: decode worker 1
    drains its requests (each decodes 200 tokens) and is removed when its last one ends;
    destinations after 400 are reserved on decode worker 0 only."""
    report = _disagg([(300.0, {PREFILL: 2}), (400.0, {DECODE: 1})])
    sections = report.sections["lifecycle_transitions"]
    prefill = [(t["at_ms"], t["worker_id"], t["state"]) for t in sections if t["pool"] == "prefill"]
    assert prefill == [(300.0, 1, "starting"), (800.0, 1, "active")]
    decode = [(t["at_ms"], t["worker_id"], t["state"]) for t in sections if t["pool"] == "decode"]
    assert decode[0] == (400.0, 1, "draining")
    removed_at = decode[1][0]
    assert decode[1][1:] == (1, "removed")
    last_on_1 = max(r.terminal_time_ms or 0.0 for r in report.records if r.worker == 1)
    assert removed_at == last_on_1 > 400.0
    for r in report.records:
        assert r.worker == 0 or (r.destination_reserved_ms or 0.0) <= 400.0
        assert r.prefill_worker == 0 or (r.prefill_admit_ms or 0.0) >= 800.0
    assert any(r.prefill_worker == 1 for r in report.records)
    assert report.summary["completed_requests"] == 30


def test_a_policy_that_never_ticks_changes_nothing() -> None:
    """An empty schedule: the same summary and records as the run without a policy."""
    config = RunConfig(
        synthetic=SyntheticWorkload(
            input_tokens=100, output_tokens=20, request_count=10, arrival_interval_ms=100
        ),
        num_workers=2,
        engine=parse_engine_args({"block_size": 16}),
    )
    plain, scripted = run(config), run(config, scaling=Schedule([]))
    assert scripted.sections["lifecycle_transitions"] == []
    skip = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    assert {k: v for k, v in plain.summary.items() if k not in skip} == {
        k: v for k, v in scripted.summary.items() if k not in skip
    }
    assert [request_row(r) for r in plain.records] == [request_row(r) for r in scripted.records]


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 390).map(lambda t: t * 10.0), st.integers(1, 5)),
        max_size=6,
        unique_by=lambda step: step[0],
    ),
    workers=st.integers(1, 3),
    startup_s=st.sampled_from([0.0, 0.05, 0.5, 2.0]),
    router=st.sampled_from(["round_robin", "kv_router"]),
)
def test_gpu_hours_are_the_integral_of_worker_counts(
    steps: list[tuple[float, int]], workers: int, startup_s: float, router: str
) -> None:
    """Random schedules: worker-seconds (and GPU-hours) equal the integral of the paid worker
    count (starting, active, draining) over the run; every request completes; none is routed to a
    worker that was not active when it arrived."""
    report = _agg(
        [(at, {AGG: target}) for at, target in steps],
        workers=workers,
        startup_s=startup_s,
        router=router,
    )
    transitions = report.sections["lifecycle_transitions"]
    seconds = report.summary["decode_worker_seconds"]
    expected = paid_worker_seconds(transitions, workers, report.summary["duration_ms"])
    assert math.isclose(seconds, expected, rel_tol=1e-9)
    assert math.isclose(report.summary["gpu_hours"], seconds / 3600.0, rel_tol=1e-12)
    assert report.summary["completed_requests"] == 40
    for r in report.records:
        assert state_at(transitions, r.worker, r.arrival_time_ms, workers) == "active"
