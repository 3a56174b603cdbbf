"""A stuck decode rank waits for what could rescue it, and passes its head only at a dead end.

The trace (differential seed ``disaggregated`` 279, shrunk) runs a closed loop
of six on one prefill worker and one decode worker of 23 two-token blocks,
chunked prefill off. At 19.957194 ms the decode rank preempts request 0, which
can then never fit beside the prebuilt requests 1, 2 and 3 whose KV lands by
20.316569 ms: nothing runs, nothing is in transfer, the FIFO head waits.

- With request 4 in the trace, its destination reservation reaches the rank
  at 25.0 ms (its prefill's end). A queued reservation lets prebuilt requests
  pass the head, and the rank admits 1, 2 and 3 together then, as the
  reference does (the stored scenario ``disagg_stuck_rank_waits`` holds the
  reference's numbers).
- Without it nothing ever reaches the rank: the reference stops ("an
  effect-free zero-duration pass with 4 in-flight requests"). servesim lets
  the rank pass its head at that dead end, at the instant it is reached: the
  first prebuilt request, 1, is admitted at 20.316569 ms, and the others with
  request 0 once 1 finishes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.config import Role, parse_engine_args
from servesim.metrics.collector import RequestRecord
from servesim.simulation import RunConfig, run
from tests.scenarios.harness import load_scenario, with_absolute_paths, write_trace

SCENARIO = with_absolute_paths(load_scenario("disagg_stuck_rank_waits").spec)


def replay(tmp_path: Path, requests: int, *, exact_passes: bool) -> list[RequestRecord]:
    """The scenario on the trace's first ``requests`` requests; records in arrival order."""
    overrides = SCENARIO["servesim_engine_overrides"]
    report = run(
        RunConfig(
            trace=write_trace({**SCENARIO, "max_requests": requests}, tmp_path),
            trace_block_size=SCENARIO["trace_block_size"],
            router_mode="round_robin",
            replay_concurrency=SCENARIO["replay_concurrency"],
            prefill_engine=parse_engine_args(
                {**SCENARIO["prefill_engine"], **overrides}, role=Role.PREFILL
            ),
            decode_engine=parse_engine_args(
                {**SCENARIO["decode_engine"], **overrides}, role=Role.DECODE
            ),
            num_prefill_workers=1,
            num_decode_workers=1,
            exact_passes=exact_passes,
        )
    )
    return sorted(report.records, key=lambda r: r.uid)


def assert_admissions(records: list[RequestRecord], expected: list[tuple[float, float]]) -> None:
    """Each request's decode admission and last token, to the nanosecond."""
    assert len(records) == len(expected)
    for record, (admit, last) in zip(records, expected, strict=True):
        got = (record.decode_admit_ms, record.last_token_ms)
        assert got == pytest.approx((admit, last), abs=1e-6), record.uid


modes = pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])


@modes
def test_a_stuck_rank_waits_for_the_reservation_that_lets_prebuilt_requests_pass(
    tmp_path: Path, exact_passes: bool
) -> None:
    records = replay(tmp_path, 5, exact_passes=exact_passes)
    assert records[2].destination_activated_ms == pytest.approx(20.316569, abs=1e-6)
    assert_admissions(
        records,
        [
            (5.015625, 67.888431),
            (25.0, 58.73552),
            (25.0, 58.73552),
            (25.0, 58.73552),
            (67.888431, 90.073119),
        ],
    )


@modes
def test_with_nothing_to_rescue_it_the_rank_passes_its_head_at_the_dead_end(
    tmp_path: Path, exact_passes: bool
) -> None:
    records = replay(tmp_path, 4, exact_passes=exact_passes)
    assert_admissions(
        records,
        [
            (5.015625, 72.547306),
            (20.316569, 43.973677),
            (43.973677, 72.547306),
            (43.973677, 72.547306),
        ],
    )
