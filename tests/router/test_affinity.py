"""Session affinity modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.config import EngineConfig
from servesim.router.affinity import SessionAffinity
from servesim.simulation import RunConfig, run


def test_local_binds_a_session_to_its_first_target() -> None:
    """The first turn lets the router choose; later turns follow it."""
    affinity = SessionAffinity("local", 4)
    assert affinity.preferred("s") is None
    affinity.placed("s", 2)
    affinity.placed("s", 3)  # later placements do not move the binding
    assert affinity.preferred("s") == 2
    assert affinity.preferred("other") is None


@pytest.mark.parametrize("mode", ["modulo", "hrw"])
def test_hashed_modes_are_stable_and_spread(mode: str) -> None:
    """modulo and hrw give a session the same target every time, and spread sessions out."""
    affinity = SessionAffinity(mode, 4)
    targets = [affinity.preferred(f"session-{i}") for i in range(64)]
    assert targets == [SessionAffinity(mode, 4).preferred(f"session-{i}") for i in range(64)]
    assert set(targets) == {0, 1, 2, 3}


def test_hrw_moves_few_sessions_when_a_target_is_added() -> None:
    """Rendezvous hashing: adding a fifth target moves only the sessions it wins."""
    before = SessionAffinity("hrw", 4)
    after = SessionAffinity("hrw", 5)
    moved = [i for i in range(200) if before.preferred(f"s{i}") != after.preferred(f"s{i}")]
    assert all(after.preferred(f"s{i}") == 4 for i in moved)
    assert 10 < len(moved) < 80


def test_disabled_and_sessionless_requests_have_no_preference() -> None:
    """No mode, or no session, leaves the choice to the router."""
    assert SessionAffinity("disabled", 4).preferred("s") is None
    assert SessionAffinity("modulo", 4).preferred(None) is None


@pytest.mark.parametrize("mode", ["local", "modulo", "hrw"])
def test_a_replayed_session_stays_on_one_worker(mode: str, tmp_path: Path) -> None:
    """End to end: every turn of a multi-turn session is routed to the same worker."""
    rows = [
        {
            "session_id": f"s{s}",
            "timestamp": 10 * s,
            "input_length": 600,
            "output_length": 3,
            "hash_ids": [s, 100 + s],
        }
        for s in range(6)
    ]
    rows += [
        {
            "session_id": f"s{s}",
            "delay": 5,
            "input_length": 1100,
            "output_length": 2,
            "hash_ids": [s, 100 + s, 200 + s],
        }
        for s in range(6)
    ]
    trace = tmp_path / "sessions.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = run(RunConfig(trace=trace, num_workers=4, router_mode="kv_router", session_affinity=mode,
                           engine=EngineConfig(block_size=64)))  # fmt: skip
    workers: dict[str | None, set[int | None]] = {}
    for record in report.records:
        workers.setdefault(record.session_id, set()).add(record.worker)
    assert len(workers) == 6
    assert all(len(placed) == 1 for placed in workers.values())
