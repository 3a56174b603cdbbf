"""End-to-end: servesim against stored outputs of the reference (Dynamo 1.6.1).

Every scenario in ``tests/scenarios/reference/`` (the team's public
reference scenarios that servesim supports, with their data shipped in
``tests/data/``) runs through servesim's CLI and is checked strictly against
what the reference produced (see ``harness.py`` for the stored files and
``regenerate.py`` to make them again):

- every summary key the reference writes must be in servesim's summary,
  except the host-speed keys (``harness.HOST_SPEED_KEYS``);
- round-robin scenarios are deterministic in both simulators: every summary
  value agrees to 1e-6 relative (1e-9 absolute near zero), counts and
  non-numbers exactly, and so does every request's record (first and last
  token time, reused input tokens, prefill and decode worker, status), the
  requests matched in arrival order;
- KV-router scenarios: the reference breaks cost ties at random, so every
  summary value must lie within the range of its stored runs;
- scenarios with telemetry: every value of every sample agrees under the
  deterministic rule, and so does the number of samples;
- scenarios with a planner: its scaling events (time, pool, from and to
  counts, direction), tick count, lifecycle operations and the metadata
  servesim shares with the reference (mode, bootstrap, details captured)
  agree exactly; with ``capture_planner_details``, so does every tick's
  forward-pass metrics of every (worker, rank) (counts and token sums
  exactly, variances and wall times to 1e-6).

Disagreements that are known today (the engine is being fixed) are listed in
the ``KNOWN_*`` dicts below with what exactly differs; each marks its case
``xfail(strict=True)``, so the case fails as soon as it starts passing:
delete the entry when a fix lands.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.scenarios.harness import (
    HOST_SPEED_KEYS,
    Json,
    compare_records,
    compare_section,
    compare_spread,
    compare_summary,
    load_scenario,
    load_scenarios,
    missing_keys,
    planner_view,
    read_records,
    reduce_records,
)
from tests.scenarios.runs import ServesimRuns

ALL = [sc.name for sc in load_scenarios()]
DETERMINISTIC = [sc.name for sc in load_scenarios() if not sc.kv_router]
TELEMETRY = [sc.name for sc in load_scenarios() if sc.telemetry and not sc.kv_router]
PLANNER = [sc.name for sc in load_scenarios() if sc.planner and not sc.kv_router]

# Known disagreements with the reference, as of commit 303bde3 (servesim at
# HEAD when these were last checked). Each entry marks its case
# xfail(strict=True): delete the entry when a fix makes the case pass.

# Scenario -> which reference summary keys servesim's summary lacks
# (test_summary_has_every_reference_key).
KNOWN_MISSING_KEYS: dict[str, str] = {}

# Scenario -> which summary values differ (test_summary_matches_reference).
KNOWN_SUMMARY_FAILURES: dict[str, str] = {}

# The KV router breaks cost ties at random (the reference unseeded, servesim seeded), so
# one run is one sample: a KV scenario's summary is the per-key median of servesim's runs
# under these seeds, which must lie within the range of the reference's 30 runs. (A single
# run falls outside that range on some key now and then: seed 42 puts
# disagg_kv_mooncake_bw's mean_tpot_ms 1.5e-4 above the reference's maximum.)
KV_SEEDS = (1, 2, 3, 4, 5)


def median_summary(runs: list[Json]) -> Json:
    """Per key, the median of the runs' numbers (other values from the first run)."""
    out = dict(runs[0])
    for key in runs[0]:
        values = [run[key] for run in runs]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = statistics.median(values)
    return out


# Scenario -> which per-request records differ (test_requests_match_reference).
KNOWN_REQUEST_FAILURES: dict[str, str] = {}


def cases(names: list[str], known: Mapping[str, str]) -> list[pytest.ParameterSet]:
    """``names`` as pytest parameters, the ones in ``known`` marked as strict expected failures."""
    return [
        pytest.param(
            name,
            id=name,
            marks=[pytest.mark.xfail(strict=True, reason=known[name])] if name in known else [],
        )
        for name in names
    ]


def check(failures: list[str]) -> None:
    """Fail the test with every disagreement, one per line, if there is any."""
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)


@pytest.mark.parametrize("name", cases(ALL, KNOWN_MISSING_KEYS))
def test_summary_has_every_reference_key(name: str, servesim_runs: ServesimRuns) -> None:
    """Every key of the reference's summary (but host-speed keys) is in servesim's."""
    sc = load_scenario(name)
    stored = json.loads((sc.spread_path if sc.kv_router else sc.summary_path).read_text())
    reference = stored["min"] if sc.kv_router else stored["summary"]
    check(missing_keys(name, reference, servesim_runs.get(name).summary))


@pytest.mark.parametrize("name", cases(ALL, KNOWN_SUMMARY_FAILURES))
def test_summary_matches_reference(name: str, servesim_runs: ServesimRuns) -> None:
    """Every summary value both report agrees: to 1e-6 (round robin) or within the reference's runs (KV router)."""
    sc = load_scenario(name)
    ours = servesim_runs.get(name).summary
    if sc.kv_router:
        runs = [servesim_runs.get(name, seed=seed).summary for seed in KV_SEEDS]
        check(compare_spread(name, json.loads(sc.spread_path.read_text()), median_summary(runs)))
    else:
        check(compare_summary(name, json.loads(sc.summary_path.read_text())["summary"], ours))


@pytest.mark.parametrize("name", cases(DETERMINISTIC, KNOWN_REQUEST_FAILURES))
def test_requests_match_reference(name: str, servesim_runs: ServesimRuns) -> None:
    """Request by request in arrival order: token times to 1e-6, reused tokens, workers and status exactly."""
    sc = load_scenario(name)
    reference = read_records(sc.requests_path)
    diff = compare_records(name, reference, reduce_records(servesim_runs.get(name).records))
    check([diff.describe(name, len(reference))] if diff.differing_records else [])


@pytest.mark.parametrize("name", TELEMETRY)
def test_telemetry_matches_reference(name: str, servesim_runs: ServesimRuns) -> None:
    """Every telemetry sample, value by value: gauges, counters and counts exactly, times and means to 1e-6."""
    sc = load_scenario(name)
    reference = json.loads(sc.telemetry_path.read_text())
    check(compare_section(name, reference, servesim_runs.get(name).sections.get("telemetry")))


@pytest.mark.parametrize("name", PLANNER)
def test_planner_matches_reference(name: str, servesim_runs: ServesimRuns) -> None:
    """Scaling events, ticks, lifecycle operations and (with details) every tick's FPMs
    (worker-seconds and GPU-hours are in the summary)."""
    sc = load_scenario(name)
    reference = planner_view(json.loads(sc.planner_path.read_text()), reference=True)
    ours = servesim_runs.get(name).sections.get("planner")
    assert ours is not None, f"{name}: servesim wrote no planner section"
    check(compare_section(name, reference, planner_view(ours, reference=False)))


def test_two_runs_are_byte_identical_but_for_wall_time(
    servesim_runs: ServesimRuns, tmp_path: Path
) -> None:
    """Same inputs give the same report and records, byte for byte, except the host-speed fields.

    Runs agg_rr_pressure (closed loop, preemption) once more, outside the
    session's cache, and compares with the cached run.
    """
    runs = [servesim_runs.get("agg_rr_pressure"), ServesimRuns(tmp_path).get("agg_rr_pressure")]
    texts = [
        (
            json.dumps(
                {k: v for k, v in r.summary.items() if k not in HOST_SPEED_KEYS}, sort_keys=True
            ),
            r.records_jsonl,
        )
        for r in runs
    ]
    assert texts[0] == texts[1]
