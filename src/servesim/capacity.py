"""Search: the deployment with the fewest GPUs (or GPU-hours) that meets an SLA.

A search file (YAML or JSON; ``docs/capacity-planning.md``) holds ``workload`` and
``fixed`` settings (as a sweep file's), ``sla`` (percentile targets such as
``p99_ttft_ms: 2000``), optionally ``min_goodput`` (the share of arrived requests
that must meet every SLA bound, each request judged on its own), ``objective``
(``gpus`` or ``gpu_hours``) and ``space``: total ``workers`` (a range), ``routers``,
``aggregated`` (true or false), ``pd_splits`` (``"1:3"``: prefill to decode workers),
``tensor_parallel_size`` and ``dp_size`` (lists).

Each combination of router, deployment shape, TP and DP is a *family*; within one,
more workers never make latency worse (the search assumes it), so the fewest that
meet the SLA is found by bisection on the count: the largest count first (a family
that misses there misses everywhere), then halving. Every family's bisection advances
in the same batch of replays, which run in parallel as a sweep's points do.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim import __version__
from servesim.errors import ConfigError, ServesimError
from servesim.settings import load_document, with_setting
from servesim.sweeps import (
    Outcome,
    Point,
    Resolved,
    Runner,
    Table,
    Task,
    axis_values,
    merge_settings,
    relative_traces,
    resolve,
    row,
    runner_for,
    settings_section,
    table_of,
)

_SPEC_KEYS = ("workload", "fixed", "sla", "min_goodput", "objective", "space")
_SPACE_KEYS = ("workers", "routers", "aggregated", "pd_splits", "tensor_parallel_size", "dp_size")
_METRICS = {
    "ttft": "ttft_ms",
    "ttst": "ttst_ms",
    "itl": "itl_ms",
    "tpot": "tpot_ms",
    "e2e": "e2e_latency_ms",
    "e2e_latency": "e2e_latency_ms",
}
_STATS = ("mean", "median", "p50", "p75", "p90", "p95", "p99", "max")
_TARGET = re.compile(r"^(?P<stat>[a-z0-9]+)_(?P<metric>[a-z0-9_]+?)(?:_ms)?$")
_SLA_BOUND = {"ttft_ms": "sla_ttft_ms", "itl_ms": "sla_itl_ms", "e2e_latency_ms": "sla_e2e_ms"}
OBJECTIVES = ("gpus", "gpu_hours")


class NoFeasibleConfiguration(ServesimError):
    """No point of the search space meets the targets; ``result`` holds every point tried."""

    def __init__(self, message: str, result: SearchResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True, slots=True)
class Target:
    """One SLA target: a summary key (``p99_ttft_ms``) and its upper bound (ms)."""

    key: str
    limit: float

    def __str__(self) -> str:
        return f"{self.key} <= {self.limit:g}"


def parse_target(name: str, value: Any, *, source: str) -> Target:
    """A target from a search file's ``sla`` entry.

    Raises:
        ConfigError: an unknown metric, no percentile (or statistic), or a bad bound.
    """
    stats = ", ".join(_STATS)
    match = _TARGET.match(name)
    metric = match["metric"] if match else name.removesuffix("_ms")
    if match is not None and re.fullmatch(r"p\d+", match["stat"]) and match["stat"] not in _STATS:
        raise ConfigError(
            f"{source}: sla.{name}: the summary has no {match['stat']} (statistics: {stats})"
        )
    if match is None or match["stat"] not in _STATS:
        bare = name.removesuffix("_ms")
        if bare in _METRICS or metric in _METRICS:
            raise ConfigError(
                f"{source}: sla.{name}: an SLA target needs a percentile or statistic "
                f"({stats}), e.g. p99_{_METRICS.get(bare, 'ttft_ms')}"
            )
        raise ConfigError(
            f"{source}: sla.{name}: expected STAT_METRIC such as p99_ttft_ms (STAT: {stats}; "
            f"METRIC: {', '.join(_METRICS)})"
        )
    if metric not in _METRICS:
        raise ConfigError(
            f"{source}: sla.{name}: unknown metric '{metric}' (expected one of {', '.join(_METRICS)})"
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{source}: sla.{name}: expected a bound in ms > 0, got {value!r}")
    stat = "median" if match["stat"] == "p50" else match["stat"]
    return Target(f"{stat}_{_METRICS[metric]}", float(value))


@dataclass(frozen=True, slots=True)
class Family:
    """Deployments that differ only in their worker count: a router, a shape
    (``aggregated`` or a P/D split ``(prefill, decode)``), TP and DP per worker."""

    router: str
    split: tuple[int, int] | None
    tp: int
    dp: int

    @property
    def step(self) -> int:
        """Workers one count adds: 1 aggregated, prefill + decode for a split."""
        return 1 if self.split is None else sum(self.split)

    def label(self, count: int) -> str:
        """``kv_router, 3P+9D, TP1 DP1`` or ``round_robin, 8 workers, TP1 DP1``."""
        if self.split is None:
            shape = f"{count} aggregated workers"
        else:
            shape = f"{count * self.split[0]}P+{count * self.split[1]}D"
        return f"{self.router}, {shape}, TP{self.tp} DP{self.dp}"

    def settings(self, base: Mapping[str, Any], count: int) -> dict[str, Any]:
        """``base`` with this family's deployment at ``count``."""
        s = dict(base)
        s["router_mode"] = self.router
        engine = s.pop("engine", None) or {}
        if self.split is None:
            for key in (
                "num_prefill_workers",
                "num_decode_workers",
                "prefill_engine",
                "decode_engine",
            ):
                s.pop(key, None)  # the P/D families' settings
            s["num_workers"] = count
            pools = ["engine"]
            s["engine"] = engine
        else:
            s.pop("num_workers", None)
            s["num_prefill_workers"] = count * self.split[0]
            s["num_decode_workers"] = count * self.split[1]
            pools = ["prefill_engine", "decode_engine"]
            for pool in pools:  # engine keys given for every pool, then the pool's own
                s[pool] = merge_settings(engine, s.get(pool) or {})
        for pool in pools:
            s = with_setting(s, f"{pool}.tensor_parallel_size", self.tp)
            s = with_setting(s, f"{pool}.dp_size", self.dp)
        return s


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """A parsed search file."""

    base: dict[str, Any]
    targets: tuple[Target, ...]
    min_goodput: float | None
    objective: str
    families: tuple[Family, ...]
    counts: tuple[tuple[int, ...], ...]
    """Each family's worker counts (multiples of its split), ascending."""
    source: str = "search"


