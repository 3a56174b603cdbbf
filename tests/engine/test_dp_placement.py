"""Round robin over DP ranks, and the group pass of a worker's ranks, against the reference.

Two aggregated workers with ``dp_size`` 2; eight 500-token requests (three
output tokens) arriving 1 ms apart. The reference (Dynamo 1.6.1) places them
rank-major: worker 0 rank 0, worker 1 rank 0, worker 0 rank 1, worker 1 rank 1,
then again (scheduler ids 0, 2, 1, 3 with id = worker x dp_size + rank). A
rank's pass waits for its worker's group pass: request 2 reaches worker 0 rank
1 at 2 ms but is admitted only when rank 0's first pass ends, at 24.198 ms.
"""

from __future__ import annotations

import pytest

from servesim import EngineConfig, Report, RunConfig, run
from servesim.metrics.report import request_row
from tests.support import write_trace

ROWS = [(i, 500, 3, [100 + i]) for i in range(8)]

# Per request, from the reference's records: (worker, dp rank, first admission,
# first token, last token), in ms.
REFERENCE = [
    (0, 0, 0.0, 24.19839, 62.095888),
    (1, 0, 1.0, 25.19839, 63.095888),
    (0, 1, 24.19839, 56.304249, 67.887578),
    (1, 1, 25.19839, 57.304249, 68.887578),
    (0, 0, 24.19839, 56.304249, 67.887578),
    (1, 0, 25.19839, 57.304249, 68.887578),
    (0, 1, 24.19839, 56.304249, 67.887578),
    (1, 1, 25.19839, 57.304249, 68.887578),
]
# The reference's per-request ``decode_worker_idx`` is the scheduler id, worker x dp_size + rank.
REFERENCE_SCHEDULER_IDS = [0, 2, 1, 3, 0, 2, 1, 3]
REFERENCE_SUMMARY = {
    "duration_ms": 68.887578,
    "decode_gpus_per_worker": 2,  # dp_size x tensor parallel size
    "decode_worker_seconds": 0.137775156,  # two workers for the whole run
    "gpu_hours": 7.654175333333333e-05,
}


@pytest.fixture(scope="module", params=[False, True], ids=["fast_forward", "exact_passes"])
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Report:
    trace = write_trace(tmp_path_factory.mktemp("dp") / "trace.jsonl", ROWS)
    exact = request.param
    assert isinstance(exact, bool)
    return run(
        RunConfig(
            trace=trace,
            num_workers=2,
            engine=EngineConfig(block_size=64, dp_size=2),
            exact_passes=exact,
        )
    )


def test_placements_walk_the_ranks_rank_major(report: Report) -> None:
    records = sorted(report.records, key=lambda r: r.arrival_time_ms)
    assert [(r.worker, r.dp_rank) for r in records] == [(w, k) for w, k, *_ in REFERENCE]


def test_timings_follow_each_workers_group_pass(report: Report) -> None:
    """A request on a worker's second rank waits for the worker's pass in flight to end."""
    records = sorted(report.records, key=lambda r: r.arrival_time_ms)
    for record, (_, _, admit, first, last) in zip(records, REFERENCE, strict=True):
        assert record.first_admit_ms == pytest.approx(admit, abs=1e-6)
        assert record.first_token_ms == pytest.approx(first, abs=1e-6)
        assert record.last_token_ms == pytest.approx(last, abs=1e-6)


@pytest.mark.parametrize("key", REFERENCE_SUMMARY)
def test_cost_counts_every_rank_as_a_gpu(report: Report, key: str) -> None:
    assert report.summary[key] == pytest.approx(REFERENCE_SUMMARY[key], rel=1e-9)


def test_request_rows_name_the_scheduler_as_the_reference_does(report: Report) -> None:
    records = sorted(report.records, key=lambda r: r.arrival_time_ms)
    assert [request_row(r)["decode_worker_idx"] for r in records] == REFERENCE_SCHEDULER_IDS
