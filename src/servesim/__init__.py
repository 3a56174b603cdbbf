"""servesim: replay LLM serving workloads on a simulated cluster, in virtual time."""

from importlib.metadata import PackageNotFoundError, version

from servesim.config import EngineConfig, Role, parse_engine_args
from servesim.errors import ConfigError, ServesimError, SimulationError, TraceError
from servesim.metrics.summary import Sla
from servesim.simulation import Report, RunConfig, SyntheticWorkload, run

try:
    __version__ = version("servesim")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

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
    "__version__",
    "parse_engine_args",
    "run",
]
