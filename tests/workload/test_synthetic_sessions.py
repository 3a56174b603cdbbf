"""Synthetic sessions and shared prefixes, built as the reference (Dynamo 1.6.1) builds them.

A session prompt is one hash id per engine block: with prefix groups and a
ratio above 0, its first ``P = round(blocks x ratio)`` ids (halves away from
zero) are its session's group's, the rest are new; ids become dense tokens in
order of first appearance. Groups are drawn once per session, in session
order, from the reference's generator seeded with 42 (``random_range``, one
32-bit word a draw). Turn k+1 arrives when turn k completes plus the delay.
Numbers marked "reference" come from probes of Dynamo 1.6.1 (256 in / 4 out,
block size 16, one worker, round robin, unless said otherwise).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from servesim import ConfigError, EngineConfig, RunConfig, SyntheticWorkload, run
from servesim.cli import main
from servesim.workload.request import Session, TracePrompt
from servesim.workload.rng import StdRng
from servesim.workload.sharing import mark_shared_blocks
from servesim.workload.synthetic import prefix_groups, round_half_away, synthetic_sessions

# --- the generator: one 32-bit word at a time ---------------------------------------------------


def test_seed_42_draws_these_groups() -> None:
    """The reference's groups for 40 sessions in 50 groups (its probe: sessions 11, 16, 17, 24,
    29, 30, 32, 33, 35 and 36 are the ones whose group an earlier session drew)."""
    assert prefix_groups(40, 50) == [
        6, 26, 12, 27, 43, 31, 49, 20, 48, 1, 30, 20, 17, 36, 9, 42, 31, 6, 23, 0,
        41, 46, 29, 25, 43, 19, 35, 7, 40, 26, 40, 10, 31, 0, 8, 25, 23, 2, 33, 32,
    ]  # fmt: skip
    assert prefix_groups(12, 3) == [0, 1, 0, 1, 2, 1, 2, 1, 2, 0, 1, 1]
    assert prefix_groups(6, 2) == [0, 1, 0, 1, 1, 1]


def test_u64_is_the_next_two_words_low_first_wherever_the_stream_is() -> None:
    words = StdRng(42)
    stream = [words.next_u32() for _ in range(1030)]
    rng = StdRng(42)
    rng.next_u32()
    assert rng.next_u64() == stream[1] | stream[2] << 32
    for _ in range(1020):  # 1,023 words taken: the next u64 spans a refill of the buffer
        rng.next_u32()
    assert rng.next_u64() == stream[1023] | stream[1024] << 32
    assert rng.next_u32() == stream[1025]


def test_a_draw_near_overflow_takes_a_second_word() -> None:
    """Canon's method: when the low half of ``word x n`` is within ``n`` of overflowing, a second
    word's high half may carry. With n = 2^32 - 1 that is almost every draw."""
    rng = StdRng(42)
    draws = [rng.random_range(2**32 - 1) for _ in range(6)]
    assert draws == [572990626, 1068323197, 3729863888, 4252381361, 4161904617, 2651816359]
    stream = StdRng(42)
    for _ in range(12):  # two words a draw
        stream.next_u32()
    assert rng.next_u32() == stream.next_u32() == 1493727483


def test_random_range_refuses_an_empty_or_too_wide_range() -> None:
    with pytest.raises(ValueError, match="1 <= n <= 2"):
        StdRng(42).random_range(0)
    with pytest.raises(ValueError, match="1 <= n <= 2"):
        StdRng(42).random_range(2**32 + 1)


# --- prompts -------------------------------------------------------------------------------------


def _tokens(sessions: list[Session]) -> list[list[tuple[int, ...]]]:
    out = []
    for session in sessions:
        turns = []
        for spec in session.turns:
            assert isinstance(spec.prompt, TracePrompt)
            turns.append(spec.prompt.tokens)
        out.append(turns)
    return out


def test_turns_share_their_group_prefix_and_nothing_else() -> None:
    """64 tokens in blocks of 16: 4 ids, 2 of them the group's (groups [0, 1]); every other id is
    new, turns do not accumulate context, and tokens are numbered as ids first appear."""
    sessions = synthetic_sessions(
        input_tokens=64,
        output_tokens=4,
        request_count=2,
        block_size=16,
        arrival_interval_ms=1000,
        turns_per_session=2,
        shared_prefix_ratio=0.5,
        num_prefix_groups=2,
        inter_turn_delay_ms=100,
    )
    assert _tokens(sessions) == [
        [(0, 1, 2, 3), (0, 1, 4, 5)],
        [(6, 7, 8, 9), (6, 7, 10, 11)],
    ]
    specs = [spec for session in sessions for spec in session.turns]
    assert [(s.session_id, s.turn_index, s.delay_ms) for s in specs] == [
        ("session_0", 0, 0.0),
        ("session_0", 1, 100.0),
        ("session_1", 0, 0.0),
        ("session_1", 1, 100.0),
    ]
    assert [s.prompt.trace_block_size for s in specs if isinstance(s.prompt, TracePrompt)] == [
        16
    ] * 4


