"""Sweeps: one replay per point of a grid of settings, in parallel, resumable.

A sweep file (YAML or JSON; ``docs/capacity-planning.md``) holds:

- ``workload`` and ``fixed``: settings every point shares (:mod:`servesim.settings`);
- ``axes``: settings key -> values: a list, an inclusive range ``{from, to, step}``,
  or, under any label, ``{zip: {key: values, ...}}`` (the lists advance together);
  the points are the product of the axes, the first axis outermost;
- or ``grids``: a list of ``{fixed, axes}``, whose points follow one another (an
  aggregated grid, then a P/D one...);
- ``output``: the results directory (default: beside the file, named after it).

Each point is keyed by a hash of its resolved settings, its input files' contents and
servesim's version (:func:`~servesim.provenance.config_key`). Finished points are
appended to ``results.jsonl`` in the output directory as they end; a rerun skips
those, and the table (``results.csv``, ``results.parquet``) is written, in point
order, once every point is done.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from servesim import __version__
from servesim.errors import ConfigError, ServesimError
from servesim.metrics.report import atomic_write
from servesim.provenance import config_key, file_digest, resolved_settings
from servesim.settings import check_key, config_from_settings, load_document, with_setting
from servesim.simulation import RunConfig, run

if TYPE_CHECKING:
    import pyarrow

WALL_TIME_COLUMNS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")
"""Columns that measure the simulator on its host: the only ones two runs of a sweep
may differ in."""

_SPEC_KEYS = ("workload", "fixed", "axes", "grids", "output")
_GRID_KEYS = ("fixed", "axes")


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis: the settings ``keys`` it sets (one, or several zipped) and its
    ``values``, one tuple (a value per key) per step."""

    label: str
    keys: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True, slots=True)
class Grid:
    """Settings ``fixed`` for this grid, and the axes whose product are its points."""

    fixed: dict[str, Any]
    axes: tuple[Axis, ...]


@dataclass(frozen=True, slots=True)
class Point:
    """One point: its index in the sweep, its full settings and its axis values."""

    index: int
    settings: dict[str, Any]
    values: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A parsed sweep file: the settings every point shares, its grids, the output
    directory, and ``source`` (the file, for messages)."""

    base: dict[str, Any]
    grids: tuple[Grid, ...]
    output: Path
    source: str = "sweep"

    @property
    def axis_keys(self) -> list[str]:
        """Every key an axis sets, in the order the grids name them."""
        keys: list[str] = []
        for grid in self.grids:
            for axis in grid.axes:
                keys += [k for k in axis.keys if k not in keys]
        return keys

    def points(self) -> list[Point]:
        """Every point, grid by grid, each grid's first axis outermost."""
        out: list[Point] = []
        for grid in self.grids:
            for combo in product(*(axis.values for axis in grid.axes)):
                settings = merge_settings(self.base, grid.fixed)
                values: dict[str, Any] = {}
                for axis, step in zip(grid.axes, combo, strict=True):
                    for key, value in zip(axis.keys, step, strict=True):
                        settings = with_setting(settings, key, value)
                        values[key] = value
                out.append(Point(len(out), settings, values))
        return out


# ----- the sweep file -----


def parse_spec(document: Any, *, source: str, base_dir: Path, default_output: Path) -> SweepSpec:
    """A sweep file's content, checked: every key known, every axis non-empty.

    ``base_dir`` is where relative trace paths and the output directory are taken
    from (the file's directory); ``default_output`` is the output without ``output``.

    Raises:
        ConfigError: naming ``source``, the place in the file and what was expected.
    """
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: expected an object with {', '.join(_SPEC_KEYS)}")
    _known(document, _SPEC_KEYS, source, "")
    base: dict[str, Any] = {}
    for section in ("workload", "fixed"):
        base = merge_settings(base, settings_section(document.get(section, {}), source, section))
    if "trace" in base:
        base["trace"] = relative_traces(base["trace"], base_dir, f"{source}: trace")
    if ("axes" in document) == ("grids" in document):
        raise ConfigError(f"{source}: give 'axes' (one grid) or 'grids' (a list of them)")
    raw_grids = document["grids"] if "grids" in document else [{"axes": document["axes"]}]
    if not isinstance(raw_grids, list) or not raw_grids:
        raise ConfigError(f"{source}: 'grids' must be a non-empty list of {{fixed, axes}}")
    grids = []
    for i, raw in enumerate(raw_grids):
        where = f"grids[{i}]" if "grids" in document else ""
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: {where}: expected an object with fixed and axes")
        _known(raw, _GRID_KEYS, source, where)
        fixed = settings_section(raw.get("fixed", {}), source, _join(where, "fixed"))
        if "trace" in fixed:
            fixed["trace"] = relative_traces(fixed["trace"], base_dir, f"{source}: trace")
        grids.append(Grid(fixed, _axes(raw.get("axes"), source, _join(where, "axes"), base_dir)))
    out_dir = default_output
    if "output" in document:
        out_dir = _output_dir(document["output"], source, base_dir)
    return SweepSpec(base=base, grids=tuple(grids), output=out_dir, source=source)


