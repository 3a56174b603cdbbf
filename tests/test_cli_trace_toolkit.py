"""``servesim trace stats`` and ``servesim trace convert`` on small traces with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.simulation import RunConfig, run
from tests.support import run_cli

FORMATS = Path(__file__).resolve().parent / "data" / "replay_formats"


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_stats_counts_lengths_reuse_and_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three requests over 2 s: the third repeats the first's 2 blocks of 4 tokens (8 of 24
    prompt tokens reusable); rates 1 req/s in the first window, ..., 1 in the last."""
    trace = _write(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]},
            {"timestamp": 1000, "input_length": 8, "output_length": 3, "hash_ids": [3, 4]},
            {"timestamp": 2000, "input_length": 8, "output_length": 5, "hash_ids": [1, 2]},
        ],
    )
    code, out, _ = run_cli(
        capsys, "trace", "stats", str(trace), "--trace-block-size", "4", "--json"
    )
    assert code == 0
    stats = json.loads(out)
    assert (stats["requests"], stats["sessions"]) == (3, 3)
    assert (stats["total_input_tokens"], stats["total_output_tokens"]) == (24, 9)
    assert stats["output_length"] == {
        "mean": 3.0, "min": 1.0, "median": 3.0, "p90": 5.0, "p99": 5.0, "max": 5.0
    }  # fmt: skip
    assert stats["reuse_potential"] == 8 / 24
    arrivals = stats["arrivals"]
    assert (arrivals["timed_requests"], arrivals["span_ms"], arrivals["mean_rate_rps"]) == (
        3,
        2000.0,
        1.5,
    )
    assert arrivals["rate_rps_by_window"] == [5.0, 0, 0, 0, 0, 5.0, 0, 0, 0, 5.0]


def test_stats_of_an_agentic_trace_counts_plays(capsys: pytest.CaptureFixture[str]) -> None:
    """30 plays of 4 requests; only the roots have a fixed arrival."""
    code, out, _ = run_cli(
        capsys,
        "trace",
        "stats",
        str(FORMATS / "agentic_mooncake_v2_30plays.jsonl"),
        "--trace-format",
        "agentic_mooncake",
    )
    assert code == 0
    assert "requests         120 in 90 sessions, 30 plays" in out
    assert "arrivals         30 over 5.800 s" in out


def test_convert_delta_to_mooncake_keeps_prompt_identity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whole prompts in 64-token blocks: turn 1 (493 tokens: 7 full blocks and a part) and
    turn 2 (493 + 41 output + 119 = 653 tokens) share the 7 full blocks' ids; the block
    holding turn 1's output is new, as is every part block."""
    out = tmp_path / "full.jsonl"
    code, _, err = run_cli(
        capsys,
        "trace",
        "convert",
        str(FORMATS / "mooncake_delta_20x4.jsonl"),
        *("--from", "mooncake-delta", "--trace-block-size", "64", "-o", str(out)),
    )
    assert code == 0, err
    assert f"wrote 80 Mooncake rows to {out}" in err
    first, second = (json.loads(line) for line in out.read_text().splitlines()[:2])
    assert first == {
        "session_id": "s0",
        "timestamp": 0.0,
        "input_length": 493,
        "output_length": 41,
        "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7],
    }
    assert second == {
        "session_id": "s0",
        "delay": 20.0,
        "input_length": 653,
        "output_length": 50,
        "hash_ids": [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11],
    }


def test_convert_dynamo_trace_replays_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Dynamo trace converted to Mooncake (block size 64) replays to the same summary."""
    out = tmp_path / "m.jsonl"
    source = FORMATS / "dynamo_request_trace_60.jsonl"
    code, _, err = run_cli(
        capsys, "trace", "convert", str(source), "--from", "dynamo", "-o", str(out)
    )
    assert code == 0, err
    direct = run(RunConfig(trace=source, trace_format="dynamo", num_workers=2))
    converted = run(RunConfig(trace=out, trace_block_size=64, num_workers=2))
    host = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    assert {k: v for k, v in direct.summary.items() if k not in host} == {
        k: v for k, v in converted.summary.items() if k not in host
    }


def test_convert_azure_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Timestamps to ms since the first row; rows without context skipped; new ids per request."""
    csv = tmp_path / "azure.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,1000,10\n"
        "2023-11-16 18:15:47.0000000,0,3\n"
        "2023-11-16 18:15:50.9951690,513,8\n"
    )
    code, out, err = run_cli(capsys, "trace", "convert", str(csv), "--from", "azure", "-o", "-")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows == [
        {"timestamp": 0.0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 4314.579, "input_length": 513, "output_length": 8, "hash_ids": [2, 3]},
    ]


def test_convert_burstgpt_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seconds to ms since the first row; a failed request (0 response tokens) kept."""
    csv = tmp_path / "burst.csv"
    csv.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
    )
    out = tmp_path / "b.jsonl"
    code, _, err = run_cli(
        capsys, "trace", "convert", str(csv), "--from", "burstgpt", "-o", str(out)
    )
    assert code == 0, err
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"timestamp": 0.0, "input_length": 472, "output_length": 18, "hash_ids": [0]},
        {"timestamp": 40000.0, "input_length": 1087, "output_length": 0, "hash_ids": [1, 2, 3]},
    ]


def test_convert_refuses_agentic_and_bad_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One message, exit 2, no output file."""
    out = tmp_path / "x.jsonl"
    code, _, err = run_cli(
        capsys,
        "trace",
        "convert",
        str(FORMATS / "agentic-mooncake.jsonl"),
        *("--from", "agentic_mooncake", "-o", str(out)),
    )
    assert code == 2 and "an agentic trace cannot be written as Mooncake JSONL" in err
    assert not out.exists()
    csv = tmp_path / "bad.csv"
    csv.write_text("Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,many,18\n")
    code, _, err = run_cli(
        capsys, "trace", "convert", str(csv), "--from", "burstgpt", "-o", str(out)
    )
    assert code == 2
    assert f"{csv}:2: Request tokens must be a token count, got 'many'" in err
    assert not out.exists()