def test_shared_blocks_round_half_away_from_zero() -> None:
    """80 tokens in blocks of 16 at ratio 0.5: 2.5 blocks, rounded to 3 (the reference reuses 48)."""
    assert [round_half_away(x) for x in (0.0, 0.49, 0.5, 1.5, 2.5, 4.8)] == [0, 0, 1, 2, 3, 5]
    sessions = synthetic_sessions(
        input_tokens=80,
        output_tokens=4,
        request_count=2,
        block_size=16,
        arrival_interval_ms=1000,
        shared_prefix_ratio=0.5,
        num_prefix_groups=1,
    )
    assert _tokens(sessions) == [[(0, 1, 2, 3, 4)], [(0, 1, 2, 5, 6)]]
    mark_shared_blocks(sessions, 16)
    assert [s.turns[0].shared_blocks for s in sessions] == [3, 3]


def test_the_block_is_the_engines_and_the_last_one_may_be_partial() -> None:
    """250 tokens in blocks of 64: 4 ids (the last covers 58 tokens); ratio 0.3 of 4 is 1 block."""
    sessions = synthetic_sessions(
        input_tokens=250,
        output_tokens=4,
        request_count=2,
        block_size=64,
        arrival_interval_ms=1000,
        shared_prefix_ratio=0.3,
        num_prefix_groups=1,
    )
    assert _tokens(sessions) == [[(0, 1, 2, 3)], [(0, 4, 5, 6)]]
    assert [s.turns[0].input_length for s in sessions] == [250, 250]


@pytest.mark.parametrize(
    ("ratio", "groups"), [(0.0, 3), (0.5, 0)], ids=["ratio 0, groups", "ratio, no groups"]
)
def test_sessions_without_both_a_ratio_and_groups_share_nothing(ratio: float, groups: int) -> None:
    sessions = synthetic_sessions(
        input_tokens=64,
        output_tokens=4,
        request_count=3,
        block_size=16,
        arrival_interval_ms=10,
        shared_prefix_ratio=ratio,
        num_prefix_groups=groups,
    )
    assert _tokens(sessions) == [[(0, 1, 2, 3)], [(4, 5, 6, 7)], [(8, 9, 10, 11)]]
    mark_shared_blocks(sessions, 16)
    assert [s.turns[0].shared_blocks for s in sessions] == [0, 0, 0]
    assert [s.turns[0].session_id for s in sessions] == ["session_0", "session_1", "session_2"]


def test_without_session_settings_requests_are_one_shot() -> None:
    (session,) = synthetic_sessions(
        input_tokens=64, output_tokens=4, request_count=1, block_size=16, arrival_interval_ms=10
    )
    (spec,) = session.turns
    assert not isinstance(spec.prompt, TracePrompt)
    assert (spec.session_id, spec.turn_index) == (None, None)


def test_groups_do_not_depend_on_the_arrival_seed() -> None:
    def tokens(seed: int) -> list[list[tuple[int, ...]]]:
        return _tokens(
            synthetic_sessions(
                input_tokens=64,
                output_tokens=4,
                request_count=12,
                block_size=16,
                request_rate=5.0,
                seed=seed,
                shared_prefix_ratio=0.5,
                num_prefix_groups=3,
            )
        )

    assert tokens(7) == tokens(42)


# --- arrivals ------------------------------------------------------------------------------------


def test_a_fixed_interval_is_a_running_sum_of_1000_over_its_rate() -> None:
    """30 ms is a rate of 33.3.../s whose gap is 29.999999999999996 ms: request 11 arrives at
    329.99999999999994, as in the reference (not 330)."""
    for turns in (1, 2):
        sessions = synthetic_sessions(
            input_tokens=32,
            output_tokens=1,
            request_count=12,
            block_size=16,
            arrival_interval_ms=30.0,
            turns_per_session=turns,
        )
        assert sessions[1].start_ms == 29.999999999999996
        assert sessions[11].start_ms == 329.99999999999994


