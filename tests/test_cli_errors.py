"""Bad input to ``servesim replay``: one clear message, exit code 2, no report files left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesim.cli import main

GOOD_ROW: dict[str, Any] = {
    "timestamp": 0,
    "input_length": 100,
    "output_length": 5,
    "hash_ids": [1],
}
SYNTHETIC = [
    *("--input-tokens", "100", "--output-tokens", "5", "--request-count", "3"),
    *("--arrival-interval-ms", "0"),
]


def _outputs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "report.json", tmp_path / "requests.jsonl"


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run the CLI with report outputs in ``tmp_path``; return (exit code, stderr)."""
    report, records = _outputs(tmp_path)
    argv = ["replay", *args, "--report-json", str(report), "--per-request-jsonl", str(records)]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def _fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str, expect: list[str]
) -> str:
    """Assert the run exits 2 with one message holding every ``expect`` text and no files."""
    code, err = _run(tmp_path, capsys, *args)
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("servesim: error:") == 1, err
    for text in expect:
        assert text in err, f"{text!r} not in {err!r}"
    for path in _outputs(tmp_path):
        assert not path.exists(), path
    return err


def _trace(tmp_path: Path, *lines: str | dict[str, Any]) -> Path:
    """Write a JSONL trace whose lines are raw strings or objects."""
    path = tmp_path / "trace.jsonl"
    text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
    path.write_text(text)
    return path


def _row(**changes: Any) -> dict[str, Any]:
    row = {**GOOD_ROW, **changes}
    return {k: v for k, v in row.items() if v is not None}


# --- trace problems -------------------------------------------------------------------------


def test_malformed_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line that is not JSON is reported with the file and its 1-based line number."""
    trace = _trace(tmp_path, GOOD_ROW, '{"timestamp": 1, "hash_ids": [2')
    _fails(tmp_path, capsys, str(trace), expect=[f"{trace}:2", "invalid JSON"])


def test_missing_hash_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row without ``hash_ids`` names the field and its line."""
    trace = _trace(tmp_path, GOOD_ROW, _row(hash_ids=None))
    _fails(tmp_path, capsys, str(trace), expect=[f"{trace}:2", "hash_ids"])


@pytest.mark.parametrize(
    ("hash_ids", "found"),
    [
        ([1, True], "True"),
        ([1, -2], "-2"),
        ([1, 2.0], "2.0"),
        (["x", 1], "'x'"),
        ([3, None], "None"),
    ],
)
def test_bad_hash_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], hash_ids: list[Any], found: str
) -> None:
    """A hash id that is not a non-negative integer (a bool is not one) is named with its line."""
    trace = _trace(tmp_path, GOOD_ROW, _row(hash_ids=hash_ids))
    err = _fails(tmp_path, capsys, str(trace), expect=[f"{trace}:2"])
    assert err.endswith(f"'hash_ids' must hold non-negative integers, found {found}\n"), err


def test_missing_output_length(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row without ``output_length`` names the field and its line."""
    trace = _trace(tmp_path, _row(output_length=None))
    _fails(tmp_path, capsys, str(trace), expect=[f"{trace}:1", "output_length"])


def test_negative_input_length(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative ``input_length`` is rejected with the field, value and line."""
    trace = _trace(tmp_path, _row(input_length=-5))
    _fails(tmp_path, capsys, str(trace), expect=[f"{trace}:1", "input_length", "-5"])


def test_non_numeric_output_length(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A string ``output_length`` is rejected with the field, value and line."""
    trace = _trace(tmp_path, GOOD_ROW, _row(output_length="ten"))
    _fails(tmp_path, capsys, str(trace), expect=[f"{trace}:2", "output_length", "'ten'"])


def test_hash_ids_too_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two hash ids cannot cover 2000 input tokens at trace block size 512."""
    trace = _trace(tmp_path, _row(input_length=2000, hash_ids=[1, 2]))
    _fails(
        tmp_path,
        capsys,
        str(trace),
        "--trace-block-size",
        "512",
        expect=[f"{trace}:1", "input_length 2000", "capacity 1024"],
    )


def test_delay_on_first_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``delay`` on the first row of a session is rejected, naming the session and line."""
    trace = _trace(
        tmp_path,
        GOOD_ROW,
        _row(session_id="s1", delay=100),
        _row(session_id="s1", timestamp=None, delay=50, hash_ids=[3]),
    )
    _fails(tmp_path, capsys, str(trace), expect=[f"{trace}:2", "delay", "first turn", "s1"])


def test_missing_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace path that does not exist is named in the message."""
    missing = tmp_path / "nope.jsonl"
    _fails(tmp_path, capsys, str(missing), expect=["not found", str(missing)])


# --- engine args ----------------------------------------------------------------------------


def test_unknown_engine_key_inline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown key in inline ``--extra-engine-args`` is named."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--extra-engine-args",
        '{"bogus_key": 1}',
        expect=["--extra-engine-args", "unknown engine key 'bogus_key'"],
    )


def test_unknown_engine_key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown key in an ``@file`` of ``--extra-engine-args`` is named."""
    args = tmp_path / "engine.json"
    args.write_text('{"bogus_key": 1}')
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--extra-engine-args",
        f"@{args}",
        expect=["unknown engine key 'bogus_key'"],
    )


def test_engine_args_invalid_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Inline ``--extra-engine-args`` that is not JSON is reported as invalid JSON."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--extra-engine-args",
        '{"block_size": ',
        expect=["--extra-engine-args", "invalid JSON"],
    )


def test_engine_args_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing ``@file`` for ``--extra-engine-args`` names the file."""
    missing = tmp_path / "missing.json"
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--extra-engine-args",
        f"@{missing}",
        expect=["--extra-engine-args", str(missing)],
    )


