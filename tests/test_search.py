"""``servesim search``: SLA targets, bisection on a synthetic monotone case, a search on
the shipped Mooncake sample confirmed by direct replays, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim import run
from servesim.capacity import (
    NoFeasibleConfiguration,
    Target,
    load_search,
    minimal_feasible,
    parse_search,
    parse_target,
    search,
)
from servesim.errors import ConfigError
from servesim.settings import config_from_settings
from tests.support import run_cli

REPO = Path(__file__).parents[1]
SAMPLE = REPO / "examples" / "mooncake_conversation_200.jsonl"
SLA = {"p99_ttft_ms": 2000, "p99_itl_ms": 50}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("p99_ttft_ms", "p99_ttft_ms"),
        ("p95_e2e_latency_ms", "p95_e2e_latency_ms"),
        ("p90_e2e_ms", "p90_e2e_latency_ms"),
        ("p50_itl_ms", "median_itl_ms"),
        ("mean_tpot", "mean_tpot_ms"),
    ],
)
def test_targets_name_summary_keys(name: str, expected: str) -> None:
    assert parse_target(name, 10, source="s") == Target(expected, 10.0)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("ttft_ms", 2000, "sla.ttft_ms: an SLA target needs a percentile or statistic"),
        ("itl", 50, "sla.itl: an SLA target needs a percentile or statistic"),
        ("p99_ttfb_ms", 1, "unknown metric 'ttfb'"),
        ("p42_ttft_ms", 1, "sla.p42_ttft_ms: the summary has no p42 (statistics: mean, "),
        ("slow_ttft_ms", 1, "sla.slow_ttft_ms: an SLA target needs a percentile"),
        ("latency", 1, "expected STAT_METRIC such as p99_ttft_ms"),
        ("p99_ttft_ms", 0, "expected a bound in ms > 0"),
        ("p99_ttft_ms", "2 s", "expected a bound in ms > 0"),
    ],
)
def test_a_bad_target_is_refused(name: str, value: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=r"^s: ") as caught:
        parse_target(name, value, source="s")
    assert expected in str(caught.value)


def _oracle(thresholds: list[int | None]) -> tuple[Any, list[tuple[int, int]]]:
    asked: list[tuple[int, int]] = []

    def feasible(batch: list[tuple[int, int]]) -> list[bool]:
        asked.extend(batch)
        return [thresholds[f] is not None and i >= (thresholds[f] or 0) for f, i in batch]

    return feasible, asked


@given(
    st.lists(
        st.integers(min_value=1, max_value=40).flatmap(
            lambda n: st.tuples(st.just(n), st.none() | st.integers(0, n - 1))
        ),
        min_size=1,
        max_size=6,
    )
)
def test_bisection_finds_the_first_feasible_count_in_few_replays(
    families: list[tuple[int, int | None]],
) -> None:
    sizes = [n for n, _ in families]
    thresholds = [t for _, t in families]
    feasible, asked = _oracle(thresholds)
    assert minimal_feasible(sizes, feasible) == thresholds
    for f, n in enumerate(sizes):
        mine = [i for g, i in asked if g == f]
        assert len(mine) == len(set(mine))  # nothing judged twice
        assert len(mine) <= 1 + math.ceil(math.log2(n))


def test_bisection_asks_every_family_in_each_batch() -> None:
    batches: list[list[tuple[int, int]]] = []

    def feasible(batch: list[tuple[int, int]]) -> list[bool]:
        batches.append(batch)
        return [i >= 5 for _, i in batch]

    assert minimal_feasible([16, 16, 16], feasible) == [5, 5, 5]
    assert [len(b) for b in batches] == [3, 3, 3, 3, 3]
    assert batches[0] == [(0, 15), (1, 15), (2, 15)]  # the largest first


def _spec(space: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"workload": {"trace": str(SAMPLE)}, "sla": SLA, "space": space, **extra}


@pytest.fixture(scope="module")
def found() -> Any:
    """The worked example of docs/capacity-planning.md."""
    spec = load_search(REPO / "examples" / "search.yaml")
    return spec, search(spec, jobs=2)


def _replay(config: str) -> dict[str, Any]:
    settings = json.loads(config)
    return run(config_from_settings(settings, source="test")).summary


def test_the_winner_meets_the_sla_and_one_worker_fewer_does_not(found: Any) -> None:
    _, result = found
    winner = result.winner
    assert winner.label == "kv_router, 6 aggregated workers, TP1 DP1"
    assert winner.gpus == 6 and winner.feasible
    # Direct replays of the winner and of the next smaller candidate of its kind.
    summary = _replay(winner.row["config"])
    assert summary["p99_ttft_ms"] <= 2000 and summary["p99_itl_ms"] <= 50
    assert summary["p99_ttft_ms"] == winner.metrics["p99_ttft_ms"]
    smaller = result.next_smaller
    assert smaller is not None and smaller.label == "kv_router, 5 aggregated workers, TP1 DP1"
    summary = _replay(smaller.row["config"])
    assert summary["p99_ttft_ms"] > 2000 or summary["p99_itl_ms"] > 50
    # Every other kind needs at least as many GPUs, and bisection replayed little.
    assert all(c.gpus >= winner.gpus for c in result.runners_up)
    assert len(result.evaluated) < 4 * 8
    assert any(c is winner or c.label == winner.label for c in result.evaluated)


def test_the_frontier_is_not_dominated(found: Any) -> None:
    _, result = found
    frontier = result.frontier
    assert frontier
    for c in frontier:
        for other in result.evaluated:
            if other.error is None:
                better = other.metrics["p99_ttft_ms"] < c.metrics["p99_ttft_ms"] and (
                    other.throughput_per_gpu or 0
                ) > (c.throughput_per_gpu or 0)
                assert not better
    document = json.loads(result.to_json())
    assert document["winner"]["deployment"] == result.winner.label
    assert len(document["evaluated"]) == len(result.evaluated)
    assert len(result.table) == len(result.evaluated)


def test_the_cli_names_winner_runner_up_and_frontier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "search.json"
    space = {"workers": {"from": 4, "to": 8}, "routers": ["kv_router"], "pd_splits": ["1:1"]}
    path.write_text(json.dumps(_spec(space)))
    code, out, err = run_cli(
        capsys, "search", str(path), "--jobs", "1", "--json", str(tmp_path / "r.json")
    )
    assert code == 0
    assert "Winner: kv_router, 6 aggregated workers, TP1 DP1 (6 GPUs): p99_ttft_ms 1863" in out
    assert "One step smaller misses: kv_router, 5 aggregated workers" in out
    assert "Runners-up" in out and "kv_router, 4P+4D" in out
    assert "Pareto frontier (output tokens/s per GPU vs p99_ttft_ms)" in out
    assert "tried kv_router, 8 aggregated workers" in err
    assert json.loads((tmp_path / "r.json").read_text())["winner"]["gpus"] == 6


def test_no_feasible_point_names_the_closest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = parse_search(
        _spec({"workers": {"from": 1, "to": 3}, "routers": ["kv_router"]}),
        source="s",
        base_dir=REPO,
    )
    with pytest.raises(NoFeasibleConfiguration) as caught:
        search(spec, jobs=1)
    message = str(caught.value)
    assert message.startswith("no configuration meets p99_ttft_ms <= 2000 and p99_itl_ms <= 50")
    assert (
        "the closest is kv_router, 3 aggregated workers, TP1 DP1 (3 GPUs): p99_ttft_ms 2376"
        in message
    )
    assert len(caught.value.result.evaluated) == 1  # the largest missed: nothing smaller is tried
    path = tmp_path / "search.json"
    path.write_text(json.dumps(_spec({"workers": [1, 3], "routers": ["kv_router"]})))
    code, _, err = run_cli(capsys, "search", str(path), "--jobs", "1")
    assert code == 2 and "servesim: error: no configuration meets" in err


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            _spec({"workers": [1]}) | {"sla": {"ttft_ms": 2000}},
            "sla.ttft_ms: an SLA target needs a percentile",
        ),
        (_spec({"workers": [1]}) | {"sla": {}}, "sla: expected targets"),
        (_spec({"workers": []}), "space.workers: empty axis"),
        (_spec({"worker": [1]}), "space.worker: unknown key"),
        (
            _spec({"workers": [1], "routers": ["kv"]}),
            "space.routers: expected round_robin or kv_router",
        ),
        (_spec({"workers": [1], "pd_splits": ["1-3"]}), 'expected PREFILL:DECODE such as "1:3"'),
        (
            _spec({"workers": [3], "aggregated": False, "pd_splits": ["1:3"]}),
            "no worker count fits",
        ),
        (
            _spec({"workers": [1]}, objective="dollars"),
            "objective: expected one of gpus, gpu_hours",
        ),
        (_spec({"workers": [1]}, min_goodput=1.5), "min_goodput: expected a share in (0, 1]"),
        (_spec({"workers": [1]}) | {"fixed": {"num_workerz": 1}}, "unknown key 'num_workerz'"),
    ],
)
def test_bad_search_files_exit_2(
    document: dict[str, Any], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "search.json"
    path.write_text(json.dumps(document))
    code, out, err = run_cli(capsys, "search", str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"servesim: error: {path}: ") and expected in err
    assert len(err.splitlines()) == 1


def test_each_shape_takes_the_engine_keys_and_drops_the_other_shapes_settings() -> None:
    from servesim.capacity import Family

    base = {
        "trace": str(SAMPLE),
        "num_workers": 3,
        "engine": {"max_num_seqs": 64},
        "decode_engine": {"max_num_batched_tokens": 4096},
    }
    aggregated = config_from_settings(Family("kv_router", None, 2, 1).settings(base, 4), source="t")
    assert aggregated.num_workers == 4 and not aggregated.disaggregated
    assert aggregated.engine.max_num_seqs == 64 and aggregated.engine.tensor_parallel_size == 2
    split = config_from_settings(Family("round_robin", (1, 3), 1, 2).settings(base, 2), source="t")
    assert (split.num_prefill_workers, split.num_decode_workers) == (2, 6)
    assert split.prefill_engine is not None and split.decode_engine is not None
    assert split.prefill_engine.max_num_seqs == 64 and split.prefill_engine.dp_size == 2
    assert split.decode_engine.max_num_batched_tokens == 4096
