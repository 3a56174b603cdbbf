"""Streaming a one-turn Mooncake trace replays exactly as reading it whole does.

The stream (``servesim.workload.stream``) gives up the sharing look-ahead,
interning and unbounded hash caches, and the compact collector keeps only
the summary's facts of ended requests; none of that may change a result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesim.config import Role, parse_engine_args
from servesim.simulation import RunConfig, run
from servesim.workload.mooncake import STDIN
from servesim.workload.stream import stream_plan

SOURCE = Path(__file__).resolve().parents[1] / "data" / "mooncake_conversation_head1500.jsonl"
HOST = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
CASES: dict[str, dict[str, Any]] = {
    "round_robin": {"num_workers": 4},
    "kv_router": {"num_workers": 4, "router_mode": "kv_router"},
    "closed_loop": {"num_workers": 2, "replay_concurrency": 8},
    "disaggregated_kv": {
        "prefill_engine": parse_engine_args({}, role=Role.PREFILL),
        "decode_engine": parse_engine_args({}, role=Role.DECODE),
        "num_prefill_workers": 2,
        "num_decode_workers": 2,
        "router_mode": "kv_router",
    },
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 500 Mooncake conversation requests."""
    path = tmp_path_factory.mktemp("stream") / "head500.jsonl"
    path.write_text("".join(SOURCE.read_text().splitlines(keepends=True)[:500]))
    return path


def _summary(config: RunConfig) -> dict[str, Any]:
    return {k: v for k, v in run(config).summary.items() if k not in HOST}


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_replay_has_the_same_summary(case: str, trace: Path) -> None:
    """500 Mooncake requests: every summary value equal, streamed and compact or not."""
    whole = _summary(RunConfig(trace=trace, stream=False, **CASES[case]))
    streamed = run(RunConfig(trace=trace, stream=True, keep_records=False, **CASES[case]))
    assert streamed.records == []
    assert {k: v for k, v in streamed.summary.items() if k not in HOST} == whole


def test_streamed_records_match_whole_file_records(trace: Path) -> None:
    """With records kept, a streamed replay's per-request records are the whole-file ones."""
    whole = run(RunConfig(trace=trace, stream=False, num_workers=4, router_mode="kv_router"))
    streamed = run(RunConfig(trace=trace, stream=True, num_workers=4, router_mode="kv_router"))
    fields = (
        "uid",
        "arrival_time_ms",
        "first_token_ms",
        "last_token_ms",
        "reused_input_tokens",
        "worker",
    )
    assert [[getattr(r, f) for f in fields] for r in streamed.records] == [
        [getattr(r, f) for f in fields] for r in whole.records
    ]


def test_time_limited_compact_run_counts_requests_in_flight(trace: Path) -> None:
    """Cut short, the requests still in flight are reported incomplete, as with records kept."""
    config = {"num_workers": 2, "max_sim_time_ms": 10_000.0}
    whole = _summary(RunConfig(trace=trace, stream=False, **config))  # type: ignore[arg-type]
    streamed = _summary(RunConfig(trace=trace, stream=True, keep_records=False, **config))  # type: ignore[arg-type]
    assert whole["incomplete_requests"] > 0
    assert streamed == whole


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_only_one_turn_time_ordered_traces_stream(tmp_path: Path) -> None:
    """Sessions, a timestamp that goes back (open loop) or stdin take the whole-file path."""
    row = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}
    plain = _write(tmp_path / "a.jsonl", [row, {**row, "timestamp": 5}])
    plan = stream_plan(plain, closed_loop=False)
    assert plan is not None and (plan.origin_ms, plan.rows) == (0.0, 2)
    back = _write(tmp_path / "b.jsonl", [{**row, "timestamp": 5}, row])
    assert stream_plan(back, closed_loop=False) is None
    assert stream_plan(back, closed_loop=True) is not None
    session = _write(tmp_path / "c.jsonl", [{**row, "session_id": "s"}])
    assert stream_plan(session, closed_loop=True) is None
    huge_id = _write(tmp_path / "d.jsonl", [{**row, "hash_ids": [1 << 40]}])
    assert stream_plan(huge_id, closed_loop=False) is None
    assert stream_plan(STDIN, closed_loop=False) is None


def test_bad_row_met_while_streaming_is_reported(tmp_path: Path) -> None:
    """A row the first pass let through (it checks shape only) fails with its line."""
    row = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}
    trace = _write(tmp_path / "t.jsonl", [row, {**row, "timestamp": 1, "output_length": -3}])
    from servesim.errors import TraceError

    with pytest.raises(TraceError, match=r"t.jsonl:2: 'output_length' must be a non-negative"):
        run(RunConfig(trace=trace, stream=True, trace_block_size=4))
