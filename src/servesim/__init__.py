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

if TYPE_CHECKING:
    from servesim.capacity import Candidate, NoFeasibleConfiguration, SearchResult, search
    from servesim.cluster.planner import PlannerConfig, parse_planner_config, planner_config
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
    from servesim.sweeps import SweepResult, Table, sweep

# Every name loads with the first use of it: ``import servesim`` costs nothing, so the
# ``servesim`` command can set up its process before numpy loads (see __main__), and a
# replay never loads what only sweeps, searches or the planner need.
_ON_FIRST_USE = {
    **dict.fromkeys(
        [
            "Backend",
            "DiskOffloadConfig",
            "EngineConfig",
            "HostOffloadConfig",
            "Role",
            "RouterConfig",
            "SglangConfig",
            "TimingModelConfig",
            "parse_engine_args",
            "parse_router_config",
        ],
        "servesim.config",
    ),
    **dict.fromkeys(
        ["ConfigError", "ReportError", "ServesimError", "SimulationError", "TraceError"],
        "servesim.errors",
    ),
    "RequestRecord": "servesim.metrics.collector",
    "Terminal": "servesim.metrics.collector",
    "Sla": "servesim.metrics.summary",
    **dict.fromkeys(["Report", "RunConfig", "SyntheticWorkload", "run"], "servesim.simulation"),
    **dict.fromkeys(
        ["Candidate", "NoFeasibleConfiguration", "SearchResult", "search"], "servesim.capacity"
    ),
    **dict.fromkeys(
        ["PlannerConfig", "parse_planner_config", "planner_config"], "servesim.cluster.planner"
    ),
    **dict.fromkeys(["SweepResult", "Table", "sweep"], "servesim.sweeps"),
}


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    value = getattr(_load(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))


def _load(module: str) -> Any:
    """Import one of servesim's modules with the cyclic collector paused: importing
    allocates much and frees little, which the collector would only walk (about 5 ms
    of every start-up)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(module)
    finally:
        if collecting:
            gc.enable()


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
