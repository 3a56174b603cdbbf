"""servesim: replay LLM serving workloads on a simulated cluster, in virtual time."""

from servesim.config import EngineConfig, Role, parse_engine_args
from servesim.errors import ConfigError, ServesimError, SimulationError, TraceError
from servesim.metrics.summary import Sla
from servesim.simulation import Report, RunConfig, SyntheticWorkload, run

__all__ = [
    "ConfigError",
    "EngineConfig",
    "Report",
    "Role",
    "RunConfig",
    "ServesimError",
    "SimulationError",
    "Sla",
    "SyntheticWorkload",
    "TraceError",
    "parse_engine_args",
    "run",
]
