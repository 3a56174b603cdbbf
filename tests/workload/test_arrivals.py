"""Synthetic arrivals: seeded Poisson (``--request-rate`` with ``--seed``) and fixed intervals.

The reference (Dynamo 1.6.1) draws Poisson gaps from Rust's seeded
``StdRng`` (ChaCha12); servesim draws the same stream, so its arrivals are
the reference's to the last bit. Its arrivals at 10 req/s for six requests
are below; also tested: the first request at 0, one stream per seed, the seed
42 default, and gaps whose mean is 1000 / rate ms.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
from pathlib import Path

import pytest

from servesim import EngineConfig, RunConfig, SyntheticWorkload, run
from servesim.cli import main
from servesim.workload.synthetic import synthetic_sessions

# The reference's arrival times (ms), 10 req/s, six requests, arrival seed 42 and 7.
# Without a seed the reference uses 42 (its arrivals are those of seed 42).
REFERENCE_ARRIVALS = {
    42: [
        0.0,
        74.77246176406965,
        153.01953951913882,
        254.207536844964,
        306.2785951560703,
        309.7732343327897,
    ],
    7: [
        0.0,
        3.0786437168091014,
        39.76362317455055,
        55.153612583970286,
        133.35520869913557,
        165.16896241890325,
    ],
}


def arrivals(*, rate: float, count: int, seed: int | None) -> list[float]:
    """Arrival times of a replay, by request id, through the public entry point."""
    config = RunConfig(
        synthetic=SyntheticWorkload(
            input_tokens=16, output_tokens=1, request_count=count, request_rate=rate
        ),
        engine=EngineConfig(block_size=16),
    )
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
    return [r.arrival_time_ms for r in sorted(run(config).records, key=lambda r: r.uid)]


def poisson_starts(rate: float, count: int, seed: int) -> list[float]:
    sessions = synthetic_sessions(
        input_tokens=16,
        output_tokens=1,
        request_count=count,
        block_size=16,
        request_rate=rate,
        seed=seed,
    )
    starts = [s.start_ms for s in sessions]
    assert all(start is not None for start in starts)
    return [start for start in starts if start is not None]


@pytest.mark.parametrize("seed", sorted(REFERENCE_ARRIVALS))
def test_poisson_arrivals_are_the_references(seed: int) -> None:
    expected = REFERENCE_ARRIVALS[seed]
    assert arrivals(rate=10.0, count=6, seed=seed) == expected


def test_without_a_seed_the_arrivals_are_those_of_seed_42() -> None:
    """As in the reference, where an unseeded run reproduces seed 42's arrivals."""
    assert arrivals(rate=10.0, count=6, seed=None) == arrivals(rate=10.0, count=6, seed=42)


def cli_arrivals(tmp_path: Path, *seed: str) -> list[float]:
    out = tmp_path / f"requests{'-'.join(seed)}.jsonl"
    argv = ["replay", "--input-tokens", "16", "--output-tokens", "1", "--request-count", "6"]
    argv += ["--request-rate", "10", *seed, "--per-request-jsonl", str(out), "--quiet"]
    assert main(argv) == 0
    return [json.loads(line)["arrival_time_ms"] for line in out.read_text().splitlines()]


def test_cli_seed_defaults_to_42_and_selects_the_stream(tmp_path: Path) -> None:
    unseeded = cli_arrivals(tmp_path)
    assert unseeded == cli_arrivals(tmp_path, "--seed", "42") == poisson_starts(10.0, 6, 42)
    assert cli_arrivals(tmp_path, "--seed", "7") == poisson_starts(10.0, 6, 7)


def test_one_stream_per_seed() -> None:
    """The same seed gives the same arrivals; another seed other ones; the first request comes at 0."""
    first = poisson_starts(10.0, 50, 7)
    assert first == poisson_starts(10.0, 50, 7)
    assert first[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(first))
    other = poisson_starts(10.0, 50, 8)
    assert other[0] == 0.0
    assert all(a != b for a, b in zip(first[1:], other[1:], strict=True))


@pytest.mark.parametrize("rate", [10.0, 40.0])
def test_poisson_gaps_have_mean_one_over_the_rate(rate: float) -> None:
    """4,000 gaps at ``rate`` req/s average 1000 / rate ms (5 % is over 3 standard errors)."""
    starts = poisson_starts(rate, 4001, 42)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert statistics.fmean(gaps) == pytest.approx(1000.0 / rate, rel=0.05)
    # Exponential, not fixed: the standard deviation equals the mean.
    assert statistics.pstdev(gaps) == pytest.approx(1000.0 / rate, rel=0.08)


def test_fixed_interval_arrivals_are_exact_multiples() -> None:
    sessions = synthetic_sessions(
        input_tokens=16, output_tokens=1, request_count=5, block_size=16, arrival_interval_ms=12.5
    )
    assert [s.start_ms for s in sessions] == [0.0, 12.5, 25.0, 37.5, 50.0]


def test_arrival_seed_seeds_the_arrivals_alone(tmp_path: Path) -> None:
    """``--arrival-seed`` (the reference's ``arrival_seed``) overrides ``--seed`` for arrivals only."""
    jsonl = tmp_path / "requests.jsonl"
    argv = ["replay", "--input-tokens", "16", "--output-tokens", "1", "--request-count", "6"]
    argv += ["--request-rate", "10", "--seed", "42", "--arrival-seed", "7", "--quiet"]
    argv += ["--report-json", str(tmp_path / "r.json"), "--per-request-jsonl", str(jsonl)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [row["arrival_time_ms"] for row in rows] == REFERENCE_ARRIVALS[7]