def test_unsupported_feature_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A key of a feature servesim does not simulate yet is named as unsupported."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--extra-engine-args",
        '{"response_replay_trace_path": "r.jsonl"}',
        expect=["'response_replay_trace_path'", "not supported"],
    )


def test_negative_block_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative ``block_size`` names the key and value."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--extra-engine-args",
        '{"block_size": -1}',
        expect=["'block_size'", "-1"],
    )


def test_bad_preemption_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown ``preemption_mode`` names the key, the value and the allowed choices."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--extra-engine-args",
        '{"preemption_mode": "random"}',
        expect=["'preemption_mode'", "'random'", "'lifo'"],
    )


# --- flags ----------------------------------------------------------------------------------


def test_negative_request_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative ``--request-rate`` names the flag."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--request-rate",
        "-1",
        expect=["--request-rate", "greater than 0", "-1"],
    )


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_bad_num_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: str) -> None:
    """A zero or negative ``--num-workers`` names the flag and value."""
    _fails(
        tmp_path, capsys, *SYNTHETIC, "--num-workers", workers, expect=["--num-workers", workers]
    )


def test_trace_with_synthetic_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace together with ``--input-tokens`` is a conflict."""
    trace = _trace(tmp_path, GOOD_ROW)
    _fails(tmp_path, capsys, str(trace), "--input-tokens", "100", expect=["not both"])


def test_rate_with_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--request-rate`` and ``--arrival-interval-ms`` together are a conflict."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--request-rate",
        "5",
        "--arrival-interval-ms",
        "10",
        expect=["--request-rate", "--arrival-interval-ms"],
    )


def test_synthetic_missing_request_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Synthetic replay without ``--request-count`` names the missing flag."""
    _fails(
        tmp_path,
        capsys,
        "--input-tokens",
        "100",
        "--output-tokens",
        "5",
        expect=["missing --request-count"],
    )


def test_request_rate_with_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--request-rate`` does not apply to trace replay."""
    trace = _trace(tmp_path, GOOD_ROW)
    _fails(
        tmp_path,
        capsys,
        str(trace),
        "--request-rate",
        "5",
        expect=["--request-rate", "synthetic"],
    )


# --- the happy path -------------------------------------------------------------------------


def test_valid_tiny_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three synthetic requests run to completion and write both report files."""
    code, err = _run(tmp_path, capsys, *SYNTHETIC, "--quiet")
    assert code == 0, err
    report, records = _outputs(tmp_path)
    assert "summary" in json.loads(report.read_text())
    assert len(records.read_text().splitlines()) == 3


# --- disaggregated runs ---------------------------------------------------------------------

DISAGG = ["--num-prefill-workers", "1", "--num-decode-workers", "1"]


def test_disagg_flags_mixed_with_aggregated_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Disaggregated pool flags cannot be combined with --num-workers."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        *DISAGG,
        "--num-workers",
        "2",
        expect=["--num-workers", "disaggregated"],
    )


def test_mismatched_backends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Prefill and decode pools on different backends are refused, naming both."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        *DISAGG,
        "--prefill-engine-args",
        '{"backend": "vllm"}',
        "--decode-engine-args",
        '{"backend": "sglang"}',
        expect=["same backend", "'vllm'", "'sglang'"],
    )


