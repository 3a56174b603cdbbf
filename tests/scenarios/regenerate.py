"""Regenerate the stored reference outputs in ``tests/scenarios/reference/``.

Run from the repository root, with the reference installed
(``../shared/reference/setup.sh .reference-venv``)::

    .venv/bin/python -m tests.scenarios.regenerate [NAME ...] [--runs 30]

For each scenario (all, or the named ones) it runs the reference through
``refcheck.py reference`` in the reference's virtual environment, on the
scenario copy with its paths pointing into ``tests/data/``, so the reference
reads exactly the bytes the tests give servesim. Then:

- round-robin scenarios: it runs the reference twice, checks the two runs
  agree (summary but for host-speed keys, reduced per-request records and
  the telemetry and planner sections), and writes ``<name>.summary.json``
  and ``<name>.requests.json`` (and ``<name>.telemetry.json`` with
  telemetry, ``<name>.planner.json`` with a planner: planner scenarios need
  the reference's planner packages, ``--venv`` of a venv set up with
  ``setup.sh VENV --with-planner``);
- KV-router scenarios: it runs the reference ``--runs`` times (its tie-breaks
  are random and unseeded) and writes ``<name>.spread.json``: the minimum
  and maximum of every numeric summary key over the runs, and each
  non-numeric key (which must be the same in every run) as both.

One reference process at a time; each takes from a fraction of a second to
a few seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.scenarios.harness import (
    HOST_SPEED_KEYS,
    IDENTITY_FIELDS,
    Json,
    Row,
    Scenario,
    load_scenarios,
    reduce_records,
    with_absolute_paths,
    write_records,
)

REPO = Path(__file__).resolve().parents[2]


def run_reference(
    sc: Scenario, python: Path, refcheck: Path, workdir: Path, *, requests: bool
) -> tuple[Json, list[Json], Json]:
    """One reference run: its summary, (with ``requests``) its per-request records, and its
    other sections (``telemetry``, ``planner``: those the scenario asks for)."""
    scenario = workdir / f"{sc.name}.json"
    scenario.write_text(json.dumps(with_absolute_paths(sc.spec)))
    out, records = workdir / "summary.json", workdir / "requests.jsonl"
    argv = [str(python), str(refcheck), "reference", str(scenario), str(out)]
    if requests:
        argv += ["--requests", str(records)]
    env = {**os.environ, "RUST_LOG": "error", "DYN_LOG": "error"}
    subprocess.run(argv, check=True, env=env, cwd=workdir)
    report = json.loads(out.read_text())
    rows = [json.loads(line) for line in records.read_text().splitlines()] if requests else []
    sections = {key: report[key] for key in ("telemetry", "planner") if key in report}
    return report["summary"], rows, sections


def check_identities(sc: Scenario, records: list[Json]) -> None:
    """Refuse records whose arrival order would depend on the reference's random uuids.

    Session and turn tell apart turns that arrive together (see ``reduce_records``).
    """
    seen: dict[tuple[Any, ...], str] = {}
    for rec in records:
        ident = (*(rec[f] for f in IDENTITY_FIELDS), rec.get("session_id"), rec.get("turn_index"))
        if ident in seen and not (
            rec["uuid"].startswith("00000000-") and seen[ident].startswith("00000000-")
        ):
            raise SystemExit(f"{sc.name}: two requests share {ident}; arrival order is ambiguous")
        seen[ident] = rec["uuid"]


def without_host_keys(summary: Json) -> Json:
    """The summary without the keys that measure the host's speed."""
    return {k: v for k, v in summary.items() if k not in HOST_SPEED_KEYS}


def same_summary(a: Json, b: Json) -> bool:
    """Whether two runs' summaries agree but for host-speed keys.

    Floats may differ in their last bits: the reference sums its means and
    deviations in an order that changes from run to run (seen: 2e-15
    relative on agg_rr_mooncake's mean TTFT).
    """
    a, b = without_host_keys(a), without_host_keys(b)
    return a.keys() == b.keys() and all(
        math.isclose(a[k], b[k], rel_tol=1e-12) if isinstance(a[k], float) else a[k] == b[k]
        for k in a
    )


