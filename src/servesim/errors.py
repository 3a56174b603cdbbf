"""Errors servesim raises for bad input and broken simulations.

Every user-facing error derives from :class:`ServesimError`; the CLI prints its
message and exits with code 2 (usage and input errors) or 1 (a simulation that
cannot finish).
"""

from __future__ import annotations


class ServesimError(Exception):
    """Base class of every error servesim reports to its user."""

    exit_code = 2


class ConfigError(ServesimError):
    """A configuration value, flag or engine key is missing, unknown or out of range."""


class TraceError(ServesimError):
    """A workload trace cannot be read: missing file, malformed line or field."""


class SimulationError(ServesimError):
    """The simulation reached a state it cannot leave (e.g. a request that can never fit)."""

    exit_code = 1


class ReportError(ServesimError):
    """A report file given to ``servesim report`` cannot be read or lacks a section."""
