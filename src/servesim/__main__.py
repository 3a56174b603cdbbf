"""``python -m servesim``."""

from servesim.cli import console_main

console_main()
