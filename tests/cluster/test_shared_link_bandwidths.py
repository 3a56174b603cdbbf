"""Shared KV links with unequal prefill and decode bandwidths (servesim's ``"shared"`` model).

The reference prices every transfer alone at the source's bandwidth (see
``test_transfer_pricing.py``). servesim's default link model shares the
bandwidth max-min fairly: each prefill rank sends at most 1 unit of work per
ms and each decode rank receives at most ``decode bandwidth / prefill
bandwidth`` (a job's work is its standalone delay at the prefill bandwidth).

The same run as ``test_transfer_pricing.py``: one prefill and one decode
worker, block size 64, 131,072 bytes per token; two 1,000-token requests are
prefilled together and held at 48.552296 ms (the reference's time), a
1,500-token one at 540.223828 ms.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import Report, Role, RunConfig, parse_engine_args, run
from tests.support import write_trace

ROWS = [(0, 1000, 10, [1, 2]), (0, 1000, 10, [3, 4]), (500, 1500, 4, [5, 6, 7])]
HELD = [48.552296, 48.552296, 540.223828]


def standalone_ms(tokens: int, gb_s: float) -> float:
    """A transfer alone on the link at ``gb_s``: tokens x 131,072 B / bandwidth, in ms."""
    return tokens * 131_072 / (gb_s * 1e6)


def replay(tmp_path: Path, prefill_gb_s: float, decode_gb_s: float) -> Report:
    raw = {"block_size": 64, "kv_transfer_bytes_per_token": 131_072}
    return run(
        RunConfig(
            trace=write_trace(tmp_path / "trace.jsonl", ROWS),
            prefill_engine=parse_engine_args(
                {**raw, "kv_transfer_bandwidth": prefill_gb_s}, role=Role.PREFILL
            ),
            decode_engine=parse_engine_args(
                {**raw, "kv_transfer_bandwidth": decode_gb_s}, role=Role.DECODE
            ),
        )
    )


def activations(report: Report) -> list[float | None]:
    records = sorted(report.records, key=lambda r: (r.arrival_time_ms, r.uid))
    assert [r.source_held_ms for r in records] == [pytest.approx(t, abs=1e-6) for t in HELD]
    return [r.destination_activated_ms for r in records]


def test_a_slower_destination_bounds_a_shared_transfer(tmp_path: Path) -> None:
    """Decode at 5 GB/s receives half as fast as prefill (10 GB/s) sends.

    Alone, the 1,500-token transfer runs at rate 0.5: twice its standalone
    time. The two 1,000-token transfers share that receiving link: 0.25 each,
    four times their standalone time.
    """
    report = replay(tmp_path, prefill_gb_s=10, decode_gb_s=5)
    expected = [
        HELD[0] + 4 * standalone_ms(1000, 10),
        HELD[1] + 4 * standalone_ms(1000, 10),
        HELD[2] + 2 * standalone_ms(1500, 10),
    ]
    assert activations(report) == [pytest.approx(t, abs=1e-9) for t in expected]


def test_a_faster_destination_leaves_the_sending_link_the_bottleneck(tmp_path: Path) -> None:
    """Decode at 10 GB/s, prefill at 5: the prefill rank's sending link bounds every transfer.

    Alone, a transfer takes its standalone time at 5 GB/s; the two
    simultaneous ones split the sending link, twice their standalone time.
    """
    report = replay(tmp_path, prefill_gb_s=5, decode_gb_s=10)
    expected = [
        HELD[0] + 2 * standalone_ms(1000, 5),
        HELD[1] + 2 * standalone_ms(1000, 5),
        HELD[2] + standalone_ms(1500, 5),
    ]
    assert activations(report) == [pytest.approx(t, abs=1e-9) for t in expected]
