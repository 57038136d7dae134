"""Why a phase cell's numbers are what they are: per-cell mechanism diagnostics (TEMPO §3.2, §3.3).

Glossary additions: nb batches per cell, batch sizes are tokens per GPU.

For a few cells of a phase sweep (the largest gains, METRO's worst cell) :func:`cell_diagnostics` re-solves the
cell's batches and reports what binds: each policy's makespan, its busiest GPU's activations and its busiest
GPU's tokens over the mean, the fewest activations any dispatch can reach (the optimal semi-matching, Lemma 2),
the makespan of that activation-balancing optimum (whole experts on the semi-matching), and the makespan of a
*token-aware* METRO variant (:func:`metro_token_ties`: activation balancing whose ties go
to the rank with fewer tokens instead of the lower rank). The variant is a diagnostic, not a policy of `solvers`:
it measures how much of TEMPO's gain over METRO comes from our METRO never looking at tokens.
numpy + solvers only (no jax).
"""

from __future__ import annotations

import numpy as np

from solvers import DispatchProblem, gpu_loads, solve
from solvers.policies import experts_by_load

from .phase import FIXED_POLICIES, Cell, PhaseConfig, cell_setup, matching_dispatch

__all__ = ["cell_diagnostics", "metro_token_ties"]


def metro_token_ties(problem: DispatchProblem) -> np.ndarray:
    """``x [E, D]``: METRO (whole experts, descending tokens, each to the replica rank with the fewest activated
    experts) with ties broken by the rank's tokens so far, then by rank. Diagnostic only."""
    n, mask = problem.n, problem.mask
    x = np.zeros(mask.shape)
    acts = np.zeros(mask.shape[1], dtype=np.int64)
    load = np.zeros(mask.shape[1])
    for e in experts_by_load(n):
        ranks = np.flatnonzero(mask[e])
        d = ranks[np.lexsort((ranks, load[ranks], acts[ranks]))[0]]
        x[e, d] = n[e]
        acts[d] += 1
        load[d] += n[e]
    return x


def cell_diagnostics(config: PhaseConfig, cell: Cell) -> dict:
    """Batch means of one phase cell's mechanism quantities.

    Returns:
      ``{policy: makespan µs}`` for tempo and :data:`.phase.FIXED_POLICIES`, ``metro_token_ties`` (µs),
      ``<policy>_acts`` (busiest GPU's activations) and ``<policy>_rho`` (busiest GPU's tokens / mean) for
      tempo, metro and token_lp, ``matching`` (µs) and ``matching_acts``: whole experts on an optimal
      semi-matching (the fewest busiest-GPU activations any dispatch can reach, Lemma 2), ``gain`` (TEMPO vs the
      best fixed policy), ``gain_token_ties`` (vs the best of the fixed policies and the token-aware METRO) and
      ``gain_matching`` (vs the best of the fixed policies and the semi-matching).
    """
    routing, placement = cell_setup(config, cell)
    cost = config.cost(cell.preset)
    acc: dict[str, list[float]] = {}

    def add(key: str, v: float) -> None:
        acc.setdefault(key, []).append(float(v))

    for step in range(config.batches):
        # Step 1: the phase sweep's batch of this step.
        problem = DispatchProblem(routing.batch(cell.tokens_per_gpu, cell.ep, step), placement, cost)
        # Step 2: the policies and their busiest GPUs.
        for policy in ("tempo", *FIXED_POLICIES):
            d = solve(problem, policy, **({"tau": config.tau} if policy == "tempo" else {}))
            add(policy, d.makespan)
            if policy != "uniform":
                acts, _, tokens = gpu_loads(d.x)
                add(f"{policy}_acts", acts.max())
                add(f"{policy}_rho", tokens.max() / tokens.mean())
        add("metro_token_ties", cost.makespan(metro_token_ties(problem)))
        # Step 3: the activation-balancing optimum (Lemma 2): whole experts on an optimal semi-matching.
        x = matching_dispatch(problem)
        add("matching", cost.makespan(x))
        add("matching_acts", gpu_loads(x)[0].max())
    out = {k: float(np.mean(v)) for k, v in acc.items()}
    best = min(out[p] for p in FIXED_POLICIES)
    out["gain"] = 1.0 - out["tempo"] / best
    out["gain_token_ties"] = 1.0 - out["tempo"] / min(best, out["metro_token_ties"])
    out["gain_matching"] = 1.0 - out["tempo"] / min(best, out["matching"])
    return out
