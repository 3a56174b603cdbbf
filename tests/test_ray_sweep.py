"""A sweep and a search as Ray tasks on a real local Ray instance (one for the module,
``ray.init(num_cpus=2)``) give the local tables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servesim.capacity import load_search, search
from servesim.sweeps import WALL_TIME_COLUMNS, sweep

ray = pytest.importorskip("ray")

REPO = Path(__file__).parents[1]
SAMPLE = REPO / "examples" / "mooncake_conversation_200.jsonl"
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        configure_logging=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def test_a_sweep_on_ray_gives_the_local_table(local_ray: Any, tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    axes = {
        "num_workers": [1, 2, 4],
        "router_mode": ["round_robin", "kv_router"],
    }
    path.write_text(json.dumps({"workload": {"trace": str(SAMPLE)}, "axes": axes}))
    local = sweep(path, jobs=1, output=tmp_path / "local")
    remote = sweep(path, ray=True, output=tmp_path / "ray")
    assert remote.ran == 6 and remote.failed == 0
    assert remote.table.drop(WALL_TIME_COLUMNS) == local.table.drop(WALL_TIME_COLUMNS)
    again = sweep(path, ray=True, output=tmp_path / "ray")
    assert again.ran == 0


def test_a_search_on_ray_names_the_local_winner(local_ray: Any) -> None:
    spec = load_search(REPO / "examples" / "search.yaml")
    result = search(spec, ray=True)
    assert result.winner is not None
    assert result.winner.label == "kv_router, 6 aggregated workers, TP1 DP1"
