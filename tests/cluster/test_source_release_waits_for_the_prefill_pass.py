"""ReleaseSource waits for the prefill rank's pass in flight, as in the reference (Dynamo 1.6.1).

One prefill and one decode worker, block size 64, 10 GB/s and 131,072 bytes
per token (independent transfers, as the reference prices them). Request A
(200 tokens) is prefilled by 19.554948 ms; its 2.62 ms transfer activates it
on the idle decode worker at 22.176388 ms. By then the prefill worker is
prefilling B (4,000 tokens, arrived at 20 ms) until 103.971162 ms, so A's
source KV is released only at that pass end. B's own release follows its
activation at once (the prefill worker is idle by then). Every number is the
reference's (``refcheck.py reference``).

A pass that ends at the instant of the release does not hold it back: the
reference ends every pass due at an instant before it runs that instant's
handoff actions, and starts the next passes after them. The second case
(fixed timing: prefill 5 ms, decode 0.5 ms a pass) has B's prefill end at
10.5 ms while the decode worker, fast-forwarding A's decode, also ends a
pass then: B's source is released at 10.5 ms, before the prefill worker
starts C's pass (10.5 to 15.5 ms).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import Role, RunConfig, parse_engine_args, run
from servesim.config import EngineConfig
from tests.support import HANDOFF_TIMELINE, write_trace

REFERENCE = [
    [19.554948, 19.554948, 22.176388, 22.176388, 103.971162, 27.926689, 50.92840700000001],
    [
        103.971162,
        103.971162,
        156.39996200000002,
        156.39996200000002,
        156.39996200000002,
        162.34561900000003,
        186.12876200000002,
    ],
]


@pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])
def test_the_source_is_released_at_the_end_of_the_prefill_pass_in_flight(
    tmp_path: Path, exact_passes: bool
) -> None:
    """A's source is released at 103.971162 ms, the end of B's prefill, not at its activation."""
    trace = write_trace(
        tmp_path / "trace.jsonl", [(0, 200, 5, [1]), (20, 4000, 5, [2, 3, 4, 5, 6, 7, 8, 9])]
    )
    transfer = {"kv_transfer_bandwidth": 10.0, "kv_transfer_link_model": "independent"}
    report = run(
        RunConfig(
            trace=trace,
            prefill_engine=parse_engine_args(
                {"block_size": 64, "kv_transfer_bytes_per_token": 131072, **transfer},
                role=Role.PREFILL,
            ),
            decode_engine=parse_engine_args({"block_size": 64, **transfer}, role=Role.DECODE),
            exact_passes=exact_passes,
        )
    )
    records = sorted(report.records, key=lambda r: r.uid)
    for record, want in zip(records, REFERENCE, strict=True):
        assert [getattr(record, name) for name in HANDOFF_TIMELINE] == pytest.approx(want, abs=1e-9)


FIXED_TIMELINES = [
    [5.0, 5.0, 5.0, 5.0, 5.0, 5.5, 11.0],
    [10.5, 10.5, 10.5, 10.5, 10.5, 11.0, 11.0],
    [15.5, 15.5, 15.5, 15.5, 15.5, 16.0, 16.0],
]


@pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])
def test_a_decode_pass_ending_at_the_release_instant_does_not_defer_it(
    tmp_path: Path, exact_passes: bool
) -> None:
    """B's source is released at 10.5 ms, the end of its prefill, not at C's prefill end (15.5)."""
    trace = write_trace(
        tmp_path / "trace.jsonl", [(0, 5, 12, [1]), (5.5, 8, 1, [2]), (6, 5, 1, [3])]
    )

    def engine(prefill_ms: float, decode_ms: float, role: Role) -> EngineConfig:
        timing = {"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms}
        return parse_engine_args({"block_size": 4, "timing_model": timing}, role=role)

    report = run(
        RunConfig(
            trace=trace,
            trace_block_size=8,
            prefill_engine=engine(5.0, 1.0, Role.PREFILL),
            decode_engine=engine(1.0, 0.5, Role.DECODE),
            exact_passes=exact_passes,
        )
    )
    records = sorted(report.records, key=lambda r: r.uid)
    for record, want in zip(records, FIXED_TIMELINES, strict=True):
        assert [getattr(record, name) for name in HANDOFF_TIMELINE] == pytest.approx(want, abs=1e-9)
