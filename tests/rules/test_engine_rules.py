"""Engine rules of the reference (Dynamo 1.6.1), each pinned by a small probe of it.

Every expected number below was read off the reference's own report for the
same inputs (``refcheck.py reference SCENARIO OUT --requests OUT.jsonl``);
the scenario is given in each test. Polynomial timing throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim import ConfigError, RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.cli import main
from servesim.engine.timing import PolynomialTiming
from tests.support import replay_synthetic, write_trace


def test_a_readmitted_request_also_decodes_in_its_recompute_pass() -> None:
    """Two requests of 500 in / 200 out on 70 blocks of 16: the second is preempted.

    It is re-admitted at 5,943.06 ms (when the first finishes) reusing 416
    tokens; it already has output, so that pass costs the prefill of the 84
    recomputed prompt tokens *plus* a decode step over its 561-token context.
    Priced as prefill only, its last token would come 26.34 ms earlier
    (9,818.626 ms).
    """
    report = replay_synthetic(500, 200, 2, {"block_size": 16, "num_gpu_blocks": 70})
    first, second = report.records
    assert first.last_token_ms == pytest.approx(5943.063968, rel=1e-9)
    assert second.reused_input_tokens == 416
    assert second.last_token_ms == pytest.approx(9844.961259, rel=1e-9)
    assert report.summary["duration_ms"] == pytest.approx(9844.961259, rel=1e-9)


def test_committed_prefill_counts_work_that_computed_prompt_tokens() -> None:
    """The reference's ``committed_prefill_tokens``.

    Above, the re-admission recomputes 145 tokens (84 of the prompt, 61
    generated) in one work item: 500 + 500 + 145 = 1,145. Eight requests of
    500/200 on 120 blocks with a 300-token budget: two re-admissions reuse
    512 tokens, past their prompts, so their work computes generated tokens
    only and adds nothing (8 x 500 = 4,000, where counting every recomputed
    token would give 4,208).
    """
    report = replay_synthetic(500, 200, 2, {"block_size": 16, "num_gpu_blocks": 70})
    assert report.summary["committed_prefill_tokens"] == 1145
    report = replay_synthetic(
        500, 200, 8, {"block_size": 16, "num_gpu_blocks": 120, "max_num_batched_tokens": 300}
    )
    assert [r.reused_input_tokens for r in report.records].count(512) == 2
    assert report.summary["committed_prefill_tokens"] == 4000


def test_decode_utilisation_is_clamped_at_full() -> None:
    """With shared blocks counted once, the logical context can exceed the KV capacity."""
    timing = PolynomialTiming(40 * 64, 1.0, 1.0)
    full = timing.decode_ms(1, 40 * 64, 40 * 64)
    assert full == pytest.approx(-25.74 + 54.01 + 5.74)
    assert timing.decode_ms(6, 6 * 2049, 2049) == full
    assert list(timing.decode_series(6, 6 * 2049, 3)) == [full] * 3


def test_shared_prefix_on_a_small_cache_prices_decode_at_full_utilisation(tmp_path: Path) -> None:
    """Six requests with the same 2,048-token prompt (four trace blocks) on 40 blocks of 64.

    Their logical context is about 6 x 2,049 tokens against a capacity of
    2,560: every decode step costs the polynomial at p = 1 (34.01 ms). The
    last two are preempted and re-admitted reusing the whole prompt.
    Unclamped, p is about 4.8, the polynomial goes negative and is floored
    at 1 ms: the first request would end at 121.2 ms instead of 715.4 ms.
    """
    rows = [(float(i), 2048, 20, [1, 2, 3, 4]) for i in range(6)]
    trace = write_trace(tmp_path / "shared.jsonl", rows)
    report = run(
        RunConfig(trace=trace, engine=parse_engine_args({"block_size": 64, "num_gpu_blocks": 40}))
    )
    expected = [
        (49.362902, 715.425539, 0),
        (103.245539, 749.435539, 1984),
        (103.245539, 749.435539, 1984),
        (103.245539, 749.435539, 1984),
        (103.245539, 783.445539, 2048),
        (103.245539, 1336.437557, 2048),
    ]
    got = [(r.first_token_ms, r.last_token_ms, r.reused_input_tokens) for r in report.records]
    for (first, last, reused), (ref_first, ref_last, ref_reused) in zip(got, expected, strict=True):
        assert first == pytest.approx(ref_first, rel=1e-9)
        assert last == pytest.approx(ref_last, rel=1e-9)
        assert reused == ref_reused


def test_summary_names_the_eviction_policy_and_has_no_power_model() -> None:
    """Keys the reference always writes: ``kv_eviction_policy`` and null power figures."""
    summary = replay_synthetic(100, 2, 1, {}).summary
    assert summary["kv_eviction_policy"] == "lru"
    assert summary["power_w"] is None
    assert summary["power_coverage"] is None


def test_block_size_zero_is_rejected() -> None:
    """The reference: "block_size must be positive"; servesim used to take the default."""
    with pytest.raises(ConfigError, match="block_size must be positive, got 0"):
        parse_engine_args({"block_size": 0})


def test_block_size_zero_exits_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """On the command line it is a usage error (exit 2) naming the key."""
    argv = ["replay", "--input-tokens", "10", "--output-tokens", "2", "--request-count", "1"]
    argv += ["--arrival-interval-ms", "1", "--extra-engine-args", '{"block_size": 0}']
    assert main(argv) == 2
    assert "block_size must be positive" in capsys.readouterr().err


def _records_of(
    tmp_path: Path, rows: list[dict[str, object]]
) -> list[tuple[str | None, int | None]]:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = run(RunConfig(trace=trace))
    return [
        (r.session_id, r.turn_index)
        for r in sorted(report.records, key=lambda r: r.arrival_time_ms)
    ]


def test_a_trace_without_sessions_reports_none(tmp_path: Path) -> None:
    """The reference writes ``session_id`` and ``turn_index`` null when no row has a session."""
    rows: list[dict[str, object]] = [
        {"timestamp": t, "input_length": 100, "output_length": 2, "hash_ids": [t + 1]}
        for t in range(3)
    ]
    assert _records_of(tmp_path, rows) == [(None, None)] * 3


def test_in_a_trace_with_sessions_a_row_without_one_is_named_by_its_line(tmp_path: Path) -> None:
    """Once some rows have sessions, the reference names a session-less row ``request_<line>``.

    Its probe: rows at 0 (no session), 1 (session "s") and "s" again after a
    5 ms delay gave ("request_1", 0), ("s", 0), ("s", 1).
    """
    rows: list[dict[str, object]] = [
        {"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [1]},
        {
            "timestamp": 1,
            "session_id": "s",
            "input_length": 100,
            "output_length": 2,
            "hash_ids": [2],
        },
        {"session_id": "s", "delay": 5, "input_length": 100, "output_length": 2, "hash_ids": [3]},
    ]
    assert _records_of(tmp_path, rows) == [("request_1", 0), ("s", 0), ("s", 1)]


@pytest.mark.parametrize("exact_passes", [False, True])
def test_decode_durations_agree_to_the_nanosecond(exact_passes: bool) -> None:
    """One request of 1,000 in / 4,000 out on 100 blocks of 64: 3,999 decode passes.

    The reference's last token is at 98,263.35833200002 ms, to the last bit.
    Many polynomial values lie on half a nanosecond here (p = L / 6,400), so
    this needs the reference's float operations (p by division, the square
    first) and its rounding (``ms / 1000`` seconds to the nearest ns on the
    float's exact value); ``round(ms * 1e6)`` with p by a reciprocal ended 23
    ns later.
    """
    report = run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=1000, output_tokens=4000, request_count=1, arrival_interval_ms=0.0
            ),
            engine=parse_engine_args({"block_size": 64, "num_gpu_blocks": 100}),
            exact_passes=exact_passes,
        )
    )
    assert report.records[0].last_token_ms == 98263.35833200002


def test_a_mixed_pass_rounds_its_prefill_and_decode_apart() -> None:
    """300 requests of 700 in / 60 out every 7.3 ms on two workers: most passes are mixed.

    The reference rounds the prefill and the decode part of a pass to whole
    nanoseconds separately. Rounding their sum instead left 549 of the 600
    first and last token times up to 2 ns off; now all 600 agree to the bit.
    """
    report = run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=700, output_tokens=60, request_count=300, arrival_interval_ms=7.3
            ),
            num_workers=2,
            engine=parse_engine_args({"block_size": 64, "num_gpu_blocks": 3000}),
        )
    )
    records = report.records
    got = [(records[i].first_token_ms, records[i].last_token_ms) for i in (0, 1, 150, 299)]
    assert got == [
        (27.336117, 3614.576623999999),
        (34.636117, 3621.876623999999),
        (1382.971373, 3944.865930999999),
        (2497.1224719999996, 4031.3410969999986),
    ]
    assert report.summary["duration_ms"] == 4031.3410969999986
    assert report.summary["mean_ttft_ms"] == pytest.approx(247.89874106667, rel=1e-12)
