"""tempo-jax: makespan-aware MoE expert dispatch (TEMPO) and asynchronous expert execution (CascadeEP) in JAX.

Submodules:
  workloads   routing recordings and synthetic Zipf routing (numpy only)
  report      plain-text tables for the CLI, scripts and notebooks
  demo        the `make demo` job
  cli         the `tempo-jax` command line

Importing `tempo_jax` does not import jax; the JAX layer is imported on first use.
"""

__version__ = "0.1.0"
