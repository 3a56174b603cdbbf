"""Running a scenario through servesim's CLI, once per scenario and mode.

The reference comparisons (summary, keys, per-request records) and the
fast-forward check all need the same replays; the ``servesim_runs`` fixture
(``conftest.py``) shares one :class:`ServesimRuns` across the session, so
each scenario runs once and ``tests/scenarios`` stays fast.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from servesim.cli import main
from tests.scenarios.harness import Json, load_scenario, servesim_argv


@dataclass(frozen=True)
class ServesimRun:
    """What servesim reported for a scenario: its summary, per-request records (parsed and as
    written) and the report's other sections (``telemetry``)."""

    summary: Json
    records: list[Json]
    records_jsonl: bytes
    sections: Json


class ServesimRuns:
    """Runs scenarios through servesim's CLI on demand and remembers the results."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._done: dict[tuple[str, bool, int | None], ServesimRun] = {}

    def get(self, name: str, *, exact_passes: bool = False, seed: int | None = None) -> ServesimRun:
        """The run of scenario ``name`` (with ``--exact-passes``, or a ``--seed``, if asked), made once."""
        key = (name, exact_passes, seed)
        if key not in self._done:
            suffix = ("-exact" if exact_passes else "") + ("" if seed is None else f"-seed{seed}")
            workdir = self._root / f"{name}{suffix}"
            workdir.mkdir()
            report, jsonl = workdir / "report.json", workdir / "requests.jsonl"
            argv = [
                *servesim_argv(load_scenario(name), workdir, report),
                "--per-request-jsonl",
                str(jsonl),
            ]
            if exact_passes:
                argv.append("--exact-passes")
            if seed is not None:
                argv += ["--seed", str(seed)]
            assert main(argv) == 0, f"servesim failed on {name}: {argv}"
            raw = jsonl.read_bytes()
            records = [json.loads(line) for line in raw.splitlines()]
            sections = json.loads(report.read_text())
            summary = sections.pop("summary")
            self._done[key] = ServesimRun(summary, records, raw, sections)
        return self._done[key]
