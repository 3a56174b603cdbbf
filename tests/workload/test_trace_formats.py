"""Each trace format's reader on the reference's own fixture, replayed end to end.

The fixtures (``tests/data/replay_formats/``) are those Dynamo 1.6.1 ships;
the times are what the reference reports for them with its default engine
(probed once, 1-3 requests each): servesim must give the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.config import Role, parse_engine_args
from servesim.metrics.collector import RequestRecord, Terminal
from servesim.simulation import RunConfig, run
from servesim.workload.formats import TraceOptions, read_trace
from servesim.workload.request import RunPrompt, TracePrompt

DATA = Path(__file__).resolve().parents[1] / "data" / "replay_formats"


def _replay(trace: str, **config: object) -> list[RequestRecord]:
    report = run(RunConfig(trace=DATA / trace, **config))  # type: ignore[arg-type]
    assert all(r.terminal_status is Terminal.COMPLETED for r in report.records)
    return sorted(report.records, key=lambda r: (r.arrival_time_ms, r.uid))


def test_mooncake_delta_turn_appends_previous_output_and_its_segment() -> None:
    """Turn 2 = 16 prompt + 4 generated + 8 new tokens; it arrives its delay (5 ms, not the
    timestamp gap) after turn 1 completes."""
    first, second = _replay("mooncake-delta.jsonl", trace_format="mooncake-delta")
    assert (first.input_length, second.input_length) == (16, 28)
    assert first.terminal_time_ms == pytest.approx(33.967245, abs=1e-6)
    assert second.arrival_time_ms == pytest.approx(33.967245 + 5.0, abs=1e-6)
    assert first.terminal_time_ms == pytest.approx(second.arrival_time_ms - 5.0, abs=1e-9)
    assert (second.session_id, second.turn_index) == ("delta-session", 1)


def test_mooncake_delta_prompt_holds_the_output_tokens_the_engine_generated() -> None:
    """The later prompt's blocks after the earlier prompt are the earlier turn's output
    tokens, the ones its sequence ends with."""
    sessions = read_trace(
        [DATA / "mooncake-delta.jsonl"],
        TraceOptions(trace_format="mooncake-delta", trace_block_size=512),
    )
    assert isinstance(sessions, list)
    first, second = sessions[0].turns
    assert isinstance(first.sequence, RunPrompt) and isinstance(second.prompt, RunPrompt)
    assert first.sequence.length == 20
    assert second.prompt.runs[:2] == first.sequence.runs
    assert second.prompt.block_hashes(4, 5) == first.sequence.block_hashes(4, 5)


def test_applied_compute_session_grows_by_response_and_tool_output() -> None:
    """Inputs 16, 28, 40; turn 2 arrives 10 ms and turn 3 20 ms (the tool latencies) after the
    turn before completes; the final turn emits the final response length."""
    records = _replay(
        "applied-compute-agentic.jsonl",
        trace_format="applied_compute_agentic",
        replay_concurrency=1,
    )
    assert [r.input_length for r in records] == [16, 28, 40]
    assert [r.requested_output_length for r in records] == [4, 4, 4]
    assert records[1].arrival_time_ms == pytest.approx(43.967245, abs=1e-6)
    assert records[2].arrival_time_ms == pytest.approx(98.118767, abs=1e-6)
    assert records[2].arrival_time_ms == pytest.approx(records[1].terminal_time_ms + 20.0, abs=1e-9)  # type: ignore[operator]


def test_applied_compute_shares_group_prefixes_across_lines() -> None:
    """With ratio 0.5 and 2 groups, line 0 (31 trace blocks, so 16 of the group's) and line 2
    (22 blocks: 11) share their first 11 blocks; lines 0 and 1 share nothing."""
    path = DATA / "applied_compute_agentic_16.jsonl"
    sessions = read_trace(
        [path],
        TraceOptions(
            trace_format="applied_compute_agentic",
            trace_block_size=64,
            shared_prefix_ratio=0.5,
            num_prefix_groups=2,
            closed_loop=True,
        ),
    )
    assert isinstance(sessions, list)
    runs = [s.turns[0].prompt.runs for s in sessions[:3]]  # type: ignore[attr-defined]
    assert (len(runs[0]), len(runs[2])) == (31, 22)
    assert runs[0][:11] == runs[2][:11]
    assert runs[0][11] != runs[2][11]
    assert not set(runs[0]) & set(runs[1])


def test_agentic_mooncake_dispatch_spawn_and_join() -> None:
    """The child starts 5 ms after the root is dispatched; the join 1 ms after the later of the
    root's and the child's completions."""
    root, child, join = _replay(
        "agentic-mooncake.jsonl", trace_format="agentic_mooncake", execution_model="tiny-model"
    )
    assert [r.request_id for r in (root, child, join)] == [
        "agent-root",
        "agent-child",
        "agent-join",
    ]
    assert child.arrival_time_ms == 5.0
    assert root.terminal_time_ms == pytest.approx(38.864578, abs=1e-6)
    assert child.terminal_time_ms == pytest.approx(44.604836, abs=1e-6)
    assert join.arrival_time_ms == pytest.approx(child.terminal_time_ms + 1.0, abs=1e-9)  # type: ignore[operator]
    assert {r.play_id for r in (root, child, join)} == {"agent-play"}


def test_agentic_report_has_trajectory_keys() -> None:
    """One play, completed; its trajectory latency is its last request's end (it starts at 0)."""
    report = run(
        RunConfig(
            trace=DATA / "agentic-mooncake.jsonl",
            trace_format="agentic_mooncake",
            execution_model="tiny-model",
        )
    )
    s = report.summary
    assert (s["total_trajectories"], s["completed_trajectories"], s["incomplete_trajectories"]) == (
        1,
        0 + 1,
        0,
    )
    end = max(r.terminal_time_ms for r in report.records if r.terminal_time_ms is not None)
    assert s["mean_trajectory_e2e_latency_ms"] == s["p50_trajectory_e2e_latency_ms"] == end
    assert s["agentic_graph"]["node_count"] == 3
    assert s["agentic_graph"]["block_size"] == 4
    assert s["agentic_graph"]["source"] == {"digest": "agentic-v1", "format": "e2e-fixture"}
    assert s["agentic_model_projection"] == {
        "policy": "project_to_configured_target",
        "source_models": ["tiny-model"],
        "target_model": "tiny-model",
    }
    assert s["agentic_lifecycle_event_count"] == 3 * 3 + 1


def test_dynamo_standard_trace_arrives_at_received_times_with_its_block_size() -> None:
    """Two requests received 20 ms apart; 4 tokens per hash from the records (not 512)."""
    first, second = _replay("dynamo-standard.jsonl", trace_format="dynamo")
    assert (first.arrival_time_ms, second.arrival_time_ms) == (0.0, 20.0)
    assert (first.request_id, second.request_id) == ("standard-1", "standard-2")
    sessions = read_trace([DATA / "dynamo-standard.jsonl"], TraceOptions(trace_format="dynamo"))
    assert isinstance(sessions, list)
    prompt = sessions[0].turns[0].prompt
    assert isinstance(prompt, TracePrompt) and prompt.trace_block_size == 4


def test_dynamo_agent_trace_lowers_to_one_play() -> None:
    """The sub-agent's first request starts 20 ms after its source request is dispatched, its
    second 20 ms after the first completes; the consumer joins the sub-agent 40 ms after its
    last request completes."""
    source, child_first, child_last, consumer = _replay(
        "dynamo-agentic.jsonl", trace_format="dynamo", execution_model="tiny-model"
    )
    assert child_first.arrival_time_ms == 20.0
    assert child_first.terminal_time_ms is not None
    assert child_last.arrival_time_ms == pytest.approx(
        child_first.terminal_time_ms + 20.0, abs=1e-9
    )
    assert consumer.arrival_time_ms == pytest.approx(child_last.terminal_time_ms + 40.0, abs=1e-9)  # type: ignore[operator]
    assert consumer.terminal_time_ms == pytest.approx(149.209672, abs=1e-6)
    assert {r.play_id for r in (source, consumer)} == {"dynamo-play:parent-source"}


def test_dynamo_shards_replay_as_one_trace(tmp_path: Path) -> None:
    """Records split over two shards replay as the single file does."""
    lines = (DATA / "dynamo_request_trace_60.jsonl").read_text().splitlines(keepends=True)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(lines[1::2]))
    b.write_text("".join(lines[::2]))
    whole = run(RunConfig(trace=DATA / "dynamo_request_trace_60.jsonl", trace_format="dynamo"))
    split = run(RunConfig(trace=a, trace_shards=(b,), trace_format="dynamo"))
    host = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    keep = {k: v for k, v in whole.summary.items() if k not in host}
    assert keep == {k: v for k, v in split.summary.items() if k not in host}


