"""Root conftest of the test suite: keep it, even without fixtures.

pytest imports it as ``tests.conftest`` (``tests`` is a package), which puts
the repository root on ``sys.path``; that is what lets test modules in folders
without ``__init__.py`` (``tests/property``, ...) import ``tests.support``.
Fixtures for every test belong here; the scenario tests' own are in
``tests/scenarios/conftest.py``. The tests need nothing outside the
repository: their data is in ``tests/data/``.
"""

from hypothesis import settings

# The property tests draw the same examples on every run, so that a suite that passed
# passes again (CI judges a change, not a draw); `pytest --hypothesis-profile=explore`
# draws new ones each run, to look for counterexamples.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")
