"""The summary's rules, pinned to numbers from the reference (Dynamo 1.6.1).

Goodput under SLAs (which requests count, at the boundaries, and the keys it
adds), the percentile rule (the sorted value at index round-half-up((n - 1)
* p / 100)) and the population standard deviation, checked twice: on the
summary of small crafted runs against the reference's summary of the same
runs, and on :mod:`servesim.metrics.stats` directly with hand computations.

Reference numbers come from ``refcheck.py reference`` on the same traces (one
worker, ``{"block_size": 64}``). servesim's token times can sit 1 ns off the
reference's (docs/reference-differences.md), so times are compared to 1e-6 ms
(to 1e-9 relative for rates); the rules themselves are checked exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim import EngineConfig, Report, RunConfig, Sla, run
from servesim.metrics.collector import RequestRecord, latencies
from servesim.metrics.stats import STAT_NAMES, GapSketch, describe, rank
from tests.support import write_trace

NS = 1e-6  # one nanosecond, in ms

# ----- goodput -----

# (timestamp, input, output, hash ids): five requests one worker serves one at a
# time, except the last two, which overlap.
GOODPUT_ROWS = [
    (0, 1000, 10, [1, 2]),
    (1000, 3000, 5, [3, 4, 5, 6, 7, 8]),
    (2000, 200, 1, [9]),
    (3000, 500, 40, [10]),
    (3001, 2000, 20, [11, 12, 13, 14]),
]
# The reference's per-request latencies on that trace: (TTFT, E2E, avg ITL = (e2e - ttft) / (osl - 1)).
GOODPUT_REFERENCE = [
    (32.105859, 84.231535, 5.791741777777776),
    (65.8407299999999, 89.41849700000012, 5.894441750000055),
    (19.554947999999968, 19.554947999999968, None),  # one token: no ITL
    (24.198390000000018, 299.6194010000004, 7.062077205128214),
    (77.51648599999999, 189.04083899999978, 5.869702789473673),
]
GOODPUT_REFERENCE_DURATION_MS = 3299.6194010000004
GOODPUT_KEYS = {
    "goodput_completed_requests",
    "goodput_request_throughput_rps",
    "goodput_output_throughput_tok_s",
}


@pytest.fixture(scope="module")
def goodput_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("goodput") / "trace.jsonl", GOODPUT_ROWS)


def replay(trace: Path, sla: Sla | None = None, **config: Any) -> Report:
    return run(
        RunConfig(trace=trace, engine=EngineConfig(block_size=64), sla=sla or Sla(), **config)
    )


def avg_itl(record: RequestRecord) -> float:
    lat = latencies(record)
    assert lat.ttft is not None and lat.e2e is not None
    return (lat.e2e - lat.ttft) / (record.output_length - 1)


def test_goodput_run_reproduces_the_reference_latencies(goodput_trace: Path) -> None:
    """The SLA boundaries below are these requests' own latencies, which are the reference's."""
    report = replay(goodput_trace)
    records = sorted(report.records, key=lambda r: r.arrival_time_ms)
    for record, (ttft, e2e, itl) in zip(records, GOODPUT_REFERENCE, strict=True):
        lat = latencies(record)
        assert lat.ttft == pytest.approx(ttft, abs=NS)
        assert lat.e2e == pytest.approx(e2e, abs=NS)
        if itl is None:
            assert record.output_length == 1
        else:
            assert avg_itl(record) == pytest.approx(itl, abs=NS)
    assert report.summary["duration_ms"] == pytest.approx(GOODPUT_REFERENCE_DURATION_MS, abs=NS)


def test_goodput_keys_appear_only_under_an_sla(goodput_trace: Path) -> None:
    """Without any SLA flag the summary has no goodput key; with one, exactly the three."""
    plain = replay(goodput_trace).summary
    assert not {k for k in plain if "goodput" in k}
    with_sla = replay(goodput_trace, Sla(e2e_ms=100.0)).summary
    assert {k for k in with_sla if "goodput" in k} == GOODPUT_KEYS


# Which requests are good, per SLA, as the reference counts them. "r1" is an
# SLA bound set to request 1's own latency: a bound holds with <=.
#   (bounds, good count, their output tokens, the reference's goodput rps and tok/s)
GOODPUT_CASES = {
    # r0 good; r1 on both boundaries, good; r2 has one token, its ITL bound is skipped;
    # r3's ITL 7.06 and r4's TTFT 77.5 are over.
    "ttft_and_itl_at_r1": (
        ("r1", "r1", None),
        3,
        10 + 5 + 1,
        0.9091957693941319,
        4.849044103435371,
    ),
    # E2E alone, at r1's: r0 84.2, r1 on the boundary, r2 19.6; r3 and r4 are over.
    "e2e_at_r1": ((None, None, "r1"), 3, 10 + 5 + 1, 0.9091957693941319, 4.849044103435371),
    # TTFT alone: only r4 (77.5 ms) is over.
    "ttft_at_r1": (("r1", None, None), 4, 10 + 5 + 1 + 40, 1.2122610258588427, 16.971654362023795),
    # ITL alone at r1's: r3 (7.06) is over; r2's single token is good.
    "itl_at_r1": ((None, "r1", None), 4, 10 + 5 + 1 + 20, 1.2122610258588427, 10.910349232729583),
    # ITL 7.0: r3's (e2e - ttft) / (40 - 1) = 7.062 is over, though / 40 would be 6.885.
    "itl_7": ((None, 7.0, None), 4, 10 + 5 + 1 + 20, 1.2122610258588427, 10.910349232729583),
}


@pytest.mark.parametrize("case", GOODPUT_CASES)
def test_goodput_counts_the_requests_the_reference_counts(goodput_trace: Path, case: str) -> None:
    """Every set bound must hold with <=, ITL is (e2e - ttft) / (osl - 1) and skipped for one token."""
    bounds, good, good_tokens, ref_rps, ref_tok_s = GOODPUT_CASES[case]
    records = sorted(replay(goodput_trace).records, key=lambda r: r.arrival_time_ms)
    r1 = latencies(records[1])
    own = (r1.ttft, avg_itl(records[1]), r1.e2e)
    ttft, itl, e2e = (own[i] if b == "r1" else b for i, b in enumerate(bounds))
    assert ttft is None or isinstance(ttft, float)
    assert itl is None or isinstance(itl, float)
    assert e2e is None or isinstance(e2e, float)
    summary = replay(goodput_trace, Sla(ttft_ms=ttft, itl_ms=itl, e2e_ms=e2e)).summary
    seconds = summary["duration_ms"] / 1000.0
    assert summary["goodput_completed_requests"] == good
    assert summary["goodput_request_throughput_rps"] == good / seconds
    assert summary["goodput_output_throughput_tok_s"] == good_tokens / seconds
    assert summary["goodput_request_throughput_rps"] == pytest.approx(ref_rps, rel=1e-9)
    assert summary["goodput_output_throughput_tok_s"] == pytest.approx(ref_tok_s, rel=1e-9)


def test_an_e2e_sla_combines_with_ttft(goodput_trace: Path) -> None:
    """servesim takes an E2E bound together with TTFT/ITL bounds; a request must meet them all.

    (The reference refuses the combination: "sla.e2e_ms is mutually exclusive
    with sla.ttft_ms/itl_ms"; see docs/reference-differences.md.) TTFT at r1's
    alone keeps r0..r3; E2E at r1's alone keeps r0..r2; together, r0..r2.
    """
    records = sorted(replay(goodput_trace).records, key=lambda r: r.arrival_time_ms)
    r1 = latencies(records[1])
    summary = replay(goodput_trace, Sla(ttft_ms=r1.ttft, e2e_ms=r1.e2e)).summary
    assert summary["goodput_completed_requests"] == 3
    assert summary["goodput_output_throughput_tok_s"] == pytest.approx(4.849044103435371, rel=1e-9)


# ----- percentiles and std on a crafted run -----

# Six requests, one at a time, with distinct prompt lengths: six distinct TTFTs.
# n = 6 separates the rounding rules: median index 2.5 -> 3 (half up), 2 (floor or half even).
PERCENTILE_ROWS = [
    (1000 * i, n, out, list(range(100 * i, 100 * i + -(-n // 512))))
    for i, (n, out) in enumerate([(100, 3), (700, 5), (300, 2), (1200, 4), (500, 6), (900, 3)])
]
# The reference's summary of that run.
PERCENTILE_REFERENCE = {
    "min_ttft_ms": 18.023974000000003,
    "median_ttft_ms": 27.33611700000006,  # sorted[3]
    "p75_ttft_ms": 30.507524999999987,  # sorted[round(3.75) = 4]
    "p90_ttft_ms": 35.32778599999983,  # sorted[round(4.5) = 5]
    "p95_ttft_ms": 35.32778599999983,
    "p99_ttft_ms": 35.32778599999983,
    "max_ttft_ms": 35.32778599999983,
    "mean_ttft_ms": 26.081355666666667,
    "std_ttft_ms": 5.773490267533917,
    "median_e2e_latency_ms": 50.440808999999945,
    "p75_e2e_latency_ms": 52.73342199999979,
    "std_e2e_latency_ms": 10.741848478002659,
    "median_tpot_ms": 5.776172999999972,
    "p75_tpot_ms": 5.786415500000203,
    "std_tpot_ms": 0.018902910344146887,
    "median_ttst_ms": 5.776096000000052,
    "std_ttst_ms": 0.01889454420737053,
    # Token gaps (17 of them) go through the DDSketch: bucket midpoints, not clamped to max.
    "median_itl_ms": 5.771892892424462,
    "p75_itl_ms": 5.783448233550436,
    "p90_itl_ms": 5.8066283635645375,
    "max_itl_ms": 5.801930000000084,
    "std_itl_ms": 0.01712328418501363,
    "median_output_token_throughput_per_user": 173.29601789120693,
    "p95_output_token_throughput_per_user": 173.99059041324327,
    "std_output_token_throughput_per_user": 0.5134080187135162,
}


@pytest.fixture(scope="module")
def percentile_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    trace = write_trace(tmp_path_factory.mktemp("pct") / "trace.jsonl", PERCENTILE_ROWS)
    return replay(trace)


@pytest.mark.parametrize("key", PERCENTILE_REFERENCE)
def test_summary_statistics_match_the_reference(percentile_run: Report, key: str) -> None:
    assert percentile_run.summary[key] == pytest.approx(PERCENTILE_REFERENCE[key], rel=1e-9)


def test_summary_percentiles_are_sorted_values_at_rounded_half_up_ranks(
    percentile_run: Report,
) -> None:
    """On the run's own TTFTs: median = sorted[3], p75 = sorted[4], p90..p99 = sorted[5]; std divides by n."""
    ttfts = [latencies(r).ttft for r in percentile_run.records]
    values = sorted(t for t in ttfts if t is not None)
    assert len(values) == 6
    summary = percentile_run.summary
    assert [summary[f"{s}_ttft_ms"] for s in ("median", "p75", "p90", "p95", "p99")] == [
        values[3],
        values[4],
        values[5],
        values[5],
        values[5],
    ]
    mean = sum(values) / 6
    population = math.sqrt(sum((v - mean) ** 2 for v in values) / 6)
    assert summary["std_ttft_ms"] == pytest.approx(population, rel=1e-12)
    assert summary["std_ttft_ms"] != pytest.approx(population * math.sqrt(6 / 5), rel=1e-3)


# ----- stats.py, by hand -----


@pytest.mark.parametrize(
    ("n", "p", "index"),
    [
        (6, 50, 3),  # 2.5 rounds half up (floor and half-even give 2)
        (4, 50, 2),  # 1.5 -> 2
        (2, 50, 1),  # 0.5 -> 1
        (3, 75, 2),  # 1.5 -> 2
        (5, 90, 4),  # 3.6 -> 4
        (5, 75, 3),  # exact
        (17, 90, 14),  # 14.4 -> 14 (rounds down below .5)
        (101, 99, 99),
        (1, 99, 0),
        (10, 100, 9),  # clamped to n - 1
    ],
)
def test_rank_is_nearest_rank_rounded_half_up(n: int, p: float, index: int) -> None:
    assert rank(n, p) == index


def test_describe_by_hand() -> None:
    """[4, 1, 3, 2]: mean 2.5; median sorted[round(1.5) = 2] = 3; p75 sorted[2] = 3; p90 sorted[3] = 4; std sqrt(1.25)."""
    out = describe([4.0, 1.0, 3.0, 2.0])
    assert list(out) == list(STAT_NAMES)
    assert out == {
        "mean": 2.5,
        "min": 1.0,
        "max": 4.0,
        "median": 3.0,
        "p75": 3.0,
        "p90": 4.0,
        "p95": 4.0,
        "p99": 4.0,
        "std": math.sqrt(1.25),  # population: / n (the sample std would be sqrt(5 / 3))
    }


def test_describe_of_six_values_takes_the_upper_median() -> None:
    out = describe([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert (out["median"], out["p75"], out["p90"]) == (40.0, 50.0, 60.0)
    assert out["std"] == math.sqrt(sum((v - 35.0) ** 2 for v in (10, 20, 30, 40, 50, 60)) / 6)


def test_describe_of_nothing_is_all_zeros() -> None:
    assert describe([]) == dict.fromkeys(STAT_NAMES, 0.0)


def test_describe_of_one_value() -> None:
    out = describe([7.5])
    assert out == {**dict.fromkeys(STAT_NAMES, 7.5), "std": 0.0}


def sketch_of(values: list[float], *, batched: bool) -> dict[str, float]:
    sketch = GapSketch()
    if batched:
        sketch.add_many(np.array(values[:2]))
        sketch.add_many(np.array(values[2:]))
    else:
        for v in values:
            sketch.add_many(np.array([v]))
    return sketch.describe()


@pytest.mark.parametrize("batched", [False, True])
def test_gap_sketch_uses_the_same_ranks_and_population_std(batched: bool) -> None:
    """The sketch's percentiles are its bucket midpoints (0.1 % accuracy) at the same ranks."""
    out = sketch_of([4.0, 1.0, 3.0, 2.0], batched=batched)
    assert (out["min"], out["max"]) == (1.0, 4.0)
    assert out["mean"] == pytest.approx(2.5, rel=1e-12)
    assert out["std"] == pytest.approx(math.sqrt(1.25), rel=1e-12)
    for stat, exact in (("median", 3.0), ("p75", 3.0), ("p90", 4.0), ("p99", 4.0)):
        assert out[stat] == pytest.approx(exact, rel=1e-3)
    six = sketch_of([10.0, 20.0, 30.0, 40.0, 50.0, 60.0], batched=batched)
    assert six["median"] == pytest.approx(40.0, rel=1e-3)


def test_gap_sketch_of_nothing_and_of_one_value() -> None:
    assert GapSketch().describe() == dict.fromkeys(STAT_NAMES, 0.0)
    one = GapSketch()
    one.add_many(np.array([5.25]))
    assert one.describe() == {**dict.fromkeys(STAT_NAMES, 5.25), "std": 0.0}


@settings(max_examples=60)
@given(
    st.lists(
        st.lists(
            st.one_of(
                st.floats(0.0, 1e-300),  # the zero bucket
                st.floats(1.0, 100.0),  # ordinary gaps: a few thousand buckets
                st.floats(1e-100, 1e100),  # scattered over many decades (sorted instead)
            ),
            min_size=1,
            max_size=30,
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 5),
)
def test_gap_sketch_folds_every_sample_into_its_bucket(
    batches: list[list[float]], weight: int
) -> None:
    """Folded batches count each sample ``weight`` times in bucket ceil(ln v / ln gamma)."""
    sketch = GapSketch()
    expected: Counter[int] = Counter()
    zeros = 0
    for batch in batches:
        sketch.add_many(np.array(batch), weight=weight)
        values = np.array(batch)
        indexable = values >= sketch._min_indexable
        zeros += weight * int((~indexable).sum())
        keys = np.ceil(np.log(values[indexable]) * sketch._inv_ln_gamma).astype(np.int64)
        for key in keys.tolist():
            expected[key] += weight
    sketch.describe()  # folds what is pending
    assert sketch._buckets == dict(expected)
    assert (sketch.zeros, sketch.count) == (zeros, weight * sum(map(len, batches)))