def test_decode_engine_given_a_prefill_only_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The transfer's timing mode belongs to the prefill side; on the decode side it is an error."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        *DISAGG,
        "--decode-engine-args",
        '{"kv_transfer_timing_mode": "destination_missing"}',
        expect=["--decode-engine-args", "kv_transfer_timing_mode", "prefill"],
    )


def test_decode_engine_with_the_prefill_worker_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A decode engine declaring itself a prefill worker is refused."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        *DISAGG,
        "--decode-engine-args",
        '{"worker_type": "prefill"}',
        expect=["--decode-engine-args", "worker_type", "decode"],
    )


@pytest.mark.parametrize("bandwidth", ["0", "-5"])
def test_zero_or_negative_bandwidth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bandwidth: str
) -> None:
    """A transfer bandwidth must be positive."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        *DISAGG,
        "--prefill-engine-args",
        f'{{"kv_transfer_bandwidth": {bandwidth}, "kv_transfer_bytes_per_token": 1024}}',
        expect=["kv_transfer_bandwidth", "greater than 0"],
    )


# --- router config --------------------------------------------------------------------------

KV = [*SYNTHETIC, "--num-workers", "2", "--router-mode", "kv_router"]


def test_unknown_router_config_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --router-config key is named."""
    _fails(
        tmp_path,
        capsys,
        *KV,
        "--router-config",
        '{"overlap_weight": 2}',
        expect=["'overlap_weight'", "unknown"],
    )


