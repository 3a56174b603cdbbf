"""The differential fuzzer's own parts, without the reference: its generator and its comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.cli import build_parser, config_from_args
from tests.scenarios.differential import (
    FAMILIES,
    RECORD_KEYS,
    Run,
    Verdict,
    classify,
    differing_record_fields,
    generate,
    parse_seeds,
)
from tests.scenarios.harness import Scenario, servesim_argv

REPO = Path(__file__).resolve().parents[2]
SEEDS = range(25)


def texts(family: str, seed: int) -> tuple[str, str]:
    """The scenario and trace files of one seed, naming a fixed trace path."""
    return generate(family, seed).texts(Path("/trace.jsonl"))


def test_same_seed_same_files() -> None:
    """A seed gives byte-identical files, in another process with another string-hash seed too."""
    here = [texts(f, s) for f in FAMILIES for s in (0, 7)]
    assert here == [texts(f, s) for f in FAMILIES for s in (0, 7)]
    code = (
        "import json, sys; from pathlib import Path; "
        "from tests.scenarios.differential import FAMILIES, generate; "
        "json.dump([generate(f, s).texts(Path('/trace.jsonl')) for f in FAMILIES for s in (0, 7)], "
        "sys.stdout)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert [tuple(pair) for pair in json.loads(done.stdout)] == here
    assert texts("aggregated", 0) != texts("aggregated", 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_scenarios_pass_servesim_validation(family: str, tmp_path: Path) -> None:
    """servesim's command line accepts every generated scenario (flags and engine keys)."""
    for seed in SEEDS:
        case = generate(family, seed)
        assert 3 <= len(case.rows) <= 30
        trace = tmp_path / "trace.jsonl"
        trace.write_text(case.texts(trace)[1])
        spec = {**case.spec, "trace": str(trace)}
        argv = servesim_argv(Scenario(case.name, spec), tmp_path, tmp_path / "report.json")
        parser = build_parser()
        args, extras = parser.parse_known_args(argv)
        assert not extras, (case.name, extras)
        config_from_args(args, getattr(args, "command_parser", parser))


def record(**changes: object) -> dict[str, object]:
    """A completed aggregated request's record with ``changes`` applied."""
    base: dict[str, object] = dict.fromkeys(RECORD_KEYS)
    base |= {"arrival_time_ms": 0.0, "input_length": 10, "output_length": 2}
    base |= {"terminal_status": "completed", "first_token_ms": 5.123456, "reused_input_tokens": 0}
    return base | changes


def test_records_compare_times_to_a_microsecond_of_a_ms() -> None:
    """1e-5 ms apart differs, 1e-7 ms does not; counts exactly; order does not matter."""
    late, early = record(arrival_time_ms=3.0), record()
    assert differing_record_fields([early, late], [late, early]) == {}
    assert differing_record_fields([early], [record(first_token_ms=5.123456 + 1e-7)]) == {}
    assert differing_record_fields([early], [record(first_token_ms=5.123456 + 1e-5)]) == {
        "first_token_ms": 1
    }
    assert differing_record_fields([early], [record(reused_input_tokens=1)]) == {
        "reused_input_tokens": 1
    }
    assert differing_record_fields([early], [early, late]) == {"records": 1}


def test_classify() -> None:
    """Agreement, a difference, failures on either side and a documented rejection."""
    summary = {"completed_requests": 1, "mean_ttft_ms": 5.0, "wall_time_ms": 1.0}
    same = Run(summary=summary, records=(record(),))
    assert classify(same, Run(summary={**summary, "wall_time_ms": 9.0}, records=(record(),))) == (
        classify(same, same)
    )
    assert classify(same, same).verdict is Verdict.AGREE
    slower = Run(summary={**summary, "mean_ttft_ms": 6.0}, records=(record(),))
    assert classify(same, slower).verdict is Verdict.DIFFER
    failed = Run(error="boom")
    assert classify(same, failed).verdict is Verdict.SERVESIM_FAILURE
    assert classify(failed, same).verdict is Verdict.REFERENCE_FAILURE
    assert classify(failed, failed).verdict is Verdict.BOTH_FAIL
    assert classify(same, Run(timed_out=True)).verdict is Verdict.TIMEOUT
    stall = Run(error="replay invariant violated: ... an effect-free zero-duration pass with 1 ...")
    rejecting = Run(summary={**summary, "rejected_requests": 1})
    assert classify(stall, rejecting).verdict is Verdict.REJECTED


def test_seed_ranges() -> None:
    """``A-B`` includes both ends; ``N`` means 0 to N-1."""
    assert parse_seeds("3-5") == range(3, 6)
    assert parse_seeds("4") == range(4)
