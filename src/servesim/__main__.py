"""The ``servesim`` command and ``python -m servesim``."""

from __future__ import annotations

import gc
import os
from typing import NoReturn


def main() -> NoReturn:
    """Set up the process for a replay, then run the CLI (:func:`servesim.cli.console_main`)."""
    single_threaded_blas()
    gc.disable()
    from servesim import _load

    _load("servesim.cli")
    # What the imports made lives as long as the process: out of every collection's
    # reach. Left tracked, it all sat in the young generations (no collection ran while
    # the collector was paused), and the first allocation after the imports started a
    # collection that walked it: about 11 ms of every run.
    gc.freeze()
    gc.enable()
    from servesim.cli import console_main

    console_main()


def single_threaded_blas() -> None:
    """Keep numpy's BLAS to the calling thread, unless the user chose otherwise.

    servesim does no linear algebra, yet OpenBLAS starts its thread pool when numpy
    loads: on a 2-core machine, about 20 ms of a run's wall time and 120 ms of CPU
    time. A library must not change its host process's BLAS, so only the command
    does this, before numpy loads (``import servesim`` loads nothing; see its
    ``__getattr__``).
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


if __name__ == "__main__":
    main()