def test_poisson_first_turns_arrive_as_one_shot_requests_do() -> None:
    """Sessions or not, the first arrivals are the same stream (the reference's, seed 7)."""

    def starts(groups: int) -> list[float | None]:
        sessions = synthetic_sessions(
            input_tokens=32,
            output_tokens=1,
            request_count=6,
            block_size=16,
            request_rate=10.0,
            seed=7,
            num_prefix_groups=groups,
        )
        return [s.start_ms for s in sessions]

    reference = [
        0.0,
        3.0786437168091014,
        39.76362317455055,
        55.153612583970286,
        133.35520869913557,
        165.16896241890325,
    ]
    assert starts(0) == starts(4) == reference


# --- replays against the reference ---------------------------------------------------------------


Row = tuple[str | None, int | None, float, float, int]


def _replay(**changes: Any) -> list[Row]:
    workload = SyntheticWorkload(input_tokens=256, output_tokens=4, request_count=4)
    config = RunConfig(
        synthetic=dataclasses.replace(workload, **changes), engine=EngineConfig(block_size=16)
    )
    return _rows(config)


def _rows(config: RunConfig) -> list[Row]:
    """(session, turn, arrival, last token, reused tokens) of every request, by session and turn."""
    rows = []
    for r in run(config).records:
        assert r.last_token_ms is not None
        rows.append(
            (r.session_id, r.turn_index, r.arrival_time_ms, r.last_token_ms, r.reused_input_tokens)
        )
    return sorted(rows, key=lambda row: (int((row[0] or "_0").split("_")[1]), row[1] or 0))


def test_open_loop_sessions_match_the_reference() -> None:
    """4 sessions x 3 turns, 1 s apart, ratio 0.5 in 2 groups ([0, 1, 0, 1]), 100 ms think time.
    Sessions 0 and 1 open their groups; every later turn and sessions 2 and 3 reuse the 8-block
    group prefix (128 tokens) and nothing more. Reference numbers (rounded to the ns)."""
    rows = _replay(
        arrival_interval_ms=1000,
        turns_per_session=3,
        shared_prefix_ratio=0.5,
        num_prefix_groups=2,
        inter_turn_delay_ms=100,
    )
    expected = [
        ("session_0", 0, 0.0, 37.795364, 0),
        ("session_0", 1, 137.795364, 173.626555, 128),
        ("session_0", 2, 273.626555, 309.457746, 128),
        ("session_1", 0, 1000.0, 1037.795364, 0),
        ("session_1", 1, 1137.795364, 1173.626555, 128),
        ("session_1", 2, 1273.626555, 1309.457746, 128),
        ("session_2", 0, 2000.0, 2035.831191, 128),
        ("session_2", 1, 2135.831191, 2171.662382, 128),
        ("session_2", 2, 2271.662382, 2307.493573, 128),
        ("session_3", 0, 3000.0, 3035.831191, 128),
        ("session_3", 1, 3135.831191, 3171.662382, 128),
        ("session_3", 2, 3271.662382, 3307.493573, 128),
    ]
    assert [(s, t, round(a, 6), round(e, 6), r) for s, t, a, e, r in rows] == expected


def test_closed_loop_sessions_hold_their_slot_through_think_time() -> None:
    """Concurrency 2, 4 sessions x 2 turns: sessions 2 and 3 start when sessions 0 and 1 finish
    their last turn, not during their think time. Reference numbers."""
    workload = SyntheticWorkload(
        input_tokens=256,
        output_tokens=4,
        request_count=4,
        turns_per_session=2,
        shared_prefix_ratio=0.5,
        num_prefix_groups=2,
        inter_turn_delay_ms=100,
    )
    rows = _rows(
        RunConfig(synthetic=workload, replay_concurrency=2, engine=EngineConfig(block_size=16))
    )
    assert [(s, t, round(a, 6), round(e, 6), r) for s, t, a, e, r in rows] == [
        ("session_0", 0, 0.0, 41.924342, 0),
        ("session_0", 1, 141.924342, 179.878951, 128),
        ("session_1", 0, 0.0, 41.924342, 0),
        ("session_1", 1, 141.924342, 179.878951, 128),
        ("session_2", 0, 179.878951, 217.83356, 128),
        ("session_2", 1, 317.83356, 355.788169, 128),
        ("session_3", 0, 179.878951, 217.83356, 128),
        ("session_3", 1, 317.83356, 355.788169, 128),
    ]


