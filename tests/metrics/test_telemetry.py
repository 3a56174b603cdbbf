"""Telemetry samples, pinned on reference probes, and the promise that sampling changes nothing.

The narrative cases are tiny runs under fixed timing (``prefill_ms`` 10 and
``decode_ms`` 1 or 3 per pass) whose every sample the reference (Dynamo
1.6.1) reported with a 1 ms interval; the values below are its values.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.cli import main
from servesim.config import Role
from servesim.metrics.report import request_row
from servesim.simulation import Report
from tests.scenarios.harness import flatten_all

FIXED = {"type": "fixed", "prefill_ms": 10, "decode_ms": 1}


def _run(
    *,
    inputs: int = 1000,
    outputs: int = 10,
    count: int = 2,
    interval: float = 2.0,
    engine: dict[str, Any] | None = None,
    telemetry: float | None = 1.0,
    synthetic_extra: dict[str, Any] | None = None,
    **kw: Any,
) -> Report:
    return run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=inputs,
                output_tokens=outputs,
                request_count=count,
                arrival_interval_ms=interval,
                **(synthetic_extra or {}),
            ),
            engine=parse_engine_args({"block_size": 64, "timing_model": FIXED, **(engine or {})}),
            telemetry_interval_ms=telemetry,
            **kw,
        )
    )


def _gauges(sample: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    return [
        (m["active_blocks"], m["inactive_blocks"], m["running_requests"], m["waiting_requests"])
        for m in sample["decode_scheduler_metrics"]
    ]


def test_gauges_are_published_at_submits_and_pass_ends_only() -> None:
    """Two requests (at 0 and 2 ms) on one worker: passes 0-10 (prefill), 10-21 (the second's
    prefill with the first's decode), then 1 ms decode passes to 29 and 30.

    A pass start publishes nothing: at 0 and 1 the first request still shows
    waiting, and from 10 to 20 the second does, although both passes admitted
    them at their start. The submit at 2 publishes the state after the first
    pass's start (running, 16 blocks); the pass end at 21 the state with both.
    """
    samples = _run().sections["telemetry"]["samples"]
    assert [s["sampled_at_ms"] for s in samples] == [float(t) for t in range(31)]
    # The run ends at 30, a sample time: the final sample would be empty and is not taken.
    assert [s["kind"] for s in samples] == ["baseline", *["periodic"] * 30]
    gauges = [_gauges(s)[0] for s in samples]
    assert gauges[:2] == [(0, 0, 0, 1)] * 2
    assert gauges[2:21] == [(16, 0, 1, 1)] * 19
    assert gauges[21:29] == [(32, 0, 2, 0)] * 8
    assert gauges[29] == (16, 15, 1, 0)  # the first ended at 29: 15 full blocks stay cached
    assert gauges[30] == (0, 30, 0, 0)
    arrivals = [s["traffic"]["arriving_requests"] for s in samples]
    assert arrivals[:3] == [0, 1, 1] and sum(arrivals) == 2  # time 0's arrival opens interval 1
    # Decode request-forwards at their pass ends: the first's decode in 10-21, then both.
    forwards = [s["traffic"]["accept_length_forward_count"] for s in samples]
    assert forwards == [0] * 21 + [1] + [2] * 7 + [2, 1]
    final = samples[-1]["traffic"]
    assert final["completed_requests"] == 1 and final["avg_ttft_ms"] == 19.0
    assert final["avg_itl_ms"] == 1.0 and final["avg_accept_length"] == 1.0
    assert samples[29]["traffic"]["avg_itl_ms"] == 19.0 / 9  # the first: tokens at 10, 21..29
    assert samples[0]["traffic"]["avg_accept_length"] is None


def test_accept_length_counts_a_speculative_step_in_full() -> None:
    """MTP with two drafts always accepted, 10 tokens: the prefill pass (0-13) emits the first
    burst (no decode forward), then bursts of 3 at 16, 19 and 22, the last cut to one token by
    the output length. The reference counts every forward's accepted length: 3.0 each time."""
    samples = _run(
        count=1,
        engine={
            "timing_model": {**FIXED, "decode_ms": 3},
            "aic_nextn": 2,
            "aic_nextn_accept_rates": "1.0,1.0",
        },
    ).sections["telemetry"]["samples"]
    counted = [
        (s["sampled_at_ms"], s["traffic"]["avg_accept_length"])
        for s in samples
        if s["traffic"]["accept_length_forward_count"]
    ]
    assert counted == [(16.0, 3.0), (19.0, 3.0), (22.0, 3.0)]


def _pressure(**kw: Any) -> Report:
    """Preemptions (a small KV cache), prefix sharing, closed loop, two DP ranks a worker."""
    return run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=1024,
                output_tokens=120,
                request_count=40,
                shared_prefix_ratio=0.5,
                num_prefix_groups=2,
            ),
            replay_concurrency=12,
            num_workers=2,
            engine=parse_engine_args({"block_size": 64, "num_gpu_blocks": 40, "dp_size": 2}),
            **kw,
        )
    )