def parse_search(document: Any, *, source: str, base_dir: Path) -> SearchSpec:
    """A search file's content, checked.

    Raises:
        ConfigError: naming ``source``, the place in the file and what was expected.
    """
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: expected an object with {', '.join(_SPEC_KEYS)}")
    for key in document:
        if key not in _SPEC_KEYS:
            raise ConfigError(f"{source}: {key}: unknown key (expected {', '.join(_SPEC_KEYS)})")
    base: dict[str, Any] = {}
    for section in ("workload", "fixed"):
        base = merge_settings(base, settings_section(document.get(section, {}), source, section))
    if "trace" in base:
        base["trace"] = relative_traces(base["trace"], base_dir, f"{source}: trace")
    sla = document.get("sla")
    if not isinstance(sla, dict) or not sla:
        raise ConfigError(f"{source}: sla: expected targets such as {{p99_ttft_ms: 2000}}")
    targets = tuple(parse_target(str(k), v, source=source) for k, v in sla.items())
    min_goodput = document.get("min_goodput")
    if min_goodput is not None and (
        isinstance(min_goodput, bool)
        or not isinstance(min_goodput, (int, float))
        or not 0 < min_goodput <= 1
    ):
        raise ConfigError(f"{source}: min_goodput: expected a share in (0, 1], got {min_goodput!r}")
    for target in targets:  # each request is judged on the same bounds (goodput)
        bound = _SLA_BOUND.get(target.key.split("_", 1)[1])
        if bound is not None and bound not in base:
            base[bound] = target.limit
    objective = document.get("objective", "gpus")
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"{source}: objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}"
        )
    families, counts = _space(document.get("space"), source)
    return SearchSpec(
        base=base,
        targets=targets,
        min_goodput=None if min_goodput is None else float(min_goodput),
        objective=objective,
        families=families,
        counts=counts,
        source=source,
    )


