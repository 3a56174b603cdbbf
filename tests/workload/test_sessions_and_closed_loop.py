"""Arrival semantics against the reference's per-request records (Dynamo 1.6.1).

Each expectation below was read from the reference's per-request output for
the same trace and cluster (one worker, block size 64, trace block size 512):
(session, turn, arrival, first token, last token, reused input tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from servesim.config import EngineConfig
from servesim.simulation import RunConfig, SyntheticWorkload, run

SESSIONS_TRACE = """\
{"session_id":"s1","timestamp":1000,"input_length":1000,"output_length":5,"hash_ids":[1,2]}
{"session_id":"s2","timestamp":1020,"input_length":600,"output_length":3,"hash_ids":[50,51]}
{"session_id":"s1","delay":50,"input_length":1500,"output_length":4,"hash_ids":[1,2,3]}
{"session_id":"s1","timestamp":1400,"input_length":2000,"output_length":3,"hash_ids":[1,2,3,4]}
{"session_id":"s2","delay":0,"input_length":1100,"output_length":2,"hash_ids":[50,51,52]}
"""

OPEN_LOOP = [
    ("s1", 0, 0.0, 32.105859, 105.670385, 0),
    ("s2", 0, 20.0, 63.660439, 75.305556, 0),
    ("s2", 1, 75.305556, 105.670385, 111.467067, 576),
    ("s1", 1, 155.670385, 180.493626, 197.945563, 960),
    ("s1", 2, 597.945563, 622.581207, 634.267206, 1472),
]
SPEEDUP_2 = [
    ("s1", 0, 0.0, 32.105859, 105.670385, 0),
    ("s2", 0, 10.0, 63.660439, 75.305556, 0),
    ("s2", 1, 75.305556, 105.670385, 111.467067, 576),
    ("s1", 1, 130.670385, 155.493626, 172.945563, 960),
    ("s1", 2, 372.945563, 397.581207, 409.267206, 1472),
]
ONE_SESSION_AT_A_TIME = [
    ("s1", 0, 0.0, 32.105859, 55.272311, 0),
    ("s1", 1, 105.272311, 130.095552, 147.547489, 960),
    ("s1", 2, 547.547489, 572.183133, 583.869132, 1472),
    ("s2", 0, 583.869132, 609.632176, 621.174123, 0),
    ("s2", 1, 621.174123, 645.747262, 651.543944, 576),
]


def observed(config: RunConfig) -> list[tuple[str | None, int | None, float, float, float, int]]:
    report = run(config)
    rows = []
    for r in sorted(report.records, key=lambda r: (r.arrival_time_ms, r.uid)):
        assert r.first_token_ms is not None and r.last_token_ms is not None
        rows.append(
            (
                r.session_id,
                r.turn_index,
                r.arrival_time_ms,
                r.first_token_ms,
                r.last_token_ms,
                r.reused_input_tokens,
            )
        )
    return rows


def assert_rows(
    got: Sequence[tuple[str | None, int | None, float, float, float, int]],
    want: Sequence[tuple[str | None, int | None, float, float, float, int]],
) -> None:
    assert [(g[0], g[1], g[5]) for g in got] == [(w[0], w[1], w[5]) for w in want]
    for g, w in zip(got, want, strict=True):
        assert g[2:5] == pytest.approx(w[2:5], abs=1e-6)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "sessions.jsonl"
    path.write_text(SESSIONS_TRACE)
    return path


@pytest.mark.parametrize(("speedup", "want"), [(1.0, OPEN_LOOP), (2.0, SPEEDUP_2)])
def test_later_turns_arrive_after_the_previous_turn_plus_its_delay(
    trace: Path, speedup: float, want: list[tuple[str, int, float, float, float, int]]
) -> None:
    """Turn k+1 arrives at turn k's completion plus its delay (explicit, or from timestamps); speed-up divides both."""
    config = RunConfig(
        trace=trace, arrival_speedup_ratio=speedup, engine=EngineConfig(block_size=64)
    )
    assert_rows(observed(config), want)


def test_closed_loop_holds_a_slot_for_a_whole_session(trace: Path) -> None:
    """With concurrency 1 a session keeps its slot through its turns and think times."""
    config = RunConfig(trace=trace, replay_concurrency=1, engine=EngineConfig(block_size=64))
    assert_rows(observed(config), ONE_SESSION_AT_A_TIME)


def test_closed_loop_refills_at_completion_and_round_robins_in_dispatch_order() -> None:
    """A freed slot is refilled at the completion instant; placements alternate workers in dispatch order."""
    config = RunConfig(
        synthetic=SyntheticWorkload(input_tokens=1000, output_tokens=10, request_count=7),
        replay_concurrency=3,
        num_workers=2,
        engine=EngineConfig(block_size=64),
    )
    report = run(config)
    got = [(r.arrival_time_ms, r.first_token_ms, r.last_token_ms, r.worker) for r in report.records]
    want = [
        (0.0, 48.552296, 101.143224, 0),
        (0.0, 32.105859, 84.231535, 1),
        (0.0, 48.552296, 101.143224, 0),
        (84.231535, 116.337394, 200.98228, 1),
        (101.143224, 133.249083, 185.374759, 0),
        (101.143224, 154.234789, 206.774228, 1),
        (185.374759, 217.480618, 269.606294, 0),
    ]
    assert [g[3] for g in got] == [w[3] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g[:3] == pytest.approx(w[:3], abs=1e-6)
