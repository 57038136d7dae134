"""`python -m tempo_jax` — the same command line as `tempo-jax`."""

from .cli import main

raise SystemExit(main())