def load_search(path: Path) -> SearchSpec:
    """Read and check a search file (YAML or JSON).

    Raises:
        ConfigError: the file cannot be read, or is not a valid search.
    """
    return parse_search(
        load_document(path, what="search file"), source=str(path), base_dir=path.parent
    )


def _space(raw: Any, source: str) -> tuple[tuple[Family, ...], tuple[tuple[int, ...], ...]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: space: expected an object with {', '.join(_SPACE_KEYS)}")
    for key in raw:
        if key not in _SPACE_KEYS:
            raise ConfigError(
                f"{source}: space.{key}: unknown key (expected {', '.join(_SPACE_KEYS)})"
            )
    if "workers" not in raw:
        raise ConfigError(f"{source}: space.workers: required, e.g. {{from: 1, to: 16}}")
    workers = _ints(raw["workers"], source, "space.workers")
    routers = axis_values(raw.get("routers", ["round_robin"]), source, "space.routers")
    for router in routers:
        if router not in ("round_robin", "kv_router"):
            raise ConfigError(
                f"{source}: space.routers: expected round_robin or kv_router, got {router!r}"
            )
    aggregated = raw.get("aggregated", True)
    if not isinstance(aggregated, bool):
        raise ConfigError(f"{source}: space.aggregated: expected true or false")
    splits: list[tuple[int, int] | None] = [None] if aggregated else []
    for text in raw.get("pd_splits", []) or []:
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(text))
        if match is None or int(match[1]) < 1 or int(match[2]) < 1:
            raise ConfigError(
                f'{source}: space.pd_splits: expected PREFILL:DECODE such as "1:3", got {text!r}'
            )
        splits.append((int(match[1]), int(match[2])))
    if not splits:
        raise ConfigError(f"{source}: space: no deployment shape (aggregated false, no pd_splits)")
    tps = _ints(raw.get("tensor_parallel_size", [1]), source, "space.tensor_parallel_size")
    dps = _ints(raw.get("dp_size", [1]), source, "space.dp_size")
    families, counts = [], []
    for router in routers:
        for split in splits:
            for tp in tps:
                for dp in dps:
                    family = Family(str(router), split, tp, dp)
                    sizes = tuple(
                        sorted({w // family.step for w in workers if w % family.step == 0})
                    )
                    if sizes:
                        families.append(family)
                        counts.append(sizes)
    if not families:
        raise ConfigError(
            f"{source}: space.workers: no worker count fits any P/D split (a split p:d needs "
            "a multiple of p + d workers)"
        )
    return tuple(families), tuple(counts)


def _ints(raw: Any, source: str, place: str) -> list[int]:
    values = axis_values(raw, source, place)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ConfigError(f"{source}: {place}: expected integers >= 1, got {values!r}")
    return sorted(set(values))


# ----- bisection -----


def minimal_feasible(
    sizes: Sequence[int], feasible: Callable[[list[tuple[int, int]]], list[bool]]
) -> list[int | None]:
    """For each family ``f`` of ``sizes[f]`` ascending candidates, the index of the first
    feasible one (None: none is), assuming feasibility is monotone (once feasible, every
    larger candidate is).

    ``feasible`` judges a batch of ``(family, index)`` pairs at once (they may run in
    parallel); each round asks one candidate of every family still undecided: first
    its largest, then the midpoint of what is left, so a family of n candidates takes
    at most 1 + ceil(log2 n) judgements.
    """
    low = [0] * len(sizes)
    high = [n - 1 for n in sizes]
    answer: list[int | None] = [None] * len(sizes)
    top = list(range(len(sizes)))
    verdicts = feasible([(f, high[f]) for f in top])
    active = [f for f, ok in zip(top, verdicts, strict=True) if ok]
    while active:
        asks = [(f, (low[f] + high[f]) // 2) for f in active if low[f] < high[f]]
        if asks:
            for (f, mid), ok in zip(asks, feasible(asks), strict=True):
                if ok:
                    high[f] = mid
                else:
                    low[f] = mid + 1
        for f in active:
            if low[f] == high[f]:
                answer[f] = low[f]
        active = [f for f in active if low[f] < high[f]]
    return answer


# ----- the search -----


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment tried: its family and count, what it costs, what it measured."""

    family: Family
    count: int
    label: str
    gpus: int
    gpu_hours: float | None
    metrics: dict[str, float]
    goodput: float | None
    feasible: bool
    violation: float
    """The worst ratio of a measured value to its bound (below 1: met)."""
    throughput_per_gpu: float | None
    error: str | None
    row: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A finished search: the winner (None: nothing met the targets), the best deployment
    of each other family, the winner's family one count smaller (when tried), the Pareto
    frontier of throughput per GPU against the first target's latency, and every point
    tried (also as a :class:`~servesim.sweeps.Table`)."""

    targets: tuple[Target, ...]
    min_goodput: float | None
    objective: str
    winner: Candidate | None
    runners_up: tuple[Candidate, ...]
    next_smaller: Candidate | None
    frontier: tuple[Candidate, ...]
    evaluated: tuple[Candidate, ...]
    table: Table = field(repr=False)

    def to_json(self) -> str:
        """The result as JSON text (sorted keys, indent 2)."""

        def one(c: Candidate | None) -> dict[str, Any] | None:
            if c is None:
                return None
            return {
                "deployment": c.label,
                "gpus": c.gpus,
                "gpu_hours": c.gpu_hours,
                "metrics": c.metrics,
                "goodput": c.goodput,
                "feasible": c.feasible,
                "violation": c.violation,
                "throughput_per_gpu": c.throughput_per_gpu,
                "error": c.error,
                "config": json.loads(c.row["config"]),
            }

        return (
            json.dumps(
                {
                    "targets": {t.key: t.limit for t in self.targets},
                    "min_goodput": self.min_goodput,
                    "objective": self.objective,
                    "winner": one(self.winner),
                    "runners_up": [one(c) for c in self.runners_up],
                    "next_smaller": one(self.next_smaller),
                    "frontier": [one(c) for c in self.frontier],
                    "evaluated": [one(c) for c in self.evaluated],
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )


def _judge(
    spec: SearchSpec, family: Family, count: int, item: Resolved, record: Mapping[str, Any]
) -> Candidate:
    summary = record.get("summary") or {}
    error = record.get("error")
    metrics = {t.key: float(summary[t.key]) for t in spec.targets if t.key in summary}
    ratios = [metrics[t.key] / t.limit for t in spec.targets if t.key in metrics]
    goodput = None
    if summary.get("num_requests"):
        goodput = summary.get("goodput_completed_requests", 0) / summary["num_requests"]
    if spec.min_goodput is not None:
        ratios.append(math.inf if not goodput else spec.min_goodput / goodput)
    if summary.get("incomplete_requests"):
        ratios.append(math.inf)
    violation = math.inf if error or not ratios else max(ratios)
    table_row = row(item, record, ["deployment"])
    gpus = int(table_row["gpus"] or 0)
    output = summary.get("output_throughput_tok_s")
    return Candidate(
        family=family,
        count=count,
        label=family.label(count),
        gpus=gpus,
        gpu_hours=summary.get("gpu_hours"),
        metrics=metrics,
        goodput=goodput,
        feasible=violation <= 1.0,
        violation=violation,
        throughput_per_gpu=None if output is None or not gpus else output / gpus,
        error=error,
        row=table_row,
    )


def search(
    spec: SearchSpec | str | os.PathLike[str],
    *,
    jobs: int | None = None,
    ray: str | bool | None = None,
    progress: Callable[[Candidate], None] | None = None,
) -> SearchResult:
    """Find the cheapest deployment of ``spec``'s space that meets its targets.

    Args:
        spec: a search file's path, or a parsed :class:`SearchSpec`.
        jobs: local worker processes (default: the cores).
        ray: run the replays as Ray tasks (True: a local instance; or an address).
        progress: called with each deployment once its replay ends.

    Raises:
        NoFeasibleConfiguration: nothing in the space meets the targets (the message
            names the closest deployment).
        ConfigError: a bad search file.
    """

    if not isinstance(spec, SearchSpec):
        spec = load_search(Path(spec))
    workers = jobs or os.cpu_count() or 1
    with runner_for(workers, ray) as runner:
        return _search(spec, runner, progress)


def _search(
    spec: SearchSpec, runner: Runner, progress: Callable[[Candidate], None] | None
) -> SearchResult:
    tried: dict[tuple[int, int], Candidate] = {}

    def feasible(asks: list[tuple[int, int]]) -> list[bool]:
        points: list[Point] = []
        for f, i in asks:
            family, count = spec.families[f], spec.counts[f][i]
            values = {"deployment": family.label(count)}
            points.append(
                Point(len(tried) + len(points), family.settings(spec.base, count), values)
            )
        items = resolve(points, version=__version__)
        records: dict[int, dict[str, Any]] = {}
        for item in items:
            if item.config is None:
                records[item.point.index] = {"error": item.error, "summary": None}

        def done(outcome: Outcome) -> None:
            records[outcome.index] = {
                "error": outcome.error,
                "summary": outcome.summary,
                "servesim_version": __version__,
            }

        runner([Task(i.point.index, i.settings) for i in items if i.config is not None], done)
        verdicts = []
        for (f, i), item in zip(asks, items, strict=True):
            candidate = _judge(
                spec, spec.families[f], spec.counts[f][i], item, records[item.point.index]
            )
            tried[(f, i)] = candidate
            if progress is not None:
                progress(candidate)
            verdicts.append(candidate.feasible)
        return verdicts

    answer = minimal_feasible([len(c) for c in spec.counts], feasible)
    best = [tried[(f, i)] for f, i in enumerate(answer) if i is not None]
    evaluated = tuple(tried.values())

    def cost(c: Candidate) -> tuple[float, ...]:
        hours = c.gpu_hours if c.gpu_hours is not None else math.inf
        first = hours if spec.objective == "gpu_hours" else c.gpus
        return (first, c.gpus, hours, c.violation)

    ranked = sorted(best, key=cost)
    table = table_of([c.row for c in evaluated])
    winner = ranked[0] if ranked else None
    next_smaller = None
    if winner is not None:
        f = spec.families.index(winner.family)
        i = spec.counts[f].index(winner.count)
        next_smaller = tried.get((f, i - 1))
    result = SearchResult(
        targets=spec.targets,
        min_goodput=spec.min_goodput,
        objective=spec.objective,
        winner=winner,
        runners_up=tuple(ranked[1:6]),
        next_smaller=next_smaller,
        frontier=pareto(evaluated),
        evaluated=evaluated,
        table=table,
    )
    if winner is None:
        wanted = " and ".join(str(t) for t in spec.targets)
        if spec.min_goodput is not None:
            wanted += f" with goodput >= {spec.min_goodput:g}"
        closest = min(evaluated, key=lambda c: (c.violation, c.gpus))
        raise NoFeasibleConfiguration(
            f"no configuration meets {wanted}; the closest is {describe(closest)} "
            "(widen the search space, e.g. more workers)",
            result,
        )
    return result


def describe(c: Candidate) -> str:
    """A deployment and what it measured: ``kv_router, 8 aggregated workers, TP1 DP1
    (8 GPUs): p99_ttft_ms 1689, p99_itl_ms 11.4``."""
    if c.error:
        return f"{c.label} ({c.gpus} GPUs): failed: {c.error}"
    measured = ", ".join(f"{k} {v:.4g}" for k, v in c.metrics.items())
    if c.goodput is not None:
        measured += f", goodput {c.goodput:.3f}"
    return f"{c.label} ({c.gpus} GPUs): {measured}"


def pareto(candidates: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """The candidates no other beats on both throughput per GPU (higher) and the first
    target's latency (lower), by latency."""
    ok = [c for c in candidates if c.error is None and c.throughput_per_gpu is not None]
    if not ok or not ok[0].metrics:
        return ()
    key = next(iter(ok[0].metrics))
    ok = [c for c in ok if key in c.metrics]
    frontier = [
        c
        for c in ok
        if not any(
            o.metrics[key] <= c.metrics[key]
            and (o.throughput_per_gpu or 0) >= (c.throughput_per_gpu or 0)
            and (o.metrics[key], o.throughput_per_gpu) != (c.metrics[key], c.throughput_per_gpu)
            for o in ok
        )
    ]
    return tuple(sorted(frontier, key=lambda c: (c.metrics[key], c.gpus)))