def test_negative_router_temperature(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A temperature below 0 is refused, naming the key and value."""
    _fails(
        tmp_path, capsys, *KV, "--router-config", '{"router_temperature": -0.5}',
        expect=["router_temperature", "-0.5"],
    )  # fmt: skip


def test_unknown_queue_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A queue policy that does not exist is refused with the ones that do."""
    _fails(
        tmp_path, capsys, *KV, "--router-config", '{"router_queue_policy": "sjf"}',
        expect=["router_queue_policy", "'sjf'", "wspt"],
    )  # fmt: skip


def test_router_config_without_the_kv_router(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--router-config only applies to the KV router."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--router-config",
        "{}",
        expect=["--router-config", "kv_router"],
    )


# --- odd inputs found in review ---------------------------------------------------------------


def test_trace_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes that are not UTF-8 are reported with the file, not as a traceback."""
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(json.dumps(GOOD_ROW).encode() + b"\n\xff\xfe\n")
    _fails(tmp_path, capsys, str(trace), expect=[str(trace), "UTF-8"])


def test_negative_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A seed must be a non-negative integer."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--request-rate",
        "5",
        "--seed",
        "-1",
        expect=["--seed", "non-negative"],
    )


def test_report_path_that_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report under a regular file cannot be written: one clean message, exit 2."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["replay", *SYNTHETIC, "--quiet", "--report-json", str(blocker / "report.json")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write" in err and "Traceback" not in err


def test_report_into_an_existing_directory(tmp_path: Path) -> None:
    """As the reference: a directory given as --report-json gets the report inside it."""
    assert main(["replay", *SYNTHETIC, "--quiet", "--report-json", str(tmp_path)]) == 0
    assert "summary" in json.loads((tmp_path / "servesim_report.json").read_text())


def test_prompts_that_can_never_be_served_are_rejected(tmp_path: Path) -> None:
    """Without chunked prefill a prompt over the token budget, and a prompt the decode pool cannot
    hold, end as rejected instead of waiting for ever."""
    report = tmp_path / "r.json"
    runs = [
        ["--extra-engine-args", '{"enable_chunked_prefill": false, "max_num_batched_tokens": 50}'],
        [
            "--num-prefill-workers",
            "1",
            "--num-decode-workers",
            "1",
            "--decode-engine-args",
            '{"num_gpu_blocks": 1}',
        ],
    ]
    for extra in runs:
        assert main(["replay", *SYNTHETIC, "--quiet", "--report-json", str(report), *extra]) == 0
        summary = json.loads(report.read_text())["summary"]
        assert (summary["rejected_requests"], summary["completed_requests"]) == (3, 0)


def test_explicit_session_named_like_an_implicit_one_stays_apart(tmp_path: Path) -> None:
    """A session called "request_2" and the session-less row on line 2 are two sessions."""
    trace = _trace(tmp_path, _row(session_id="request_2"), _row(timestamp=5))
    jsonl = tmp_path / "requests.jsonl"
    assert main(["replay", str(trace), "--quiet", "--per-request-jsonl", str(jsonl)]) == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["arrival_time_ms"], r["turn_index"]) for r in rows] == [(0.0, 0), (5.0, 0)]


@pytest.mark.parametrize(
    ("engine", "expect"),
    [
        ({"backend": "tgi"}, ["'backend'", "'vllm', 'sglang', 'trtllm'", "'tgi'"]),
        (
            {"backend": "vllm", "sglang": {"schedule_policy": "lpm"}},
            ["'sglang' keys", "sglang backend", "'vllm'"],
        ),
        (
            {"backend": "vllm", "trtllm": {}},
            ["'trtllm' keys", "trtllm backend", "'vllm'"],
        ),
        (
            {"backend": "sglang", "block_size": 16, "sglang": {"page_size": 32}},
            ["page_size (32)", "block_size (16)"],
        ),
        (
            {"backend": "sglang", "block_size": 16, "sglang": {"chunked_prefill_size": 1000}},
            ["chunked_prefill_size (1000)", "multiple of block_size (16)"],
        ),
        (
            {
                "backend": "sglang",
                "block_size": 4,
                "dp_size": 4,
                "sglang": {"chunked_prefill_size": 8},
            },
            ["chunked_prefill_size (8)", "dp_size (4)", "each rank 2 tokens", "block_size 4"],
        ),
        (
            {"backend": "sglang", "sglang": {"schedule_policy": "LPM"}},
            ["schedule_policy", "'fifo', 'lpm'", "'LPM'"],
        ),
        (
            {"backend": "sglang", "block_size": 16, "enable_chunked_prefill": False},
            ["enable_chunked_prefill", "sglang"],
        ),
        (
            {"backend": "trtllm", "trtllm": {"capacity_scheduler_policy": "max_utilization"}},
            ["capacity_scheduler_policy", "'guaranteed_no_evict'", "'max_utilization'"],
        ),
        ({"backend": "trtllm", "block_size": 1}, ["block_size must be >= 2", "trtllm"]),
    ],
    ids=[
        "unknown-backend",
        "sglang-keys-on-vllm",
        "trtllm-keys-on-vllm",
        "page-size-not-block-size",
        "chunk-not-whole-pages",
        "chunk-under-a-page-per-dp-rank",
        "policy-case",
        "sglang-without-chunking",
        "trtllm-policy",
        "trtllm-block-size",
    ],
)
def test_backend_keys(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: dict[str, Any],
    expect: list[str],
) -> None:
    """Engine keys that do not fit the chosen backend are refused, naming the key and the rule."""
    _fails(tmp_path, capsys, *SYNTHETIC, "--extra-engine-args", json.dumps(engine), expect=expect)


@pytest.mark.parametrize(
    ("engine", "expect"),
    [
        ({"timing_model": {"type": "fixed", "prefill_ms": 5}}, ["'fixed'", "'decode_ms'"]),
        (
            {"timing_model": {"type": "fixed", "prefill_ms": -1, "decode_ms": 1}},
            ["prefill_ms", ">= 0.0", "-1"],
        ),
        (
            {"timing_model": {"type": "fixed", "prefill_ms": 5, "decode_ms": 1, "x": 2}},
            ["unknown field(s) ['x']", "'fixed'"],
        ),
        (
            {"reasoning": {"start_thinking_token_id": 1, "thinking_ratio": 0.5}},
            ["'reasoning'", "'end_thinking_token_id'"],
        ),
        (
            {
                "reasoning": {
                    "start_thinking_token_id": 1,
                    "end_thinking_token_id": 2,
                    "thinking_ratio": 1.5,
                }
            },
            ["thinking_ratio", "<= 1.0", "1.5"],
        ),
    ],
    ids=["fixed-missing", "fixed-negative", "fixed-unknown", "reasoning-missing", "ratio"],
)
def test_engine_option_values(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: dict[str, Any],
    expect: list[str],
) -> None:
    """Fixed timing and reasoning keys are checked as the reference checks them (stricter on unknown fields)."""
    _fails(tmp_path, capsys, *SYNTHETIC, "--extra-engine-args", json.dumps(engine), expect=expect)


@pytest.mark.parametrize(
    ("engine", "expect"),
    [
        ({"aic_nextn": 6}, ["aic_nextn", "<= 5", "6"]),
        ({"aic_nextn_accept_rates": "0.5"}, ["aic_nextn_accept_rates requires aic_nextn"]),
        ({"aic_nextn": 2, "aic_nextn_accept_rates": "1.5,0.5"}, ["item 0", "[0, 1]", "1.5"]),
        ({"aic_nextn": 2, "aic_nextn_accept_rates": "0.5"}, ["1 rate(s)", "aic_nextn 2"]),
        ({"aic_nextn": 2, "aic_nextn_accept_rates": [0.5, 0.5]}, ["comma-separated string"]),
        ({"aic_nextn": 2, "decode_speedup_ratio": 2}, ["decode_speedup_ratio=1.0"]),
    ],
    ids=["nextn", "rates-alone", "rate-range", "rate-count", "rate-list", "speedup"],
)
def test_speculative_decoding_keys(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: dict[str, Any],
    expect: list[str],
) -> None:
    """Speculative decoding keys: as the reference rejects them, and a wrong rate count too."""
    _fails(tmp_path, capsys, *SYNTHETIC, "--extra-engine-args", json.dumps(engine), expect=expect)


@pytest.mark.parametrize(
    ("engine", "expect"),
    [
        ({"native_host_offload": {"num_host_blocks": 8}}, ["kv_cache_bytes_per_token"]),
        (
            {
                "backend": "trtllm",
                "kv_cache_bytes_per_token": 2,
                "native_host_offload": {"num_host_blocks": 8},
            },
            ["only for the vllm backend", "trtllm"],
        ),
        (
            {"g3_offload": {"scope": "worker_local", "num_g3_blocks": 8}},
            ["g3_offload requires native_host_offload"],
        ),
        (
            {"kv_cache_bytes_per_token": 2, "native_host_offload": {"num_host_block": 8}},
            ["num_host_block", "did you mean 'num_host_blocks'"],
        ),
    ],
    ids=["no-bytes", "trtllm", "disk-alone", "typo"],
)
def test_offload_keys(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: dict[str, Any],
    expect: list[str],
) -> None:
    """Offload tiers: rejected where the reference rejects them, typos named."""
    _fails(tmp_path, capsys, *SYNTHETIC, "--extra-engine-args", json.dumps(engine), expect=expect)


def test_kv_event_lag_needs_the_kv_router(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lag delays what the KV router's index sees: with round robin it is an error."""
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--kv-event-lag-ms",
        "100",
        expect=["--kv-event-lag-ms", "kv_router"],
    )