# Every format with the KV router, disaggregated, and stepped pass by pass.
FORMATS = [
    ("mooncake_delta_20x4.jsonl", {"trace_format": "mooncake-delta", "trace_block_size": 64}),
    (
        "applied_compute_agentic_16.jsonl",
        {
            "trace_format": "applied_compute_agentic",
            "trace_block_size": 64,
            "replay_concurrency": 4,
            "trace_shared_prefix_ratio": 0.5,
            "trace_num_prefix_groups": 4,
        },
    ),
    (
        "agentic_mooncake_v2_30plays.jsonl",
        {"trace_format": "agentic_mooncake", "execution_model": "m", "agentic_lanes": 4},
    ),
    ("dynamo_request_trace_60.jsonl", {"trace_format": "dynamo"}),
    ("dynamo-agentic.jsonl", {"trace_format": "dynamo", "execution_model": "m"}),
]
ENGINE = parse_engine_args({"block_size": 64, "num_gpu_blocks": 512})
PREFILL = parse_engine_args({"block_size": 64}, role=Role.PREFILL)
DECODE = parse_engine_args({"block_size": 64}, role=Role.DECODE)
TOPOLOGIES = {
    "kv_router": {"router_mode": "kv_router", "num_workers": 2, "engine": ENGINE},
    "disaggregated": {
        "prefill_engine": PREFILL,
        "decode_engine": DECODE,
        "num_prefill_workers": 2,
        "num_decode_workers": 2,
    },
    "disaggregated_kv": {
        "router_mode": "kv_router",
        "prefill_engine": PREFILL,
        "decode_engine": DECODE,
        "num_prefill_workers": 2,
        "num_decode_workers": 1,
    },
}


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
@pytest.mark.parametrize(("trace", "options"), FORMATS, ids=[f[0] for f in FORMATS])
def test_format_replays_on_topology_same_with_exact_passes(
    trace: str, options: dict[str, object], topology: str
) -> None:
    """Every request completes with its whole output, prefix reuse happens, and stepping every
    pass gives the same records as fast-forward."""
    config = {**options, **TOPOLOGIES[topology]}
    fast = run(RunConfig(trace=DATA / trace, **config))  # type: ignore[arg-type]
    exact = run(RunConfig(trace=DATA / trace, exact_passes=True, **config))  # type: ignore[arg-type]
    assert fast.records and all(r.terminal_status is Terminal.COMPLETED for r in fast.records)
    assert all(r.output_length == r.requested_output_length for r in fast.records)
    if len(fast.records) > 4:
        assert fast.summary["prefix_cache_reused_ratio"] > 0.2
    for f, e in zip(fast.records, exact.records, strict=True):
        assert (f.arrival_time_ms, f.reused_input_tokens, f.output_length) == (
            e.arrival_time_ms,
            e.reused_input_tokens,
            e.output_length,
        )
        assert f.terminal_time_ms == pytest.approx(e.terminal_time_ms, abs=1e-9)
    if "execution_model" in options:
        assert fast.summary["completed_trajectories"] == fast.summary["total_trajectories"]