def load_spec(path: Path, *, output: Path | None = None) -> SweepSpec:
    """Read and check a sweep file (YAML or JSON).

    Raises:
        ConfigError: the file cannot be read, or is not a valid sweep (naming the place).
    """
    document = load_document(path, what="sweep file")
    spec = parse_spec(
        document,
        source=str(path),
        base_dir=path.parent,
        default_output=path.parent / f"{path.stem}.sweep",
    )
    return spec if output is None else replace(spec, output=output)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _known(raw: Mapping[str, Any], allowed: Sequence[str], source: str, where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(
                f"{source}: {_join(where, str(key))}: unknown key (expected {', '.join(allowed)})"
            )


def settings_section(raw: Any, source: str, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {where}: expected an object of settings, got {raw!r}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        check_key(str(key), where=f"{source}: {where}")
        out = with_setting(out, str(key), value)
    return out


def merge_settings(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_settings(out[key], value)
        else:
            out[key] = value
    return out


def relative_traces(trace: Any, base_dir: Path, where: str) -> Any:
    """Trace paths in a file are relative to the file's directory."""
    paths = trace if isinstance(trace, list) else [trace]
    if not all(isinstance(p, str) and p for p in paths):
        raise ConfigError(f"{where}: expected a file name or a list of them, got {trace!r}")
    resolved = [p if p == "-" or Path(p).is_absolute() else str(base_dir / p) for p in paths]
    return resolved if isinstance(trace, list) else resolved[0]


def _output_dir(raw: Any, source: str, base_dir: Path) -> Path:
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{source}: output: expected a directory name, got {raw!r}")
    return base_dir / raw


def _axes(raw: Any, source: str, where: str, base_dir: Path) -> tuple[Axis, ...]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{source}: {where}: expected an object of axes (key: values)")
    axes = []
    for label, spec in raw.items():
        place = f"{where}.{label}"
        if isinstance(spec, dict) and "zip" in spec:
            if set(spec) != {"zip"}:
                raise ConfigError(f"{source}: {place}: a zipped axis takes only 'zip'")
            members = spec["zip"]
            if not isinstance(members, dict) or len(members) < 1:
                raise ConfigError(f"{source}: {place}.zip: expected an object of key: values")
            columns = {}
            for key, values in members.items():
                check_key(str(key), where=f"{source}: {place}.zip")
                columns[str(key)] = axis_values(values, source, f"{place}.zip.{key}")
            lengths = {key: len(v) for key, v in columns.items()}
            if len(set(lengths.values())) != 1:
                shown = ", ".join(f"{k} has {n}" for k, n in lengths.items())
                raise ConfigError(
                    f"{source}: {place}.zip: zipped lists must have one length ({shown})"
                )
            keys = tuple(columns)
            steps = tuple(zip(*columns.values(), strict=True))
        else:
            check_key(str(label), where=f"{source}: {where}")
            keys = (str(label),)
            steps = tuple((v,) for v in axis_values(spec, source, place))
        if "trace" in keys:
            i = keys.index("trace")
            steps = tuple(
                (*s[:i], relative_traces(s[i], base_dir, f"{source}: {place}"), *s[i + 1 :])
                for s in steps
            )
        axes.append(Axis(str(label), keys, steps))
    return tuple(axes)


def axis_values(spec: Any, source: str, place: str) -> list[Any]:
    """An axis's values: a non-empty list, or an inclusive range ``{from, to, step}``."""
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{source}: {place}: empty axis (give at least one value)")
        return spec
    if isinstance(spec, dict) and set(spec) <= {"from", "to", "step"} and "from" in spec:
        return _range(spec, source, place)
    raise ConfigError(
        f"{source}: {place}: expected a list of values, a range {{from, to, step}} or "
        f"{{zip: {{key: values}}}}, got {spec!r} (a single value goes under 'fixed')"
    )


def _range(spec: dict[str, Any], source: str, place: str) -> list[Any]:
    start, stop, step = spec.get("from"), spec.get("to"), spec.get("step", 1)
    numbers = (start, stop, step)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
        raise ConfigError(f"{source}: {place}: a range needs numbers from, to (and step)")
    assert isinstance(start, (int, float)) and isinstance(stop, (int, float))
    assert isinstance(step, (int, float))
    if not all(math.isfinite(v) for v in (start, stop, step)) or step <= 0:
        raise ConfigError(f"{source}: {place}: a range's step must be a finite number > 0")
    if stop < start:
        raise ConfigError(f"{source}: {place}: empty axis (from {start} is above to {stop})")
    count = math.floor((stop - start) / step + 1e-9) + 1
    if all(isinstance(v, int) for v in numbers):
        return [start + i * step for i in range(count)]
    return [round(start + i * step, 12) for i in range(count)]


# ----- running points -----


@dataclass(frozen=True, slots=True)
class Task:
    """What a worker needs to run one point: its resolved settings (with the trace
    paths as recorded) and, where the trace was shipped to it, the local copies."""

    index: int
    settings: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A point's result: its summary, or the error that stopped it."""

    index: int
    summary: dict[str, Any] | None
    error: str | None
    seconds: float


def run_task(task: Task, local_traces: Mapping[str, str] | None = None) -> Outcome:
    """Replay one point (in any process: it reads only ``task`` and its trace files).

    ``local_traces`` maps a recorded trace path to a copy to read instead (Ray).
    Never raises for a point that fails: the error is the outcome.
    """
    started = time.perf_counter()
    try:
        settings = task.settings
        if local_traces and settings.get("trace"):
            settings = {**settings, "trace": [local_traces[p] for p in settings["trace"]]}
        config = replace(config_from_settings(settings, source="point"), keep_records=False)
        summary = run(config).summary
        return Outcome(task.index, summary, None, time.perf_counter() - started)
    except ServesimError as exc:
        return Outcome(task.index, None, str(exc), time.perf_counter() - started)
    except Exception as exc:  # a bug: recorded with the point, the sweep goes on
        return Outcome(
            task.index, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
        )


Runner = Callable[[Sequence[Task], Callable[[Outcome], None]], None]
"""Runs tasks, calling back with each outcome as it ends (in any order)."""


def _ignore_interrupts() -> None:
    """A worker process leaves Ctrl-C to the sweep, which stops it (no traceback each)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def local_runner(jobs: int) -> Runner:
    """Tasks in this process (``jobs`` 1) or in up to ``jobs`` worker processes."""

    def execute(tasks: Sequence[Task], done: Callable[[Outcome], None]) -> None:
        if jobs == 1 or len(tasks) <= 1:
            for task in tasks:
                done(run_task(task))
            return
        # Loaded here: a replay that sweeps nothing does not pay for them at start-up.
        from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
        from multiprocessing import get_context

        pool = ProcessPoolExecutor(
            max_workers=min(jobs, len(tasks)),
            mp_context=get_context("spawn"),
            initializer=_ignore_interrupts,
        )
        try:
            pending: set[Future[Outcome]] = {pool.submit(run_task, t) for t in tasks}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(finished, key=lambda f: f.result().index):
                    done(future.result())
        except BaseException:
            # Interrupted (or the callback failed): stop the points still running.
            for process in list(pool._processes.values()):
                process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()

    return execute


@contextmanager
def runner_for(jobs: int, ray: str | bool | None) -> Iterator[Runner]:
    """Local processes (``ray`` None or False), or a Ray session (True: a local instance;
    or a cluster's address) for as long as the ``with`` lasts."""
    if ray is None or ray is False:
        yield local_runner(jobs)
        return
    from servesim.ray_runner import ray_session

    with ray_session(None if ray is True else str(ray), cpus=jobs) as runner:
        yield runner


# ----- the table -----


@dataclass(frozen=True, slots=True)
class Table:
    """Rows of named columns (no pandas): a sweep's results, one row per point.

    ``to_arrow()`` gives a :class:`pyarrow.Table`; ``write_csv`` and
    ``write_parquet`` write it.
    """

    columns: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def column(self, name: str) -> list[Any]:
        """One column's values, row by row (None where a row has none)."""
        if name not in self.columns:
            raise KeyError(name)
        return [row.get(name) for row in self.rows]

    def drop(self, names: Iterable[str]) -> Table:
        """The table without the columns ``names`` (those it has)."""
        gone = set(names)
        kept = tuple(c for c in self.columns if c not in gone)
        return Table(kept, tuple({c: r.get(c) for c in kept} for r in self.rows))

    def to_arrow(self) -> pyarrow.Table:
        """The table as a :class:`pyarrow.Table`, its columns in order."""
        import pyarrow as pa

        arrays = {c: pa.array([r.get(c) for r in self.rows]) for c in self.columns}
        return pa.table(arrays)

    def csv_text(self) -> str:
        """The table as CSV: a header, then a line per row (empty where null)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(self.columns)
        for row in self.rows:
            writer.writerow(["" if row.get(c) is None else _cell(row.get(c)) for c in self.columns])
        return buffer.getvalue()

    def write_csv(self, path: Path) -> None:
        """Write :meth:`csv_text` whole (or not at all)."""
        atomic_write(path, [self.csv_text()])

    def write_parquet(self, path: Path) -> None:
        """Write the table as Parquet, whole (or not at all)."""
        import pyarrow.parquet as pq

        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            pq.write_table(self.to_arrow(), tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flat(value: Any) -> Any:
    """A table cell: scalars as they are, objects and lists as JSON text."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return value


def gpus(config: RunConfig) -> int:
    """GPUs a configuration occupies: workers times tensor parallel size times DP ranks."""
    if config.disaggregated:
        assert config.prefill_engine is not None and config.decode_engine is not None
        return (
            config.num_prefill_workers * config.prefill_engine.gpus_per_worker
            + config.num_decode_workers * config.decode_engine.gpus_per_worker
        )
    return config.num_workers * config.engine.gpus_per_worker


# ----- a sweep -----


@dataclass(frozen=True, slots=True)
class Resolved:
    """A point made concrete: its config (None when its settings are invalid), the
    resolved settings, its inputs and key, or the error that made it invalid."""

    point: Point
    config: RunConfig | None
    settings: dict[str, Any]
    inputs: list[dict[str, Any]]
    key: str
    error: str | None = None


def resolve(points: Sequence[Point], *, version: str) -> list[Resolved]:
    """Each point's resolved settings and key; an input file is hashed once.

    A point whose values are invalid (not its keys: the file parser checked
    those) is kept, with its error, to be recorded as a failed point.
    """
    digests: dict[str, dict[str, Any]] = {}
    out = []
    for point in points:
        try:
            config = config_from_settings(point.settings, source=f"point {point.index}")
        except ConfigError as exc:
            key = config_key(point.settings, [], version)
            out.append(Resolved(point, None, point.settings, [], key, str(exc)))
            continue
        settings = resolved_settings(config)
        inputs = []
        for name in settings.get("trace") or []:
            if name not in digests:
                try:
                    digests[name] = file_digest(Path(name))
                except OSError as exc:
                    raise ConfigError(f"cannot read the trace {name}: {exc.strerror}") from None
            inputs.append(digests[name])
        out.append(Resolved(point, config, settings, inputs, config_key(settings, inputs, version)))
    return out


def row(item: Resolved, record: Mapping[str, Any], axis_keys: Sequence[str]) -> dict[str, Any]:
    """A point's table row: its index and status, axis values, GPUs, GPU-hours, goodput,
    every summary key, then its provenance (version, seed, inputs, key, settings)."""
    summary = record.get("summary") or {}
    out: dict[str, Any] = {
        "point": item.point.index,
        "status": "failed" if record.get("error") else "ok",
        "error": record.get("error"),
    }
    out.update({key: _flat(item.point.values.get(key)) for key in axis_keys})
    out["gpus"] = None if item.config is None else gpus(item.config)
    out["gpu_hours"] = summary.get("gpu_hours")
    out["goodput_rps"] = summary.get("goodput_request_throughput_rps")
    completed = summary.get("completed_requests")
    good = summary.get("goodput_completed_requests")
    out["sla_attainment"] = None if good is None or not completed else good / completed
    out.update({k: _flat(v) for k, v in summary.items() if k not in out})
    out["servesim_version"] = record.get("servesim_version")
    out["seed"] = item.settings.get("seed")
    out["inputs"] = _flat(item.inputs)
    out["key"] = item.key
    out["config"] = json.dumps(item.settings, sort_keys=True)
    return out


def table_of(rows: Sequence[dict[str, Any]]) -> Table:
    """A table of rows whose keys may differ (a failed point has no summary): the
    columns are every key, in the order the rows first give them."""
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    # Provenance columns last, whatever summary keys a later row adds.
    tail = ("servesim_version", "seed", "inputs", "key", "config")
    ordered = [c for c in columns if c not in tail] + [c for c in tail if c in columns]
    return Table(tuple(ordered), tuple(rows))


@dataclass(frozen=True, slots=True)
class SweepProgress:
    """Where a sweep is: points ``done`` (this run and before) of ``total``, ``failed``,
    ``ran`` this run, and the estimated seconds left (None until a point ends)."""

    done: int
    total: int
    failed: int
    ran: int
    eta_s: float | None
    last: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SweepResult:
    """A finished sweep: its table, the points run now and those found done before,
    and where the table was written."""

    table: Table
    ran: int
    skipped: int
    failed: int
    output: Path
    files: tuple[Path, ...] = field(default=())


def sweep(
    spec: SweepSpec | str | os.PathLike[str],
    *,
    jobs: int | None = None,
    ray: str | bool | None = None,
    output: str | os.PathLike[str] | None = None,
    retry_failed: bool = False,
    progress: Callable[[SweepProgress], None] | None = None,
) -> SweepResult:
    """Run every point of a sweep not already done, then write its table.

    Args:
        spec: a sweep file's path, or a parsed :class:`SweepSpec`.
        jobs: local worker processes (default: the machine's cores).
        ray: run the points as Ray tasks: True (a local Ray instance) or a cluster's
            address; ``jobs`` then caps a local instance's CPUs.
        output: the results directory (default: the spec's).
        retry_failed: run again the points recorded as failed.
        progress: called after each point ends.

    Raises:
        ConfigError: a bad sweep file, an unreadable trace, or Ray unavailable.
    """
    if not isinstance(spec, SweepSpec):
        spec = load_spec(Path(spec), output=None if output is None else Path(output))
    elif output is not None:
        spec = replace(spec, output=Path(output))
    workers = jobs or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"--jobs must be at least 1, got {workers}")
    with runner_for(workers, ray) as runner:  # Ray refused before any output is written
        return _run(spec, runner, retry_failed=retry_failed, progress=progress)


def _run(
    spec: SweepSpec,
    runner: Runner,
    *,
    retry_failed: bool,
    progress: Callable[[SweepProgress], None] | None,
) -> SweepResult:
    items = resolve(spec.points(), version=__version__)
    log = spec.output / "results.jsonl"
    records = _read_log(log)
    todo = [
        i for i in items if i.key not in records or (retry_failed and records[i.key].get("error"))
    ]
    skipped = len(items) - len(todo)
    spec.output.mkdir(parents=True, exist_ok=True)
    by_index = {i.point.index: i for i in todo}
    started = time.monotonic()
    ran = 0
    total = len(items)
    done_before = len(items) - len(todo)
    with log.open("a", encoding="utf-8") as handle:

        def finished(outcome: Outcome) -> None:
            nonlocal ran
            item = by_index[outcome.index]
            record = {
                "key": item.key,
                "point": item.point.index,
                "error": outcome.error,
                "summary": outcome.summary,
                "seconds": round(outcome.seconds, 3),
                "servesim_version": __version__,
            }
            records[item.key] = record
            _append(handle, record)
            ran += 1
            if progress is not None:
                elapsed = time.monotonic() - started
                left = len(todo) - ran
                failed = sum(1 for i in items if records.get(i.key, {}).get("error"))
                progress(
                    SweepProgress(
                        done=done_before + ran,
                        total=total,
                        failed=failed,
                        ran=ran,
                        eta_s=elapsed / ran * left,
                        last=row(item, record, spec.axis_keys),
                    )
                )

        for item in todo:  # invalid settings: recorded without running
            if item.config is None:
                finished(Outcome(item.point.index, None, item.error, 0.0))
        tasks = [Task(i.point.index, i.settings) for i in todo if i.config is not None]
        runner(tasks, finished)
    rows = [row(i, records[i.key], spec.axis_keys) for i in items]
    table = table_of(rows)
    csv_path, parquet_path = spec.output / "results.csv", spec.output / "results.parquet"
    table.write_csv(csv_path)
    table.write_parquet(parquet_path)
    failed = sum(1 for r in rows if r["status"] == "failed")
    return SweepResult(table, ran, skipped, failed, spec.output, (csv_path, parquet_path))


def _append(handle: TextIO, record: Mapping[str, Any]) -> None:
    handle.write(json.dumps(record, sort_keys=True) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def _read_log(path: Path) -> dict[str, dict[str, Any]]:
    """The points a sweep's log holds, by key (a later line wins). A last line cut
    short by a kill is dropped (and cut from the file)."""
    if not path.exists():
        return {}
    records: dict[str, dict[str, Any]] = {}
    good = 0
    with path.open("rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            good += len(line) + 1
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if number == len(lines):  # the interrupted last write
                with path.open("r+b") as handle:
                    handle.truncate(good)
                break
            raise ConfigError(
                f"{path}: line {number} is not a result record; remove the file to start over"
            ) from None
        if not isinstance(record, dict) or "key" not in record:
            raise ConfigError(f"{path}: line {number} is not a result record")
        records[record["key"]] = record
        good += len(line) + 1
    return records