def _disagg(**kw: Any) -> Report:
    engine = {"block_size": 64}
    return run(
        RunConfig(
            synthetic=SyntheticWorkload(input_tokens=2048, output_tokens=64, request_count=60),
            replay_concurrency=16,
            prefill_engine=parse_engine_args(engine, role=Role.PREFILL),
            decode_engine=parse_engine_args(engine, role=Role.DECODE),
            num_prefill_workers=2,
            num_decode_workers=3,
            **kw,
        )
    )


# Means over every token gap: a window split at a sample time feeds its rank's gaps in the
# same order (they fold by position, see TokenGaps), but ranks' windows then end at other
# times and interleave their gaps otherwise, which moves the moments in their last bit
# (measured: 1.4e-16 relative, one rank's runs identical).
GAP_MEANS = ("itl_ms", "output_token_throughput_per_user")
HOST_SPEED = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")


@pytest.mark.parametrize("replay", [_pressure, _disagg], ids=["pressure", "disagg"])
def test_sampling_changes_no_other_output(replay: Any) -> None:
    """Every request record is identical with telemetry on; every summary value too, but for
    the host's speed and the token-gap means and deviations (1e-15 relative)."""
    plain, sampled = replay(), replay(telemetry_interval_ms=50.0)
    assert len(sampled.sections["telemetry"]["samples"]) > 10
    assert [request_row(r) for r in plain.records] == [request_row(r) for r in sampled.records]
    assert plain.summary.keys() == sampled.summary.keys()
    for key, value in plain.summary.items():
        if key in HOST_SPEED:
            continue
        if any(key.endswith(m) for m in GAP_MEANS):
            assert math.isclose(sampled.summary[key], value, rel_tol=1e-15), key
        else:
            assert sampled.summary[key] == value, key


@pytest.mark.parametrize("replay", [_pressure, _disagg], ids=["pressure", "disagg"])
def test_fast_forward_samples_what_stepping_samples(replay: Any) -> None:
    """Fast-forward windows split at sample times: every sample equals the stepped run's."""
    fast = flatten_all(replay(telemetry_interval_ms=50.0).sections["telemetry"])
    exact = flatten_all(replay(telemetry_interval_ms=50.0, exact_passes=True).sections["telemetry"])
    assert fast.keys() == exact.keys()
    for key, value in exact.items():
        if isinstance(value, float):
            assert math.isclose(fast[key], value, rel_tol=0, abs_tol=1e-9), key
        else:
            assert fast[key] == value, key


