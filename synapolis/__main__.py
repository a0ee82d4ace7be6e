"""`python -m synapolis` runs the CLI."""

from .cli import main

main()
