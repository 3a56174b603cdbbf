"""AIC timing: AIConfigurator's database prices passes, memoised on a grid within 1%."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from servesim import ConfigError, parse_engine_args
from servesim.aic import AicSpec, compile_engine, kv_memory
from servesim.cli import main
from servesim.engine.timing import AicTiming, make_timing
from servesim.metrics.collector import RequestRecord
from tests.support import replay_synthetic

LLAMA_8B = "meta-llama/Meta-Llama-3.1-8B"
AIC = {"type": "aic", "system": "h200_sxm", "model": LLAMA_8B}
SPEC = AicSpec(system="h200_sxm", backend="vllm", model=LLAMA_8B)


@pytest.fixture(scope="module")
def engine() -> object:
    return compile_engine(SPEC)


def test_a_pass_is_priced_as_aic_prices_it_at_grid_nodes(engine: object) -> None:
    """At grid nodes the price is AIC's own: prefill with the cached prefix, one decode step."""
    timing = AicTiming(engine, 1.0, 1.0)
    assert timing.prefill_ms(2, 1000, 0) == engine.predict_prefill_latency(2, 1000, 0)  # type: ignore[attr-defined]
    assert timing.prefill_ms(1, 3000, 1024) == engine.predict_prefill_latency(1, 3000, 1024)  # type: ignore[attr-defined]
    assert timing.prefill_ms(1, 3000, 3000) == 0.0
    assert timing.decode_ms(64, 0, 1024) == engine.predict_decode_latency(64, 1024, 2)  # type: ignore[attr-defined]
    assert timing.decode_ms(0, 0, 1024) == 0.0


def test_bucketing_stays_within_one_percent_of_aic(engine: object) -> None:
    """Random shapes, each priced by the memoised grid and by AIC directly (measured
    largest errors on this engine: decode 0.79%, prefill 0.33% over three engines)."""
    timing = AicTiming(engine, 1.0, 1.0)
    rng = np.random.default_rng(7)
    worst_decode = worst_prefill = 0.0
    for _ in range(1500):
        batch, context = int(rng.integers(1, 257)), int(np.exp(rng.uniform(0, np.log(130_000))))
        direct = max(engine.predict_decode_latency(batch, context, 2), 1.0)  # type: ignore[attr-defined]
        worst_decode = max(worst_decode, abs(timing.decode_ms(batch, 0, context) / direct - 1))
        batch, new = int(rng.integers(1, 9)), int(np.exp(rng.uniform(0, np.log(16_384))))
        prefix = int(np.exp(rng.uniform(0, np.log(100_000))))
        direct = engine.predict_prefill_latency(batch, new + prefix, prefix)  # type: ignore[attr-defined]
        worst_prefill = max(
            worst_prefill, abs(timing.prefill_ms(batch, new + prefix, prefix) / direct - 1)
        )
    assert worst_decode < 0.01
    assert worst_prefill < 0.01


@pytest.mark.parametrize(
    ("batch", "first_total", "passes"),
    [(1, 5, 300), (7, 7 * 4090, 900), (64, 64 * 65_530, 2000), (3, 3 * 200_000 + 2, 50)],
)
def test_a_decode_series_is_decode_ms_to_the_last_bit(
    engine: object, batch: int, first_total: int, passes: int
) -> None:
    """Fast-forward windows price many steps at once; each equals the per-pass price exactly."""
    timing = AicTiming(engine, 1.0, 1.0)
    series = timing.decode_series(batch, first_total, passes)
    one_by_one = [
        timing.decode_ms(batch, t, t // batch)
        for t in range(first_total, first_total + passes * batch, batch)
    ]
    assert series.tolist() == one_by_one


def test_fast_forward_is_exact_with_aic_timing() -> None:
    """A replay that fast-forwards decode windows reports what stepping pass by pass does."""
    engine_args = {"timing_model": AIC, "max_num_seqs": 32}
    windows = replay_synthetic(3000, 400, 80, engine_args)
    passes = replay_synthetic(3000, 400, 80, engine_args, exact_passes=True)
    assert len(windows.records) == len(passes.records) == 80
    for fast, exact in zip(windows.records, passes.records, strict=True):
        for name in RequestRecord.__slots__:
            a, b = getattr(fast, name), getattr(exact, name)
            if isinstance(a, float) and isinstance(b, float):
                # Window ends are sums of durations, the passes' a running total.
                assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9), (name, a, b)
            else:
                assert a == b, (name, a, b)