def test_negative_kv_event_lag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(
        tmp_path,
        capsys,
        *SYNTHETIC,
        "--router-mode",
        "kv_router",
        "--kv-event-lag-ms",
        "-1",
        expect=["--kv-event-lag-ms", "-1"],
    )


# ----- trace formats (issue 12): the reference's rules, one message each -----

FORMATS = Path(__file__).resolve().parent / "data" / "replay_formats"
V2_HEADER = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 4}


def _node(rid: str, *parents: str) -> dict[str, Any]:
    return {
        "request_id": rid,
        "play_id": "p",
        "input_length": 4,
        "output_length": 2,
        "hash_ids": [1],
        "dependencies": [{"request_id": p, "trigger": "completion"} for p in parents],
    }


def test_v1_agentic_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A v1 agentic file (rows, no header) fails on line 1, as the reference's loader does."""
    trace = _trace(tmp_path, {**GOOD_ROW, "request_id": "a"})
    _fails(
        tmp_path,
        capsys,
        str(trace),
        *("--trace-format", "agentic_mooncake", "--execution-model", "m"),
        expect=[f"{trace}:1: failed to parse line 1 as the agentic Mooncake v2 header", "v1"],
    )


def test_agentic_with_replay_concurrency_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Agentic traces replay on their own schedule."""
    _fails(
        tmp_path,
        capsys,
        str(FORMATS / "agentic-mooncake.jsonl"),
        *("--trace-format", "agentic_mooncake", "--execution-model", "m"),
        *("--replay-concurrency", "2"),
        expect=["--replay-concurrency does not apply", "--agentic-lanes"],
    )


def test_agentic_without_execution_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent Dynamo trace needs the target model, as an agentic Mooncake one does."""
    _fails(
        tmp_path,
        capsys,
        str(FORMATS / "dynamo-agentic.jsonl"),
        *("--trace-format", "dynamo"),
        expect=["agentic execution requires a configured target model", "--execution-model"],
    )