def test_agentic_records_carry_the_reference_lineage() -> None:
    """Each request of the Dynamo agent fixture names its conversation, play and root; the
    sub-agent's first request names the request that spawned it (as the reference writes)."""
    from servesim.metrics.report import request_row

    records = _replay("dynamo-agentic.jsonl", trace_format="dynamo", execution_model="m")
    rows = {r.request_id: request_row(r) for r in records}
    play = "dynamo-play:parent-source"
    assert rows["child-first"]["agentic"] == {
        "conversation_id": "child",
        "parent_id": "parent-source",
        "play_id": play,
        "request_id": "child-first",
        "root_id": "parent-source",
    }
    assert "parent_id" not in rows["child-last"]["agentic"]
    assert rows["child-first"]["dispatched_at_ms"] == 20.0


def test_dynamo_background_tool_call_is_joined_too(tmp_path: Path) -> None:
    """A ``background`` sub-agent still holds its consumer back, as the reference replays it
    (probed: the same 149.210 ms as the blocking fixture)."""
    trace = tmp_path / "background.jsonl"
    trace.write_text(
        (DATA / "dynamo-agentic.jsonl")
        .read_text()
        .replace('"execution_mode":"blocking"', '"execution_mode":"background"')
    )
    *_, child_last, consumer = _replay(str(trace), trace_format="dynamo", execution_model="m")
    assert consumer.arrival_time_ms == pytest.approx(child_last.terminal_time_ms + 40.0, abs=1e-9)  # type: ignore[operator]
    assert consumer.terminal_time_ms == pytest.approx(149.209672, abs=1e-6)
