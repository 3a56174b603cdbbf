"""Shipped profile presets reproduce their measurements; malformed profiles are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servesim import parse_engine_args
from servesim.cli import main
from servesim.engine.timing import InterpolatedTiming, make_timing

# Dynamo's measured points, copied from the ai-dynamo 1.6.1 wheel (tests/data/README.md).
H200 = Path(__file__).resolve().parents[1] / "data" / "h200_tp1p_tp1d"


def preset() -> InterpolatedTiming:
    config = parse_engine_args({"timing_model": {"profile": "h200-llama3.1-8b-fp8"}})
    timing = make_timing(config)
    assert isinstance(timing, InterpolatedTiming)
    return timing


def test_the_h200_preset_reproduces_every_measured_point() -> None:
    """17 prefill points exactly; 41 decode points at their KV token count (rounded to a
    whole token, as the schedulers give it) and context: largest error 2e-7 relative."""
    timing = preset()
    with np.load(H200 / "prefill_raw_data.npz") as prefill:
        for isl, ttft in zip(prefill["prefill_isl"], prefill["prefill_ttft"], strict=True):
            assert timing.prefill_ms(1, int(isl), 0) == pytest.approx(float(ttft), rel=1e-12)
    with np.load(H200 / "decode_raw_data.npz") as decode:
        capacity = float(np.ravel(decode["max_kv_tokens"])[0])
        points = zip(decode["x_kv_usage"], decode["y_context_length"], decode["z_itl"], strict=True)
        errors = [
            abs(timing.decode_ms(1, round(usage * capacity), int(context)) / itl - 1)
            for usage, context, itl in points
        ]
    assert len(errors) == 41
    assert max(errors) < 2e-7


def test_a_preset_replays() -> None:
    """The preset is a timing model like any other (its first TTFT is the measured prefill
    time at that ISL plus one decode step)."""
    timing = preset()
    assert timing.prefill_ms(1, 1117, 0) == pytest.approx(38.494131, rel=1e-9)
    code = main(
        [
            "replay",
            "--quiet",
            *("--input-tokens", "1117", "--output-tokens", "4", "--request-count", "2"),
            *("--arrival-interval-ms", "1000"),
            *(
                "--extra-engine-args",
                json.dumps({"timing_model": {"profile": "h200-llama3.1-8b-fp8"}}),
            ),
        ]
    )
    assert code == 0


def write(path: Path, **arrays: object) -> Path:
    good: dict[str, object] = {
        "prefill_isl": [1.0, 100.0],
        "prefill_ttft_ms": [5.0, 50.0],
        "decode_active_kv_tokens": [0.0, 1e6],
        "decode_context_length": [1.0, 1e5],
        "decode_itl": np.full((2, 2), 5.0),
    }
    good.update(arrays)
    np.savez(path, **{k: v for k, v in good.items() if v is not None})  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize(
    ("arrays", "expect"),
    [
        ({"decode_itl": None}, ["missing array(s) decode_itl"]),
        (
            {"prefill_ttft_ms": [5.0, 50.0, 70.0]},
            ["prefill_isl and prefill_ttft_ms", "(2,) and (3,)"],
        ),
        ({"decode_itl": np.ones((3, 2))}, ["decode_itl has shape (3, 2), expected (2, 2)"]),
        (
            {"decode_context_length": [5.0, 5.0]},
            ["decode_context_length must be strictly increasing", "point 1 (5) follows 5"],
        ),
        ({"prefill_isl": [100.0, 1.0]}, ["prefill_isl must be strictly increasing"]),
        (
            {"decode_active_kv_tokens": [0.0], "decode_itl": np.ones((1, 2))},
            ["decode_active_kv_tokens must be a 1-D array of at least 2 points"],
        ),
        ({"prefill_ttft_ms": [5.0, float("nan")]}, ["prefill_ttft_ms holds a NaN"]),
    ],
)
def test_a_malformed_profile_exits_2_naming_the_array(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arrays: dict[str, object], expect: list[str]
) -> None:
    path = write(tmp_path / "bad.npz", **arrays)
    timing = {"type": "interpolated", "path": str(path)}
    code = main(
        [
            "replay",
            *("--input-tokens", "100", "--output-tokens", "5", "--request-count", "3"),
            *("--arrival-interval-ms", "0"),
            *("--extra-engine-args", json.dumps({"timing_model": timing})),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert err.count("servesim: error:") == 1
    for text in expect:
        assert text in err, f"{text!r} not in {err!r}"