def test_pressure_samples_count_preemptions_and_list_every_rank() -> None:
    """Two workers of two ranks: four gauge rows a sample; the interval preemptions add up to
    the ranks' total, and the last sample shows nothing running or waiting."""
    samples = _pressure(telemetry_interval_ms=50.0).sections["telemetry"]["samples"]
    rows = samples[1]["decode_scheduler_metrics"]
    assert [(m["worker_id"], m["dp_rank"]) for m in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (
        samples[1]["active_decode_ids"] == [0, 1] and samples[1]["prefill_scheduler_metrics"] == []
    )
    preemptions = sum(s["decode_interval_metrics"]["preemptions"] for s in samples)
    assert preemptions > 0
    assert all(m["running_requests"] == m["waiting_requests"] == 0 for m in _rows(samples[-1]))
    assert sum(s["traffic"]["completed_requests"] for s in samples) == 40


def _rows(sample: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = sample["decode_scheduler_metrics"]
    return rows


def test_no_telemetry_no_section() -> None:
    """Without an interval the report has no telemetry section (only its provenance)."""
    assert set(_run(telemetry=None).sections) == {"provenance"}


def test_cli_writes_the_section_and_the_jsonl(tmp_path: Path) -> None:
    """``--telemetry-jsonl`` holds the report's samples, one a line."""
    report, samples = tmp_path / "report.json", tmp_path / "samples.jsonl"
    argv = [
        *("replay", "--input-tokens", "100", "--output-tokens", "5", "--request-count", "3"),
        *("--arrival-interval-ms", "10", "--telemetry-interval-ms", "7.5"),
        *("--report-json", str(report), "--telemetry-jsonl", str(samples), "--quiet"),
    ]
    assert main(argv) == 0
    section = json.loads(report.read_text())["telemetry"]
    assert section["sample_interval_ms"] == 7.5
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert lines == section["samples"] and lines[0]["kind"] == "baseline"


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "x"])
def test_a_bad_interval_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A non-positive or non-finite interval: exit 2 with a message naming the flag."""
    argv = ["replay", "--input-tokens", "100", "--output-tokens", "5", "--request-count", "1"]
    argv += ["--arrival-interval-ms", "1", f"--telemetry-interval-ms={value}", "--quiet"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--telemetry-interval-ms" in capsys.readouterr().err


def test_jsonl_needs_an_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--telemetry-jsonl`` alone: exit 2, naming both flags."""
    argv = ["replay", "--input-tokens", "100", "--output-tokens", "5", "--request-count", "1"]
    argv += ["--arrival-interval-ms", "1", "--telemetry-jsonl", str(tmp_path / "t.jsonl")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--telemetry-jsonl needs --telemetry-interval-ms" in err


def test_sglang_counts_prefill_chunks_and_keeps_tree_pages_active() -> None:
    """SGLang, four 1,024-token prompts 20 ms apart sharing their first half, 16-token pages,
    sampled every 5 ms: each prefill pass (10 ms) reports its prompt's 1,024 tokens at
    its end, the later ones 512 of them as cache hits; a finished request's pages stay in the
    radix tree and count as active (64 pages, then 32 more a request: its unshared half)."""
    samples = _run(
        inputs=1024,
        count=4,
        interval=20.0,
        outputs=4,
        telemetry=5.0,
        engine={"backend": "sglang", "block_size": 16},
        synthetic_extra={"shared_prefix_ratio": 0.5, "num_prefix_groups": 1},
    ).sections["telemetry"]["samples"]
    cache = {
        s["sampled_at_ms"]: (
            s["decode_interval_metrics"]["cache_hit_tokens"],
            s["decode_interval_metrics"]["cache_total_tokens"],
        )
        for s in samples
        if s["decode_interval_metrics"]["cache_total_tokens"]
    }
    assert cache == {10.0: (0, 1024), 30.0: (512, 1024), 50.0: (512, 1024), 70.0: (512, 1024)}
    active = {s["sampled_at_ms"]: _gauges(s)[0] for s in samples}
    assert active[15.0] == (64, 0, 0, 0) and active[35.0] == (96, 0, 0, 0)
    assert active[30.0] == (97, 0, 1, 0)  # 64 + 32 pages of its own + one for its output