def same_values(a: Any, b: Any) -> bool:
    """Whether two JSON values agree, floats to 1e-12 relative (the reference's FPM variances
    come out of its hash maps in an order that changes from run to run: 1e-16 apart)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def regenerate_deterministic(sc: Scenario, python: Path, refcheck: Path) -> None:
    """Store the summary and reduced records of a round-robin scenario, after checking two runs agree."""
    outputs: list[tuple[Json, list[Row], Json]] = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as tmp:
            summary, records, telemetry = run_reference(
                sc, python, refcheck, Path(tmp), requests=True
            )
        check_identities(sc, records)
        outputs.append((summary, reduce_records(records), telemetry))
    (s1, r1, t1), (s2, r2, t2) = outputs
    if not same_summary(s1, s2) or r1 != r2 or not same_values(t1, t2):
        raise SystemExit(f"{sc.name}: two reference runs differ; it is not deterministic")
    sc.summary_path.write_text(json.dumps({"summary": s1}, indent=1, sort_keys=True) + "\n")
    write_records(sc.requests_path, r1)
    for wanted, key, path in (
        (sc.telemetry, "telemetry", sc.telemetry_path),
        (sc.planner, "planner", sc.planner_path),
    ):
        if not wanted:
            continue
        if key not in t1:
            raise SystemExit(f"{sc.name}: the reference wrote no {key} section")
        path.write_text(json.dumps(t1[key], indent=1, sort_keys=True) + "\n")
    print(f"{sc.name}: summary ({len(s1)} keys) and {len(r1)} records", flush=True)


def spread_of(sc: Scenario, summaries: list[Json]) -> Json:
    """Minimum and maximum of each key over ``summaries`` (non-numeric keys must not vary)."""
    low: Json = {}
    high: Json = {}
    for key in sorted(summaries[0]):
        values = [s[key] for s in summaries]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            low[key], high[key] = min(values), max(values)
        elif all(v == values[0] for v in values):
            low[key] = high[key] = values[0]
        else:
            raise SystemExit(f"{sc.name}: non-numeric key {key} varies across runs: {values}")
    return {"runs": len(summaries), "min": low, "max": high}


def regenerate_spread(sc: Scenario, python: Path, refcheck: Path, runs: int) -> None:
    """Store the range of every summary key over ``runs`` reference runs of a KV-router scenario."""
    summaries = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            summary, _, _ = run_reference(sc, python, refcheck, Path(tmp), requests=False)
        summaries.append(summary)
        print(f"{sc.name}: run {i + 1}/{runs}", flush=True)
    spread = spread_of(sc, summaries)
    sc.spread_path.write_text(json.dumps(spread, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and regenerate the chosen scenarios' outputs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="scenarios to regenerate (default: all)")
    parser.add_argument(
        "--runs", type=int, default=30, help="reference runs per KV-router scenario (30)"
    )
    parser.add_argument("--venv", type=Path, default=REPO / ".reference-venv")
    parser.add_argument(
        "--refcheck", type=Path, default=REPO.parent / "shared" / "reference" / "refcheck.py"
    )
    args = parser.parse_args(argv)
    scenarios = [sc for sc in load_scenarios() if not args.names or sc.name in args.names]
    unknown = set(args.names) - {sc.name for sc in scenarios}
    if unknown:
        parser.error(f"no such scenarios: {sorted(unknown)}")
    python = (args.venv / "bin" / "python").absolute()
    refcheck = args.refcheck.resolve()
    for sc in scenarios:
        if sc.kv_router:
            regenerate_spread(sc, python, refcheck, args.runs)
        else:
            regenerate_deterministic(sc, python, refcheck)
    return 0


if __name__ == "__main__":
    sys.exit(main())
