"""A decode rank keeps the prompts it receives unnamed while its KV suffices.

What a decode rank keeps cached shows only when its KV runs short (see
:mod:`servesim.engine.vllm`): until then, keeping each received prompt as its
request's own blocks (no hashes, no prefix look-ups) changes no record, and
the first shortage raises :class:`NamedPromptsNeeded`, after which the
replay runs again with the prompts named.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from servesim import RunConfig, parse_engine_args, run, simulation
from servesim.config import EngineConfig, Role
from servesim.engine.vllm import NamedPromptsNeeded, VllmScheduler
from servesim.errors import SimulationError
from servesim.metrics.collector import RequestRecord
from servesim.simulation import Report
from servesim.workload.request import Session
from servesim.workload.sharing import mark_shared_blocks
from tests.support import HANDOFF_TIMELINE, replay_disaggregated, sessions_of_ids

TRACE = Path(__file__).parent.parent / "data" / "mooncake_conversation_head1500.jsonl"
FIELDS = (*HANDOFF_TIMELINE, "second_token_ms", "output_length", "terminal_status", "worker")


def simulated(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without the host's wall time and the speeds derived from it."""
    return {
        key: value
        for key, value in summary.items()
        if key != "wall_time_ms" and not key.startswith("processed_")
    }


def facts(records: list[RequestRecord]) -> list[tuple[Any, ...]]:
    return [
        tuple(getattr(r, name) for name in FIELDS) for r in sorted(records, key=lambda r: r.uid)
    ]


# ----- the rule, over random workloads -----


def sessions_of(reqs: list[tuple[list[int], int, float]]) -> list[Session]:
    sessions = sessions_of_ids(reqs)
    mark_shared_blocks(sessions, 4)
    return sessions


def engines(
    blocks: int, seqs: int | None, preemption: str, budget: int
) -> tuple[EngineConfig, EngineConfig]:
    common: dict[str, Any] = {
        "block_size": 4,
        "num_gpu_blocks": blocks,
        "max_num_batched_tokens": budget,
    }
    return (
        EngineConfig(worker_type=Role.PREFILL, **common),
        EngineConfig(
            worker_type=Role.DECODE, max_num_seqs=seqs, preemption_mode=preemption, **common
        ),
    )


@settings(max_examples=200, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=6),  # hash ids: shared prefixes
            st.integers(1, 40),  # output tokens
            st.floats(0, 200, allow_nan=False),  # arrival
        ),
        min_size=1,
        max_size=16,
    ),
    blocks=st.integers(14, 80),  # from a decode pool that runs short to one that never does
    seqs=st.one_of(st.none(), st.integers(1, 4)),
    preemption=st.sampled_from(["lifo", "fifo"]),
    budget=st.sampled_from([2, 3, 8, 32]),  # (a small one leaves requests without tokens)
    decode_workers=st.integers(1, 2),
    fast_forward=st.booleans(),
)
def test_unnamed_prompts_give_the_named_records_or_ask_for_names(
    reqs: list[tuple[list[int], int, float]],
    blocks: int,
    seqs: int | None,
    preemption: str,
    budget: int,
    decode_workers: int,
    fast_forward: bool,
) -> None:
    prefill, decode = engines(blocks, seqs, preemption, budget)

    def outcome(anonymous: bool) -> tuple[list[tuple[Any, ...]], dict[str, float]] | str:
        """The records and the token gaps' statistics (batched as the passes came), or
        how the replay stopped at a dead end."""
        try:
            collector, _, _ = replay_disaggregated(
                sessions_of(reqs),
                prefill,
                decode,
                prefill_workers=1,
                decode_workers=decode_workers,
                fast_forward=fast_forward,
                anonymous_prompts=anonymous,
            )
        except SimulationError as exc:
            return str(exc)
        return facts(collector.records), collector.itl.describe()

    named = outcome(False)
    try:
        unnamed = outcome(True)
    except NamedPromptsNeeded:
        event("the decode KV ran short: names needed")
        return
    event("unnamed throughout")
    assert unnamed == named


# ----- a replay, end to end -----


def replay(tmp_path: Path, decode_blocks: int, rows: int = 120) -> Report:
    trace = tmp_path / "head.jsonl"
    with TRACE.open(encoding="utf-8") as source:
        trace.write_text("".join(itertools.islice(source, rows)), encoding="utf-8")
    return run(
        RunConfig(
            trace=trace,
            trace_block_size=512,
            prefill_engine=parse_engine_args({"block_size": 64}, role=Role.PREFILL),
            decode_engine=parse_engine_args(
                {"block_size": 64, "num_gpu_blocks": decode_blocks}, role=Role.DECODE
            ),
            num_prefill_workers=2,
            num_decode_workers=2,
        )
    )


def watch(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], Counter[str]]:
    """Record each replay's ``anonymous_prompts``, and the decode reservations that reused
    a resident prefix (and those that did not)."""
    attempts: list[bool] = []
    reservations: Counter[str] = Counter()
    replay_with, reserve = simulation._replay_with, VllmScheduler.reserve_prompt

    def recorded_replay(*args: Any, **kwargs: Any) -> Report:
        attempts.append(kwargs.get("anonymous_prompts", False))
        return replay_with(*args, **kwargs)

    def recorded_reserve(self: VllmScheduler, request: Any) -> tuple[int, int] | None:
        reserved = reserve(self, request)
        if reserved is not None:
            reservations["reused" if reserved[0] else "fresh"] += 1
        return reserved

    monkeypatch.setattr(simulation, "_replay_with", recorded_replay)
    monkeypatch.setattr(VllmScheduler, "reserve_prompt", recorded_reserve)
    return attempts, reservations


def named_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulation, "_decode_cache_unread", lambda config, scaling: False)


def test_while_the_decode_kv_suffices_one_replay_keeps_prompts_unnamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts, reservations = watch(monkeypatch)
    unnamed = replay(tmp_path, decode_blocks=16384)
    assert attempts == [True]
    assert reservations == {"fresh": 120}  # no look-up: every prompt block is fresh
    reservations.clear()
    named_only(monkeypatch)
    named = replay(tmp_path, decode_blocks=16384)
    # Named, most reservations reuse the trace's shared prefix left by an earlier request.
    assert reservations == {"reused": 118, "fresh": 2}
    assert facts(unnamed.records) == facts(named.records)
    assert simulated(unnamed.summary) == simulated(named.summary)


def test_a_decode_rank_short_of_kv_has_the_replay_run_again_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts, _ = watch(monkeypatch)
    again = replay(tmp_path, decode_blocks=900)
    assert attempts == [True, False]
    named_only(monkeypatch)
    named = replay(tmp_path, decode_blocks=900)
    assert facts(again.records) == facts(named.records)
