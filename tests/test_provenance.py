"""Provenance: a report records what made it, and ``replay --config`` remakes it byte for
byte (wall time aside); engine settings parse back to the same engine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, __version__, parse_engine_args, run
from servesim.cli import main
from servesim.config import Role, engine_settings
from servesim.sweeps import WALL_TIME_COLUMNS
from tests.support import run_cli

REPO = Path(__file__).parents[1]
SAMPLE = REPO / "examples" / "mooncake_conversation_200.jsonl"


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"backend": "sglang", "sglang": {"schedule_policy": "lpm"}},
        {"backend": "trtllm", "max_num_seqs": None},
        {"timing_model": {"profile": "h200-llama3.1-8b-fp8"}, "tensor_parallel_size": 2},
        {"timing_model": {"type": "fixed", "prefill_ms": 3.0, "decode_ms": 1.5}},
        {"aic_nextn": 2, "aic_nextn_accept_rates": "0.8,0.25"},
        {
            "kv_cache_bytes_per_token": 131072,
            "native_host_offload": {"num_host_blocks": 64},
            "g3_offload": {"scope": "worker_local", "num_g3_blocks": 128},
        },
    ],
)
def test_engine_settings_parse_back_to_the_engine(raw: dict[str, Any]) -> None:
    engine = parse_engine_args(raw)
    assert parse_engine_args(engine_settings(engine)) == engine
    if "g3_offload" in raw:
        return  # a disk tier is for aggregated workers only
    decode = parse_engine_args({**raw, "worker_type": "decode"}, role=Role.DECODE)
    assert parse_engine_args(engine_settings(decode), role=Role.DECODE) == decode


def test_a_report_records_version_settings_seed_and_input() -> None:
    report = run(RunConfig(trace=SAMPLE, num_workers=2, seed=3))
    provenance = report.sections["provenance"]
    assert provenance["servesim_version"] == __version__
    assert provenance["seed"] == 3
    data = SAMPLE.read_bytes()
    assert provenance["inputs"] == [
        {
            "name": str(SAMPLE),
            "size_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    ]
    config = provenance["config"]
    assert config["num_workers"] == 2 and config["trace"] == [str(SAMPLE)]
    assert config["engine"]["num_gpu_blocks"] == 16384  # defaults filled in
    assert "provenance" in json.loads(report.to_json())


def _without_wall_time(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    for key in WALL_TIME_COLUMNS:
        document["summary"].pop(key)
    return document


@pytest.mark.parametrize(
    "flags",
    [
        ["--num-workers", "3", "--router-mode", "kv_router", "--sla-ttft-ms", "900"],
        [
            *("--num-prefill-workers", "1", "--num-decode-workers", "2"),
            *("--prefill-engine-args", '{"kv_transfer_bandwidth": 25}'),
            *("--decode-engine-args", '{"max_num_seqs": 64}'),
            *("--max-sim-time-seconds", "30.7", "--seed", "9"),
        ],
        [
            *("--num-workers", "1", "--arrival-speedup-ratio", "4"),
            *("--extra-engine-args", '{"startup_time": 10}', "--planner-details"),
            *("--planner-config", '{"mode": "agg", "load_adjustment_interval_seconds": 5}'),
            *("--telemetry-interval-ms", "5000"),
        ],
    ],
)
def test_replay_config_reproduces_the_report(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert main(["replay", str(SAMPLE), *flags, "--quiet", "--report-json", str(first)]) == 0
    assert main(["replay", "--config", str(first), "--quiet", "--report-json", str(second)]) == 0
    one, two = first.read_text().splitlines(), second.read_text().splitlines()
    differing = [a for a, b in zip(one, two, strict=True) if a != b]
    assert all(any(f'"{k}"' in line for k in WALL_TIME_COLUMNS) for line in differing)
    assert _without_wall_time(first) == _without_wall_time(second)
    # The settings object alone (a sweep row's 'config') replays the same run.
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps(json.loads(first.read_text())["provenance"]["config"]))
    third = tmp_path / "third.json"
    assert main(["replay", "--config", str(settings), "--quiet", "--report-json", str(third)]) == 0
    assert _without_wall_time(third) == _without_wall_time(first)


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith("servesim: error: ")
    return err


def test_replay_config_refuses_a_changed_trace_and_extra_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(SAMPLE.read_bytes())
    report = tmp_path / "report.json"
    assert main(["replay", str(trace), "--quiet", "--report-json", str(report)]) == 0
    err = _fails(capsys, "replay", "--config", str(report), "--num-workers", "2")
    assert "--config replays the recorded configuration; drop --num-workers" in err
    err = _fails(capsys, "replay", "--config", str(report), str(trace))
    assert "drop TRACE" in err
    trace.write_bytes(SAMPLE.read_bytes()[:-200])
    err = _fails(capsys, "replay", "--config", str(report), "--quiet")
    assert f"{trace} has changed since the report was made" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"num_worker": 2}')
    err = _fails(capsys, "replay", "--config", str(bad))
    assert "unknown key 'num_worker'; did you mean 'num_workers'?" in err
    bad.write_text('{"num_workers": 0, "trace": "x.jsonl"}')
    err = _fails(capsys, "replay", "--config", str(bad))
    assert f"--config {bad}: " in err and "'num_workers': must be an integer >= 1" in err
