"""KV transfer pricing in a disaggregated run: exact activation times, against the reference.

One prefill and one decode worker (block size 64), ``kv_transfer_bandwidth``
10 GB/s and ``kv_transfer_bytes_per_token`` 131,072 on both. A transfer of
``n`` prompt tokens takes ``n x 131,072 B / 10e9 B/s`` = 13.1072 ms for 1,000
tokens and 19.6608 ms for 1,500. Two 1,000-token requests arrive at 0 and are
prefilled together (48.552296 ms); a 1,500-token one arrives at 500 ms.

The reference (Dynamo 1.6.1) prices concurrent transfers independently
(``kv_transfer_link_model: "independent"``); servesim's default ``"shared"``
link splits the bandwidth max-min fairly, so the two simultaneous transfers
take twice as long each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servesim import Report, Role, RunConfig, parse_engine_args, run
from tests.support import write_trace

ROWS = [(0, 1000, 10, [1, 2]), (0, 1000, 10, [3, 4]), (500, 1500, 4, [5, 6, 7])]
BYTES_PER_TOKEN = 131_072
BANDWIDTH_GB_S = 10


def transfer_ms(tokens: int) -> float:
    """tokens x bytes per token / bandwidth, in ms."""
    return tokens * BYTES_PER_TOKEN / (BANDWIDTH_GB_S * 1e9) * 1000


# The reference's handoff timeline per request, in ms:
# (source held = destination reserved, activated = decode admitted = source released,
#  first token, last token).
REFERENCE = [
    (48.552296, 61.659496, 67.50241799999999, 120.09334599999998),
    (48.552296, 61.659496, 67.50241799999999, 120.09334599999998),
    (540.223828, 559.884628, 565.7018370000001, 583.1537740000001),
]


def replay(
    tmp_path: Path,
    link_model: str,
    prefill_gb_s: float = BANDWIDTH_GB_S,
    decode_gb_s: float = BANDWIDTH_GB_S,
) -> Report:
    trace = write_trace(tmp_path / "trace.jsonl", ROWS)
    raw: dict[str, Any] = {
        "block_size": 64,
        "kv_transfer_bytes_per_token": BYTES_PER_TOKEN,
        "kv_transfer_link_model": link_model,
    }
    return run(
        RunConfig(
            trace=trace,
            prefill_engine=parse_engine_args(
                {**raw, "kv_transfer_bandwidth": prefill_gb_s}, role=Role.PREFILL
            ),
            decode_engine=parse_engine_args(
                {**raw, "kv_transfer_bandwidth": decode_gb_s}, role=Role.DECODE
            ),
        )
    )


def activations(report: Report) -> list[float | None]:
    return [
        r.destination_activated_ms
        for r in sorted(report.records, key=lambda r: (r.arrival_time_ms, r.uid))
    ]


def test_transfer_times_by_hand() -> None:
    assert transfer_ms(1000) == pytest.approx(13.1072, rel=1e-15)
    assert transfer_ms(1500) == pytest.approx(19.6608, rel=1e-15)


def test_independent_transfers_match_the_reference_timeline(tmp_path: Path) -> None:
    """Each transfer takes its own standalone time, however many share the link."""
    records = sorted(
        replay(tmp_path, "independent").records, key=lambda r: (r.arrival_time_ms, r.uid)
    )
    for record, (held, activated, first, last) in zip(records, REFERENCE, strict=True):
        assert record.source_held_ms == pytest.approx(held, abs=1e-6)
        assert record.destination_reserved_ms == pytest.approx(held, abs=1e-6)
        assert record.destination_activated_ms == pytest.approx(activated, abs=1e-6)
        assert record.decode_admit_ms == pytest.approx(activated, abs=1e-6)
        assert record.source_released_ms == pytest.approx(activated, abs=1e-6)
        assert record.first_token_ms == pytest.approx(first, abs=1e-6)
        assert record.last_token_ms == pytest.approx(last, abs=1e-6)


def test_independent_transfer_time_is_bytes_over_bandwidth(tmp_path: Path) -> None:
    """Activation - reservation is exactly the standalone transfer time of the whole prompt."""
    records = sorted(
        replay(tmp_path, "independent").records, key=lambda r: (r.arrival_time_ms, r.uid)
    )
    for record in records:
        assert record.destination_activated_ms is not None
        assert record.destination_reserved_ms is not None
        took = record.destination_activated_ms - record.destination_reserved_ms
        assert took == pytest.approx(transfer_ms(record.input_length), rel=1e-12)


def test_shared_link_splits_the_bandwidth_between_simultaneous_transfers(tmp_path: Path) -> None:
    """Servesim's default: the two 1,000-token transfers share one link, each at half rate,
    so both end after 2 x 13.1072 ms; the later request has the link to itself."""
    records = sorted(replay(tmp_path, "shared").records, key=lambda r: (r.arrival_time_ms, r.uid))
    expected = [
        48.552296 + 2 * transfer_ms(1000),
        48.552296 + 2 * transfer_ms(1000),
        540.223828 + transfer_ms(1500),
    ]
    activated = [r.destination_activated_ms for r in records]
    assert activated == [pytest.approx(t, abs=1e-9) for t in expected]
    assert [r.source_held_ms for r in records] == [
        pytest.approx(held, abs=1e-6) for held, *_ in REFERENCE
    ]


# Unequal bandwidths: the reference prices a transfer at the source (prefill) bandwidth only.
# Prefill 5 GB/s, decode 10: twice the time (26.2144 and 39.3216 ms).
REFERENCE_SLOW_SOURCE = [74.766696, 74.766696, 579.545428]
# Prefill 10 GB/s, decode 5: the same times as at 10 GB/s on both sides.
REFERENCE_SLOW_DESTINATION = [61.659496, 61.659496, 559.884628]


def test_independent_transfers_are_priced_at_the_source_bandwidth(tmp_path: Path) -> None:
    report = replay(tmp_path, "independent", prefill_gb_s=5, decode_gb_s=10)
    assert activations(report) == [pytest.approx(t, abs=1e-6) for t in REFERENCE_SLOW_SOURCE]


def test_a_slower_destination_does_not_slow_an_independent_transfer(tmp_path: Path) -> None:
    """The reference prices a transfer at the prefill side's bandwidth alone (10 GB/s here)."""
    report = replay(tmp_path, "independent", prefill_gb_s=10, decode_gb_s=5)
    assert activations(report) == [pytest.approx(t, abs=1e-6) for t in REFERENCE_SLOW_DESTINATION]