def test_a_whole_prompt_prefix_reuses_all_but_the_last_token_s_block() -> None:
    """Ratio 1 of 250 tokens: the prompts are equal, partial block included; the engine reuses
    the 15 full blocks (240 tokens) of the first 249 tokens. Reference numbers."""
    rows = _replay(request_count=3, input_tokens=250, arrival_interval_ms=1000,
                   shared_prefix_ratio=1.0, num_prefix_groups=1)  # fmt: skip
    assert [r for *_, r in rows] == [0, 240, 240]


def test_speedup_divides_first_arrivals_and_think_times_in_open_loop_only() -> None:
    """Speed-up 2: sessions at 0 and 500 ms, turn 1 at completion + 50 ms (reference); in closed
    loop it changes nothing (think time stays 100 ms)."""
    workload = SyntheticWorkload(
        input_tokens=256,
        output_tokens=4,
        request_count=2,
        arrival_interval_ms=1000,
        turns_per_session=2,
        inter_turn_delay_ms=100,
    )
    config = RunConfig(
        synthetic=workload, engine=EngineConfig(block_size=16), arrival_speedup_ratio=2.0
    )
    arrivals = [round(a, 6) for _, _, a, _, _ in _rows(config)]
    assert arrivals == [0.0, 87.795364, 500.0, 587.795364]
    closed = dataclasses.replace(
        config,
        synthetic=dataclasses.replace(workload, arrival_interval_ms=None),
        replay_concurrency=1,
    )
    arrivals = [round(a, 6) for _, _, a, _, _ in _rows(closed)]
    assert arrivals[:2] == [0.0, 137.795364]


# --- validation ----------------------------------------------------------------------------------

SYNTHETIC = ["replay", "--input-tokens", "64", "--output-tokens", "2", "--request-count", "2"]


def _exit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main([*SYNTHETIC, *argv, "--quiet"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "needs exactly one of --replay-concurrency, --request-rate and --arrival-interval-ms, got none"),
        (["--request-rate", "5", "--replay-concurrency", "2"], "got --replay-concurrency and --request-rate"),
        (["--arrival-interval-ms", "5", "--turns-per-session", "0"], "--turns-per-session: must be an integer >= 1, got 0"),
        (["--arrival-interval-ms", "5", "--shared-prefix-ratio", "1.5"], "--shared-prefix-ratio: must be a number between 0 and 1, got 1.5"),
        (["--arrival-interval-ms", "5", "--shared-prefix-ratio", "nan"], "--shared-prefix-ratio: must be a number between 0 and 1, got nan"),
        (["--arrival-interval-ms", "5", "--inter-turn-delay-ms", "-5"], "--inter-turn-delay-ms: must be a finite non-negative number, got -5"),
        (["--arrival-interval-ms", "5", "--num-prefix-groups", "-1"], "--num-prefix-groups: must be a non-negative integer, got -1"),
        (["--arrival-interval-ms", "5", "--num-prefix-groups", "4294967297"], "(--num-prefix-groups) must be between 0 and 4294967296, got 4294967297"),
    ],
)  # fmt: skip
def test_bad_synthetic_settings_exit_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, err = _exit(capsys, *argv)
    assert code == 2
    assert err.count("servesim: error:") == 1, err
    assert message in err, err


def test_session_flags_do_not_apply_to_a_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    try:
        code = main(["replay", str(trace), "--turns-per-session", "2", "--num-prefix-groups", "3"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert code == 2
    assert "--turns-per-session, --num-prefix-groups only apply to synthetic replay" in err


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"turns_per_session": 0}, "turns per session (--turns-per-session) must be at least 1, got 0"),
        ({"inter_turn_delay_ms": math.inf}, "(--inter-turn-delay-ms) must be a finite non-negative number, got inf"),
        ({"shared_prefix_ratio": math.nan}, "(--shared-prefix-ratio) must be between 0 and 1, got nan"),
        ({"shared_prefix_ratio": -0.1}, "(--shared-prefix-ratio) must be between 0 and 1, got -0.1"),
        ({"arrival_interval_ms": None}, "got none"),
        ({"request_rate": 3.0}, "got --request-rate and --arrival-interval-ms"),
    ],
)  # fmt: skip
def test_the_api_refuses_the_same_values(changes: dict[str, Any], message: str) -> None:
    """Even where the reference's one-shot path lets a nonsense value through (turns 0, a negative
    ratio without groups), servesim refuses it."""
    workload = SyntheticWorkload(
        input_tokens=64, output_tokens=2, request_count=2, arrival_interval_ms=5.0
    )
    config = RunConfig(synthetic=dataclasses.replace(workload, **changes))
    with pytest.raises(ConfigError) as error:
        run(config)
    assert message in str(error.value)
