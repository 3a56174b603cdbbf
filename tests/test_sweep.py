"""Sweep files (axes, zips, ranges, grids, unknown keys), running a sweep, resuming it
after a real kill, and bad input to ``servesim sweep``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from servesim.errors import ConfigError
from servesim.sweeps import WALL_TIME_COLUMNS, Table, load_spec, parse_spec, sweep
from tests.support import run_cli

REPO = Path(__file__).parents[1]
SAMPLE = REPO / "examples" / "mooncake_conversation_200.jsonl"


def _spec(document: dict[str, Any], tmp_path: Path) -> Any:
    return parse_spec(
        document, source="sweep.yaml", base_dir=tmp_path, default_output=tmp_path / "out"
    )


def _error(document: Any, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        _spec(document, tmp_path)
    return str(caught.value)


def test_axes_multiply_first_axis_outermost(tmp_path: Path) -> None:
    spec = _spec(
        {
            "workload": {"trace": "t.jsonl"},
            "fixed": {"seed": 7, "engine.max_num_seqs": 64},
            "axes": {"num_workers": [1, 2], "router_mode": ["round_robin", "kv_router"]},
        },
        tmp_path,
    )
    points = spec.points()
    assert [(p.values["num_workers"], p.values["router_mode"]) for p in points] == [
        (1, "round_robin"),
        (1, "kv_router"),
        (2, "round_robin"),
        (2, "kv_router"),
    ]
    assert [p.index for p in points] == [0, 1, 2, 3]
    first = points[0].settings
    assert first["trace"] == str(tmp_path / "t.jsonl")  # relative to the file
    assert first["seed"] == 7 and first["engine"] == {"max_num_seqs": 64}


def test_ranges_are_inclusive_and_zips_advance_together(tmp_path: Path) -> None:
    spec = _spec(
        {
            "axes": {
                "num_workers": {"from": 4, "to": 16, "step": 4},
                "engine.speedup_ratio": {"from": 1.0, "to": 1.5, "step": 0.25},
            }
        },
        tmp_path,
    )
    points = spec.points()
    assert sorted({p.values["num_workers"] for p in points}) == [4, 8, 12, 16]
    assert sorted({p.values["engine.speedup_ratio"] for p in points}) == [1.0, 1.25, 1.5]
    split = _spec(
        {
            "axes": {
                "split": {
                    "zip": {
                        "num_prefill_workers": [1, 2],
                        "num_decode_workers": {"from": 3, "to": 6, "step": 3},
                    }
                },
                "router_mode": ["round_robin"],
            }
        },
        tmp_path,
    )
    assert [
        (p.settings["num_prefill_workers"], p.settings["num_decode_workers"])
        for p in split.points()
    ] == [(1, 3), (2, 6)]
    assert split.axis_keys == ["num_prefill_workers", "num_decode_workers", "router_mode"]


def test_grids_follow_one_another(tmp_path: Path) -> None:
    spec = _spec(
        {
            "fixed": {"prefill_engine": {"max_num_seqs": 32}},
            "grids": [
                {"axes": {"num_workers": [2, 4]}},
                {
                    "fixed": {"prefill_engine.block_size": 64},
                    "axes": {
                        "pd": {"zip": {"num_prefill_workers": [1], "num_decode_workers": [3]}}
                    },
                },
            ],
        },
        tmp_path,
    )
    points = spec.points()
    assert len(points) == 3
    # A grid's fixed keys merge into the file's objects.
    assert points[2].settings["prefill_engine"] == {"max_num_seqs": 32, "block_size": 64}
    assert "num_workers" not in points[2].settings
    assert spec.axis_keys == ["num_workers", "num_prefill_workers", "num_decode_workers"]


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"axes": {"num_worker": [1]}},
            "axes: unknown key 'num_worker'; did you mean 'num_workers'?",
        ),
        (
            {"axes": {"engine.max_num_seq": [1]}},
            "unknown engine key 'max_num_seq'; did you mean 'engine.max_num_seqs'?",
        ),
        ({"axes": {"router.nope": [1]}}, "unknown router key 'nope'"),
        ({"axes": {"z": {"zip": {"num_workerz": [1]}}}}, "axes.z.zip: unknown key 'num_workerz'"),
        (
            {"fixed": {"sed": 1}, "axes": {"seed": [1]}},
            "fixed: unknown key 'sed'; did you mean 'seed'?",
        ),
        ({"axes": {"num_workers": []}}, "axes.num_workers: empty axis"),
        (
            {"axes": {"num_workers": {"from": 5, "to": 4}}},
            "axes.num_workers: empty axis (from 5 is above to 4)",
        ),
        (
            {"axes": {"num_workers": {"from": 1, "to": 4, "step": 0}}},
            "step must be a finite number > 0",
        ),
        ({"axes": {"num_workers": 4}}, "expected a list of values, a range"),
        (
            {"axes": {"s": {"zip": {"num_prefill_workers": [1, 2], "num_decode_workers": [3]}}}},
            "zipped lists must have one length (num_prefill_workers has 2, num_decode_workers has 1)",
        ),
        ({"axes": {"seed": [1]}, "grids": []}, "give 'axes' (one grid) or 'grids'"),
        (
            {"axis": {"seed": [1]}},
            "axis: unknown key (expected workload, fixed, axes, grids, output)",
        ),
        ({"grids": [{"axes": {"seed": [1]}, "fix": {}}]}, "grids[0].fix: unknown key"),
        ([1, 2], "expected an object"),
    ],
)
def test_a_bad_sweep_file_is_named_with_the_place(
    document: Any, expected: str, tmp_path: Path
) -> None:
    message = _error(document, tmp_path)
    assert message.startswith("sweep.yaml: ")
    assert expected in message


def test_yaml_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("axes:\n  num_workers: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: invalid YAML at line 3"):
        load_spec(path)


def _write(tmp_path: Path, axes: dict[str, Any], name: str = "sweep.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"workload": {"trace": str(SAMPLE)}, "axes": axes}))
    return path


def _comparable(table: Table) -> Table:
    return table.drop(WALL_TIME_COLUMNS)


def test_a_sweep_writes_its_table_and_a_rerun_does_no_work(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"num_workers": [1, 2], "engine.block_size": [64, 0], "router_mode": ["kv_router"]},
    )
    first = sweep(path, jobs=1)
    assert (first.ran, first.skipped, first.failed) == (4, 0, 2)
    table = first.table
    assert table.column("point") == [0, 1, 2, 3]
    assert table.column("status") == ["ok", "failed", "ok", "failed"]
    # A point whose values are invalid is recorded with its error; the others still ran.
    assert "block_size must be positive" in table.column("error")[1]
    assert table.column("gpus") == [1, None, 2, None]
    assert table.column("num_requests")[0] == 200
    assert table.column("num_workers") == [1, 1, 2, 2]
    for key in ("gpu_hours", "goodput_rps", "p99_ttft_ms", "servesim_version", "config", "key"):
        assert key in table.columns
    config = json.loads(table.column("config")[0])
    assert config["num_workers"] == 1 and config["engine"]["block_size"] == 64
    out = tmp_path / "sweep.sweep"
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("point,status,error,num_workers")
    arrow = __import__("pyarrow.parquet", fromlist=["read_table"]).read_table(
        out / "results.parquet"
    )
    assert arrow.column_names == list(table.columns)
    assert arrow.column("p99_ttft_ms").to_pylist() == table.column("p99_ttft_ms")
    again = sweep(path, jobs=1)
    assert (again.ran, again.skipped) == (0, 4)
    assert _comparable(again.table) == _comparable(table)
    assert again.table == table  # nothing re-ran: even the wall times are the recorded ones


def test_parallel_points_give_the_serial_table(tmp_path: Path) -> None:
    path = _write(tmp_path, {"num_workers": [1, 2, 3], "router_mode": ["round_robin", "kv_router"]})
    serial = sweep(path, jobs=1, output=tmp_path / "serial")
    parallel = sweep(path, jobs=2, output=tmp_path / "parallel")
    assert parallel.ran == 6
    assert _comparable(parallel.table) == _comparable(serial.table)


def test_a_sweep_killed_midway_resumes_to_the_same_table(tmp_path: Path) -> None:
    axes = {"num_workers": [1, 2, 3, 4], "router_mode": ["round_robin", "kv_router"]}
    path = _write(tmp_path, axes)
    log = tmp_path / "sweep.sweep" / "results.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "servesim", "sweep", str(path), "--jobs", "1", "--quiet"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().count("\n") >= 2):
            assert process.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    done_before = log.read_text().count("\n")
    assert 2 <= done_before < 8
    assert not (tmp_path / "sweep.sweep" / "results.csv").exists()
    resumed = sweep(path, jobs=1)
    assert resumed.skipped >= 2 and resumed.ran == 8 - resumed.skipped
    fresh = sweep(path, jobs=1, output=tmp_path / "fresh")
    assert fresh.ran == 8
    assert _comparable(resumed.table) == _comparable(fresh.table)


def test_a_log_line_cut_short_by_a_kill_is_dropped(tmp_path: Path) -> None:
    path = _write(tmp_path, {"num_workers": [1, 2]})
    sweep(path, jobs=1)
    log = tmp_path / "sweep.sweep" / "results.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    again = sweep(path, jobs=1)
    assert (again.ran, again.skipped) == (1, 1)
    assert log.read_text().count("\n") == 2


def test_the_cli_shows_progress_and_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, {"num_workers": [1, 2]})
    code, out, err = run_cli(capsys, "sweep", str(path), "--jobs", "1")
    assert code == 0
    assert "[1/2] point 0 ok · ETA" in err and "[2/2] point 1 ok · num_workers=2" in err
    assert "2 points: 2 run now, 0 done before, 0 failed" in out
    assert f"Saved table to: {tmp_path / 'sweep.sweep' / 'results.parquet'}" in out
    code, out, _ = run_cli(capsys, "sweep", str(path))
    assert code == 0 and "0 run now, 2 done before" in out


@pytest.mark.parametrize(
    ("axes", "expected"),
    [
        ({"num_workerz": [1]}, "unknown key 'num_workerz'; did you mean 'num_workers'?"),
        ({"num_workers": []}, "axes.num_workers: empty axis"),
    ],
)
def test_bad_sweep_files_exit_2_with_one_line(
    axes: dict[str, Any], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "sweep", str(_write(tmp_path, axes)))
    assert code == 2 and out == ""
    assert err.startswith("servesim: error: ") and expected in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "sweep.sweep").exists()


def test_a_failed_point_makes_the_exit_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, {"engine.num_gpu_blocks": [0, 16384]})
    code, out, err = run_cli(capsys, "sweep", str(path), "--jobs", "1")
    assert code == 1
    assert "point 0 FAILED: point 0: " in err and "1 point(s) failed" in err
    assert "2 points: 2 run now, 0 done before, 1 failed" in out


def test_an_unreachable_ray_address_exits_2_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    path = _write(tmp_path, {"num_workers": [1]})
    started = time.monotonic()
    code, _, err = run_cli(capsys, "sweep", str(path), "--ray", "127.0.0.1:1")
    assert code == 2
    assert err.startswith("servesim: error: --ray: cannot reach a Ray cluster at 127.0.0.1:1")
    assert time.monotonic() - started < 30
    assert not (tmp_path / "sweep.sweep").exists()  # refused before any output
    code, _, err = run_cli(capsys, "sweep", str(path), "--ray", "nonsense")
    assert code == 2 and "expected a cluster address HOST:PORT" in err
