"""Sweep points as Ray tasks (the ``ray`` extra): on a running cluster, or on a local
instance started for the sweep. Each trace file goes into the object store once; a
task writes it to its node's temporary directory (once per node) and replays that
copy, with the same code as a local run (:func:`servesim.sweeps.run_task`), so the
results are the same."""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servesim.errors import ConfigError
from servesim.sweeps import Outcome, Runner, Task, run_task

INSTALL_HINT = "pip install 'servesim[ray]'"


def _local_copy(name: str, data: bytes) -> str:
    """``data`` (the trace recorded as ``name``) in this node's temporary directory."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    directory = Path(tempfile.gettempdir()) / f"servesim-ray-{digest}"
    path = directory / Path(name).name
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    return str(path)


def _ray_task(task: Task, names: list[str], *traces: bytes) -> Outcome:
    local = {name: _local_copy(name, data) for name, data in zip(names, traces, strict=True)}
    return run_task(task, local)


PROBE_SECONDS = 5.0
"""How long to wait for a cluster's address to answer before giving up."""


def check_reachable(address: str) -> None:
    """Refuse at once an address nothing answers at (Ray itself retries for minutes).

    ``host:port`` and ``ray://host:port`` are probed with a TCP connection; other forms
    (``auto``) are left to Ray.

    Raises:
        ConfigError: naming the address and why it cannot be reached.
    """
    target = address.removeprefix("ray://")
    host, colon, port = target.rpartition(":")
    if not colon or not port.isdigit() or not host:
        if address != "auto":
            raise ConfigError(
                f"--ray: expected a cluster address HOST:PORT, ray://HOST:PORT or auto, got {address!r}"
            )
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ConfigError(f"--ray: cannot reach a Ray cluster at {address}: {reason}") from None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@contextmanager
def ray_session(address: str | None, *, cpus: int) -> Iterator[Runner]:
    """A runner of tasks on the Ray cluster at ``address`` (None: a local instance with
    ``cpus`` CPUs), connected (or started) on entry and left (or stopped) on exit; a Ray
    already initialised in this process is used as it is. Each trace file goes into the
    object store once per session, however many batches of tasks run.

    Raises:
        ConfigError: Ray is not installed, or the cluster cannot be reached.
    """
    ray = _import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        if address is not None:
            check_reachable(address)
        options: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": "ERROR",
            "configure_logging": False,
        }
        try:
            if address is None:
                ray.init(num_cpus=cpus, **options)
            else:
                ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = "start a local Ray instance" if address is None else f"reach Ray at {address}"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"--ray: cannot {where}: {first}") from None
    remote = ray.remote(num_cpus=1)(_ray_task)
    stored: dict[str, Any] = {}

    def execute(tasks: Sequence[Task], done: Callable[[Outcome], None]) -> None:
        names = sorted({p for t in tasks for p in t.settings.get("trace") or []})
        for name in names:
            if name not in stored:
                with open(name, "rb") as handle:
                    stored[name] = ray.put(handle.read())
        refs = [stored[name] for name in names]
        pending = [remote.remote(t, names, *refs) for t in tasks]
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    done(ray.get(ref))
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise

    try:
        yield execute
    finally:
        if started_here:
            ray.shutdown()
