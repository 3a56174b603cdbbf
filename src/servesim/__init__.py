"""servesim: replay LLM serving workloads on a simulated cluster, in virtual time.

The API in one breath: build a :class:`RunConfig` (a trace path, str or
Path, or a :class:`SyntheticWorkload`; the cluster; engine and router
configs), :func:`run` it, and read the :class:`Report` (``summary``,
``records``, ``to_json()``, ``table()``, ``to_html()``, ``save()``).
``docs/api.md`` has examples. :func:`sweep` replays every point of a sweep
file and :func:`search` finds the cheapest deployment that meets an SLA
(``docs/capacity-planning.md``).
"""

from __future__ import annotations

import gc
import importlib
from typing import TYPE_CHECKING, Any

# Importing allocates much and frees little: the cyclic collector, paused meanwhile, would
# only walk it (about 5 ms of every start-up).
_collecting = gc.isenabled()
gc.disable()
try:
    from servesim.config import (
        Backend,
        DiskOffloadConfig,
        EngineConfig,
        HostOffloadConfig,
        Role,
        RouterConfig,
        SglangConfig,
        TimingModelConfig,
        parse_engine_args,
        parse_router_config,
    )
    from servesim.errors import ConfigError, ReportError, ServesimError, SimulationError, TraceError
    from servesim.metrics.collector import RequestRecord, Terminal
    from servesim.metrics.summary import Sla
    from servesim.simulation import Report, RunConfig, SyntheticWorkload, run
finally:
    if _collecting:
        gc.enable()
    del _collecting

if TYPE_CHECKING:
    from servesim.capacity import Candidate, NoFeasibleConfiguration, SearchResult, search
    from servesim.cluster.planner import PlannerConfig, parse_planner_config, planner_config
    from servesim.sweeps import SweepResult, Table, sweep

# Sweeps, searches and the planner load on first use: a replay without them never needs
# them, and each is a few percent of its start-up (their dataclasses, the settings layer).
_ON_FIRST_USE = {
    "Candidate": "servesim.capacity",
    "NoFeasibleConfiguration": "servesim.capacity",
    "SearchResult": "servesim.capacity",
    "search": "servesim.capacity",
    "PlannerConfig": "servesim.cluster.planner",
    "parse_planner_config": "servesim.cluster.planner",
    "planner_config": "servesim.cluster.planner",
    "SweepResult": "servesim.sweeps",
    "Table": "servesim.sweeps",
    "sweep": "servesim.sweeps",
}


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))


# The one place the version is written: pyproject.toml reads it from here (reading
# the installed distribution's metadata instead costs ~40 ms of start-up).
__version__ = "0.1.0"

__all__ = [
    "Backend",
    "Candidate",
    "ConfigError",
    "DiskOffloadConfig",
    "EngineConfig",
    "HostOffloadConfig",
    "NoFeasibleConfiguration",
    "PlannerConfig",
    "Report",
    "ReportError",
    "RequestRecord",
    "Role",
    "RouterConfig",
    "RunConfig",
    "SearchResult",
    "ServesimError",
    "SglangConfig",
    "SimulationError",
    "Sla",
    "SweepResult",
    "SyntheticWorkload",
    "Table",
    "Terminal",
    "TimingModelConfig",
    "TraceError",
    "__version__",
    "parse_engine_args",
    "parse_planner_config",
    "parse_router_config",
    "planner_config",
    "run",
    "search",
    "sweep",
]
