"""docs/report.md lists every key a report writes: the summary's, each per-request field,
and the ``run`` and ``series`` sections', gathered from runs that exercise them all."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servesim import Report, Role, RunConfig, Sla, SyntheticWorkload, parse_engine_args, run
from servesim.cli import main
from servesim.config import parse_router_config
from servesim.metrics.report import HOST_TIER_FIELDS, RECORD_FIELDS, request_row
from servesim.metrics.stats import STAT_NAMES
from tests.support import write_trace

DOCS = Path(__file__).parents[1] / "docs"
_STAT = re.compile(rf"^({'|'.join(STAT_NAMES)})_(.+)$")


def _documented(name: str) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", (DOCS / name).read_text(encoding="utf-8")))


def _leaves(value: Any, skip: tuple[str, ...] = ()) -> Iterator[str]:
    """Every key of nested objects (and of objects in lists), not descending into ``skip``."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            if key not in skip:
                yield from _leaves(inner, skip)
    elif isinstance(value, list):
        for inner in value:
            yield from _leaves(inner, skip)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[Report]:
    rows = [(i * 100, 600 + 200 * (i % 3), 8, [1, 2, 3 + i]) for i in range(8)]
    rows.append((900, 9000, 4, list(range(40, 58))))  # never fits: rejected
    trace = write_trace(tmp_path_factory.mktemp("docs") / "trace.jsonl", rows)
    small = {"block_size": 64, "num_gpu_blocks": 100}
    transfer = {"kv_transfer_bandwidth": 64, "kv_transfer_bytes_per_token": 131072}
    offload = {
        "block_size": 64,
        "num_gpu_blocks": 64,
        "kv_cache_bytes_per_token": 131072,
        "native_host_offload": {"num_host_blocks": 128, "d2h_bandwidth_gbps": 4.0},
        "g3_offload": {"scope": "worker_local", "num_g3_blocks": 512},
    }
    return [
        run(
            RunConfig(
                trace=trace,
                engine=parse_engine_args(small),
                num_workers=2,
                router_mode="kv_router",
                router=parse_router_config({"router_queue_threshold": 0.1}),
                sla=Sla(ttft_ms=100.0, itl_ms=50.0, e2e_ms=5000.0),
                max_sim_time_ms=2000.0,
            )
        ),
        run(
            RunConfig(
                trace=trace,
                prefill_engine=parse_engine_args({**small, **transfer}, role=Role.PREFILL),
                decode_engine=parse_engine_args({**small, **transfer}, role=Role.DECODE),
            )
        ),
        run(
            RunConfig(
                synthetic=SyntheticWorkload(
                    input_tokens=1024,
                    output_tokens=8,
                    request_count=12,
                    shared_prefix_ratio=0.5,
                    num_prefix_groups=2,
                ),
                replay_concurrency=4,
                engine=parse_engine_args(offload),
            )
        ),
    ]


def test_every_summary_key_is_documented(reports: list[Report]) -> None:
    documented = _documented("report.md")
    missing = set()
    for report in reports:
        for key in report.summary:
            stat = _STAT.match(key)
            name = f"<stat>_{stat.group(2)}" if stat else key
            if name not in documented:
                missing.add(name)
        for key in _leaves(report.summary.get("g3_offload", {})):
            if key not in documented:
                missing.add(f"g3_offload: {key}")
    assert "g3_offload" in reports[2].summary and "goodput_completed_requests" in reports[0].summary
    assert not missing


def test_every_per_request_field_is_documented(reports: list[Report]) -> None:
    documented = _documented("report.md")
    fields = {key for report in reports for r in report.records for key in request_row(r)}
    assert fields == set(RECORD_FIELDS) | set(HOST_TIER_FIELDS)
    assert not fields - documented


def test_every_run_series_and_provenance_key_is_documented(reports: list[Report]) -> None:
    documented = _documented("report.md")
    keys = set()
    for report in reports:
        # The router config's keys are the KvRouterConfig's, which 'servesim keys' lists.
        keys |= set(_leaves(json.loads(report.to_json())["run"], skip=("config",)))
        keys |= set(_leaves(report.series))
        # The settings' keys are the replay's flags and the engine and router keys.
        keys |= set(_leaves(json.loads(report.to_json())["provenance"], skip=("config",)))
    assert {"transfers", "kv_transfer_ms", "per_rank", "input_tokens", "sha256"} <= keys
    assert not keys - documented


def test_the_api_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/api.md's first example, run from a directory holding the examples."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match is not None
    (tmp_path / "examples").symlink_to(DOCS.parent / "examples")
    monkeypatch.chdir(tmp_path)
    exec(compile(match.group(1), "docs/api.md", "exec"), {})
    out = capsys.readouterr().out
    assert "200 arrived · 200 completed" in out
    assert {p.name for p in tmp_path.iterdir()} == {
        "examples",
        "report.json",
        "requests.jsonl",
        "report.html",
    }


def test_the_readme_shows_what_its_first_command_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sample output in the README is the example's report (all but the simulator's
    own wall time and speed, the report's last two lines)."""
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```\n(servesim \S+ · simulated serving run\n.*?)```", readme, re.S)
    assert match is not None
    monkeypatch.chdir(DOCS.parent)
    assert main(["replay", "examples/mooncake_conversation_200.jsonl", "--num-workers", "4"]) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = match.group(1).splitlines()
    assert shown[-2].startswith("Simulator ") and printed[-2].startswith("Simulator ")
    assert shown[:-2] == printed[:-2]
