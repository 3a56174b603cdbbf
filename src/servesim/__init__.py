"""servesim: replay LLM serving workloads on a simulated cluster, in virtual time.

The API in one breath: build a :class:`RunConfig` (a trace path, str or
Path, or a :class:`SyntheticWorkload`; the cluster; engine and router
configs), :func:`run` it, and read the :class:`Report` (``summary``,
``records``, ``to_json()``, ``table()``, ``to_html()``, ``save()``).
``docs/api.md`` has examples. :func:`sweep` replays every point of a sweep
file and :func:`search` finds the cheapest deployment that meets an SLA
(``docs/capacity-planning.md``).
"""

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
from servesim.search import Candidate, NoFeasibleConfiguration, SearchResult, search
from servesim.simulation import Report, RunConfig, SyntheticWorkload, run
from servesim.sweep import SweepResult, Table, sweep

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