def test_workers_share_one_compiled_engine() -> None:
    config = parse_engine_args({"timing_model": AIC, "dp_size": 2})
    assert make_timing(config) is make_timing(config)


def test_memory_is_derived_from_the_model() -> None:
    """Llama-3.1-8B: 32 layers x 8 KV heads x 128 dims x K and V x 2 bytes = 131,072 bytes a
    token; TP 2 holds half the heads per GPU. Blocks are the KV budget over the block size."""
    config = parse_engine_args({"timing_model": AIC})
    memory = kv_memory(SPEC, block_size=64, fraction=0.9, max_num_tokens=8192, max_batch_size=256)
    assert config.kv_cache_bytes_per_token == memory.kv_bytes_per_token == 131_072
    assert (
        config.num_gpu_blocks == memory.num_gpu_blocks == memory.kv_budget_bytes // (64 * 131_072)
    )
    tp2 = parse_engine_args({"timing_model": {**AIC, "tp_size": 2}})
    assert tp2.kv_cache_bytes_per_token == 65_536
    assert tp2.tensor_parallel_size == 2
    assert tp2.num_gpu_blocks > 2 * config.num_gpu_blocks  # half the weights per GPU, too
    less = parse_engine_args({"timing_model": AIC, "gpu_memory_utilization": 0.5})
    assert less.num_gpu_blocks < config.num_gpu_blocks
    given = parse_engine_args(
        {"timing_model": AIC, "num_gpu_blocks": 100, "kv_cache_bytes_per_token": 7}
    )
    assert (given.num_gpu_blocks, given.kv_cache_bytes_per_token) == (100, 7)


@pytest.mark.parametrize(
    ("timing", "expect"),
    [
        ({**AIC, "system": "h999"}, ["AIC has no system 'h999'", "h200_sxm", "b200_sxm"]),
        ({**AIC, "model": "acme/None-1B"}, ["AIC has no model 'acme/None-1B'", LLAMA_8B]),
        ({**AIC, "backend_version": "0.0.1"}, ["no vllm version '0.0.1'", "0.24.0"]),
        ({"type": "aic", "system": "h200_sxm"}, ["'aic' needs 'model'"]),
        ({**AIC, "tp": 2}, ["unknown field(s) ['tp']", "tp_size"]),
        ({"profile": "a100-nothing"}, ["unknown profile 'a100-nothing'", "h200-llama3.1-8b-fp8"]),
    ],
)
def test_bad_aic_input_exits_2_naming_what_the_database_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], timing: dict[str, object], expect: list[str]
) -> None:
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
    for text in expect:
        assert text in err, f"{text!r} not in {err!r}"


def test_without_the_extra_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # import fails
    with pytest.raises(ConfigError, match=r"pip install 'servesim\[aic\]'"):
        parse_engine_args({"timing_model": {**AIC, "system": "b200_sxm"}})
    code = main(
        [
            "replay",
            *("--input-tokens", "100", "--output-tokens", "5", "--request-count", "3"),
            *("--arrival-interval-ms", "0"),
            *("--extra-engine-args", json.dumps({"timing_model": {**AIC, "system": "gb200"}})),
        ]
    )
    assert code == 2
    assert "pip install 'servesim[aic]'" in capsys.readouterr().err
    assert main(["timing", "list"]) == 0
    assert "not available: AIC timing needs" in capsys.readouterr().out


def test_timing_list_shows_presets_and_the_database(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timing", "list"]) == 0
    out = capsys.readouterr().out
    assert "h200-llama3.1-8b-fp8" in out
    assert "h200_sxm" in out and "vllm (0.24.0" in out
    assert LLAMA_8B in out