def test_applied_compute_without_concurrency_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its sessions carry no first-turn timestamps, so only closed loop can replay them."""
    _fails(
        tmp_path,
        capsys,
        str(FORMATS / "applied-compute-agentic.jsonl"),
        *("--trace-format", "applied_compute_agentic"),
        expect=[
            "--trace-format=applied_compute_agentic requires --replay-concurrency",
            "first-turn timestamps",
        ],
    )


def test_trace_block_size_disagreeing_with_dynamo_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The records say 4 tokens per hash; the flag may not say otherwise."""
    _fails(
        tmp_path,
        capsys,
        str(FORMATS / "dynamo-standard.jsonl"),
        *("--trace-format", "dynamo", "--trace-block-size", "512"),
        expect=[
            "trace_block_size 512 does not match embedded Dynamo request trace block size 4",
            "dynamo-standard.jsonl:2",
        ],
    )


def test_dynamo_shards_with_different_block_sizes_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every shard of one trace has one block size."""
    other = tmp_path / "other.jsonl"
    other.write_text(
        (FORMATS / "dynamo-standard.jsonl")
        .read_text()
        .replace('"trace_block_size":4', '"trace_block_size":8')
    )
    _fails(
        tmp_path,
        capsys,
        str(FORMATS / "dynamo-standard.jsonl"),
        str(other),
        *("--trace-format", "dynamo"),
        expect=[f"{other}:2: trace block size 8 differs from 4", "all shards must share one"],
    )


@pytest.mark.parametrize(
    ("rows", "expect"),
    [
        ([_node("a", "b"), _node("b", "a")], ":2: request 'a' is on a dependency cycle"),
        ([_node("a"), _node("b", "ghost")], ":3: request 'b' depends on unknown request 'ghost'"),
        ([_node("a"), _node("a")], ":3: duplicate request_id 'a'"),
    ],
    ids=["cycle", "dangling", "duplicate"],
)
def test_bad_agentic_graph_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: list[dict[str, Any]], expect: str
) -> None:
    """A graph that could never finish (or is ambiguous) names the line and request."""
    trace = _trace(tmp_path, V2_HEADER, *rows)
    _fails(
        tmp_path,
        capsys,
        str(trace),
        *("--trace-format", "agentic_mooncake", "--execution-model", "m"),
        expect=[f"{trace}{expect}"],
    )


def test_unknown_trace_format_suggests_the_closest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt format lists the formats and the nearest one."""
    code, err = _run(
        tmp_path, capsys, str(FORMATS / "mooncake.jsonl"), "--trace-format", "mooncake_delt"
    )
    assert code == 2
    assert "unknown trace format 'mooncake_delt'" in err
    assert "did you mean 'mooncake-delta'?" in err


def test_dynamo_trace_mixing_agent_context_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Requests with and without agent_context in one trace: the reference refuses it too."""
    lines = (FORMATS / "dynamo-agentic.jsonl").read_text().splitlines()
    plain = (FORMATS / "dynamo-standard.jsonl").read_text().splitlines()[1]
    trace = tmp_path / "mixed.jsonl"
    trace.write_text("\n".join([*lines, plain]) + "\n")
    _fails(
        tmp_path,
        capsys,
        str(trace),
        *("--trace-format", "dynamo", "--execution-model", "m"),
        expect=[
            f"{trace}:6: Dynamo request trace cannot mix requests with and without agent_context",
            f"{trace}:1 has one",
        ],
    )


def test_sglang_decode_engine_may_chunk_under_a_page() -> None:
    """A decode rank prefills nothing: the reference runs one whose chunk share is under a
    page (it refuses only a share of 0), so servesim accepts it there, and only there."""
    from servesim.config import Role, parse_engine_args
    from servesim.errors import ConfigError

    engine = {
        "backend": "sglang",
        "block_size": 8,
        "dp_size": 2,
        "sglang": {"chunked_prefill_size": 8},
    }
    config = parse_engine_args(engine, source="--decode-engine-args", role=Role.DECODE)
    assert config.sglang is not None and config.sglang.chunked_prefill_size == 8
    with pytest.raises(ConfigError, match="each rank 4 tokens"):
        parse_engine_args(engine, source="--prefill-engine-args", role=Role.PREFILL)
    zero = {**engine, "block_size": 1, "sglang": {"chunked_prefill_size": 1}}
    with pytest.raises(ConfigError, match="each rank 0 tokens"):
        parse_engine_args(zero, source="--decode-engine-args", role=Role.DECODE)
