"""`StepModel`: the step-time callback `tempo_jax.sim.cascade.serving.simulate_prefill` calls — per forward step,
every layer's routing and `LayerInputs`, timed by the fast or the reference timeline; `StepRecord`: what it records."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solvers import Placement, attention_features_unchecked, slots_for, solve
from solvers.checks import check_choice
from tempo_jax.workloads import load_trace, zipf_popularity

from .config import CascadeConfig
from .costs import MODELS
from .fast_timeline import StepInputs, step_timeline, top_shares
from .reference_timeline import LayerInputs, layer_timeline
from .serving import StepBatch
from .vocabulary import LAYER_MODES
from .workload import workload_draw

__all__ = ["StepModel", "StepRecord"]


def _routing_popularity(config: CascadeConfig) -> np.ndarray:
    """``[L, E]`` expert popularity per model layer (each row sums to 1; computed once per process and key)."""
    if config.routing == "zipf":  # the seed draws the popularity itself
        return _popularity(config.model, config.routing, float(config.skew), config.seed, 0)
    return _popularity(config.model, config.routing, 0.0, 0, config.seed if config.vary_workload else 0)


@lru_cache(maxsize=8)
def _popularity(model_name: str, routing: str, skew: float, seed: int, workload_seed: int) -> np.ndarray:
    """`_routing_popularity` of one (model, routing, skew, seed, workload seed) (read-only)."""
    model = MODELS[model_name]
    L, E = model.layers, model.experts
    if routing == "zipf":
        out = np.stack([zipf_popularity(E, skew, seed=seed * 1000 + layer) for layer in range(L)])
        out.setflags(write=False)
        return out
    # The recording itself, or its bundled copy (the same counts, shipped with the package) when the shared traces
    # are not on disk: routing is a recording's name here, and both hold that recording's counts exactly.
    try:
        trace = load_trace(routing)
    except FileNotFoundError:
        from tempo_jax.workloads import load_sample

        trace = load_sample(routing)
    if E % trace.num_experts:
        raise ValueError(
            f"routing {routing!r} records {trace.num_experts} experts, which do not divide the model's {E}"
        )
    split = E // trace.num_experts
    draw = workload_draw(workload_seed, num_requests=0, recorded_layers=len(trace.layers), layers=L, experts=E)
    rows = []
    for layer in range(L):
        load = trace.expert_load(trace.layers[(layer + draw["layer_shift"]) % len(trace.layers)]).astype(np.float64)
        p = np.repeat(load / load.sum(), split) / split
        if draw["expert_perm"] is not None:  # another layout of the experts over the ranks
            p = p[draw["expert_perm"][layer]]
        rows.append(p)
    out = np.stack(rows)
    out.setflags(write=False)
    return out


def _expert_placements(config: CascadeConfig, popularity: np.ndarray) -> list[Placement] | None:
    """EPLB expert placement per layer (None without redundancy: expert e on rank e // (E/D))."""
    if config.replication == 1.0:
        return None
    E, D = popularity.shape[1], config.num_ranks
    slots = slots_for(E, D, config.replication)
    return [Placement.from_eplb(p, slots, D) for p in popularity]


def _contiguous_split(E: int, D: int) -> np.ndarray:
    f = np.zeros((E, D))
    f[np.arange(E), np.arange(E) // (E // D)] = 1.0
    return f


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """What `StepModel` keeps of one forward step (the serve loop stores it per step).

    Attributes:
      attention_s: ``[L, D]`` true attention-stage time of each replica in each layer (s) — `PrefillResult`
        computes ALB from it.
      layer_us: ``[L]`` each layer's time (µs) in this run's mode.
      base_us: ``[L]`` the same layers without OEWF (cascade mode; else equal to ``layer_us``).
      gap_us: Σ over layers and replicas of the readiness gap w_d = max_j r_j − r_d (App. A), µs, with r_d the
        replica's entry into dispatch — the end of its attention stage (App. A times the start of the dispatch
        kernel, before any payload moves), not its dispatch's completion.
      oewf_moves / oewf_tokens: accepted reassignments and moved tokens over the step's layers.
      oewf_refused / oewf_abandoned / oewf_dropped: helpers that decided without a move (no fetch), accepted moves
        abandoned at commit (no protected interval on the helper's GPU) and dropped at execution (weights after the
        donor's dispatch left), over the step's layers (`reference_timeline.LayerResult`).
      oewf_longer: layers where OEWF's accepted moves made the layer longer than without them.
      attention_err: |â − a| / a of every (layer, replica) with tokens.
      token_err: relative errors |N̂ − N| / N of the per-rank token estimates, layers ≥ 1, ranks with N > 0.
      ffn_kernel_us / ffn_merged_us: Σ over ranks and layers of the kernels' F(n) and of F(Σ n) per rank
        (matched-work FFN efficiency = merged / kernel).
    """

    attention_s: np.ndarray
    layer_us: np.ndarray
    base_us: np.ndarray
    gap_us: float
    oewf_moves: int
    oewf_tokens: float
    oewf_refused: int
    oewf_abandoned: int
    oewf_dropped: int
    oewf_longer: int
    attention_err: np.ndarray
    token_err: np.ndarray
    ffn_kernel_us: float
    ffn_merged_us: float


class StepModel:
    """The `simulate_prefill` step-time callback of one mode: ``step(batches) -> (duration_s, StepRecord)``.

    Deterministic: step k's attention noise and routing come from ``default_rng([seed, k])``.
    """

    def __init__(self, config: CascadeConfig, mode: str):
        self.config = config
        self.mode = check_choice("mode", mode, LAYER_MODES, where="StepModel")
        self.costs = config.costs()
        self.model = MODELS[config.model]
        self.truth = config.attention_truth()
        self.popularity = _routing_popularity(config)
        self.expert_placements = _expert_placements(config, self.popularity)
        self.contiguous = _contiguous_split(self.model.experts, config.num_ranks)
        L, E, D = self.model.layers, self.model.experts, config.num_ranks
        pop = self.popularity.reshape(L, D, E // D)
        self.rank_share = pop.sum(axis=2)  # [L, D]
        self.expert_share = pop / np.where(self.rank_share > 0, self.rank_share, 1.0)[..., None]  # [L, D, S]
        self.top_share, self.fetch_experts = top_shares(
            self.expert_share, self.costs.expert_bytes, self.costs.helper_budget_bytes
        )
        self.layer_class = np.arange(L) % self.truth.classes
        self.key_budget = self.truth.key_budget
        self.steps = 0

    # -------------------------------------------------------------------------------------------- pieces
    def attention_us(self, batches: tuple[StepBatch, ...], rng: np.random.Generator | None = None):
        """``([L, D] true attention µs, [L, D] the planners' estimate, [D] new tokens Q)`` of a step's batches.

        Idle replicas run a dummy batch (α0, known to the planners). ``rng`` draws the step noise (None: none).
        """
        D, L = len(batches), self.model.layers
        m = np.array([b.num_chunks for b in batches], dtype=np.float64)
        P = np.concatenate([b.P for b in batches])
        I = P + np.concatenate([b.q for b in batches])
        Q, Pi = attention_features_unchecked(I, P, self.key_budget, np.repeat(np.arange(D), m.astype(np.int64)), D)
        Q, Pi = Q.astype(np.float64), Pi.astype(np.float64)
        idle = Q == 0
        mean = self.truth.mean_us(Q, Pi, m)[self.layer_class]  # [L, D]
        noise = np.exp(self.truth.step_noise * rng.standard_normal((L, D))) if rng is not None else 1.0
        att = np.where(idle, self.truth.base.alpha0, mean * noise)
        if self.config.estimates == "exact":
            return att, att.copy(), Q
        est = np.maximum(self.truth.estimate_us(Q, Pi)[self.layer_class], 0.0)
        return att, np.where(idle, att, est), Q

    def split(self, layer: int, counts: np.ndarray) -> np.ndarray:
        """``[E, D]`` share of each expert's tokens per rank in ``layer`` for source counts ``[D, E]``."""
        if self.expert_placements is None:
            return self.contiguous
        pl = self.expert_placements[layer]
        if self.config.dispatch == "uniform":
            return pl.replicas_on_gpu / pl.logcnt[:, None]
        from solvers import DispatchProblem

        n = counts.sum(axis=0)
        x = solve(DispatchProblem(np.round(counts), pl, self.costs.tempo_cost_model()), "tempo").x
        uniform = pl.replicas_on_gpu / pl.logcnt[:, None]
        return np.where(n[:, None] > 0, x / np.maximum(n, 1)[:, None], uniform)

    def rank_counts(self, Q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``[L, D, D]`` pairs source s sends to rank d per layer (no redundancy): a multinomial draw of K·Q_s pairs
        over the ranks' popularity shares (= the per-expert multinomial summed per rank)."""
        n = np.broadcast_to((Q.astype(np.int64) * self.model.top_k)[None, :], self.rank_share.shape)
        return rng.multinomial(n, self.rank_share[:, None, :]).astype(np.float64)

    def expert_pairs(self, layer: int, counts: np.ndarray) -> np.ndarray:
        """``[D, D, E]`` pairs of one layer from its rank-level ``counts [D, D]`` (no redundancy): each
        destination's pairs split over its experts by popularity."""
        D, S = counts.shape[0], self.expert_share.shape[2]
        out = np.zeros((D, D, D, S))
        out[:, np.arange(D), np.arange(D), :] = counts[:, :, None] * self.expert_share[layer][None, :, :]
        return out.reshape(D, D, D * S)

    def rank_sums(self, counts: np.ndarray) -> np.ndarray:
        """``[L, D, D]`` Σ over each destination's experts of `expert_pairs` (the same floats the reference sums)."""
        return (counts[..., None] * self.expert_share[:, None, :, :]).sum(axis=3)

    def layer_pairs(self, layer: int, Q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``[D, D, E]`` pairs of one layer with redundant replicas: multinomial K·Q_s draws per source over the
        experts, split over the replicas."""
        p = self.popularity[layer]
        counts = np.stack([rng.multinomial(int(q) * self.model.top_k, p) for q in Q]).astype(np.float64)
        return counts[:, None, :] * self.split(layer, counts).T[None, :, :]

    def step_inputs(self, batches: tuple[StepBatch, ...], rng: np.random.Generator) -> dict:
        """What every layer of the step needs, drawn in a fixed order: ``att``, ``att_est`` ``[L, D]``; ``pairs``,
        ``pairs_est`` (``[L, D, D]`` rank-level counts, or ``[L, D, D, E]`` with redundancy); ``sent``,
        ``sent_est`` ``[L, D, D]`` (their sums over experts); ``tokens_est``, ``dispatch`` ``[L, D]``;
        ``token_err``."""
        cfg, costs, D = self.config, self.costs, self.config.num_ranks
        att, att_est, Q = self.attention_us(batches, rng)
        full = self.expert_placements is None
        if full:
            pairs = self.rank_counts(Q, rng)  # [L, D, D]
            sent = self.rank_sums(pairs)
        else:
            pairs = np.stack([self.layer_pairs(layer, Q, rng) for layer in range(self.model.layers)])
            sent = pairs.sum(axis=3)
        dispatch = costs.dispatch_time_us(sent)
        recv = sent.sum(axis=1)  # [L, D]
        if cfg.estimates == "paper":  # App. D: the previous layer's counts; the first layer assumes an even spread
            tokens_est = np.concatenate([np.full((1, D), recv[0].sum() / D), recv[:-1]])
            first = np.zeros_like(pairs[:1])
            if full:
                first[0] = sent[0].sum(axis=1)[:, None] / D
            else:
                first[0, :, :, 0] = sent[0].sum(axis=1)[:, None] / D
            pairs_est = np.concatenate([first, pairs[:-1]])
            share0 = self.expert_share[:1, None, :, :]
            first_sent = (first[..., None] * share0).sum(axis=3) if full else first.sum(axis=3)
            sent_est = np.concatenate([first_sent, sent[:-1]])  # the same floats as summing pairs_est again
            live = recv[1:] > 0
            token_err = np.abs(tokens_est[1:][live] - recv[1:][live]) / recv[1:][live]
        else:
            tokens_est, pairs_est, sent_est, token_err = recv, pairs, sent, np.empty(0)
        return dict(
            att=att,
            att_est=att_est,
            pairs=pairs,
            pairs_est=pairs_est,
            sent=sent,
            sent_est=sent_est,
            tokens_est=tokens_est,
            dispatch=dispatch,
            token_err=token_err,
            recv=recv,
        )

    # -------------------------------------------------------------------------------------------- step
    def __call__(self, batches: tuple[StepBatch, ...]) -> tuple[float, StepRecord]:
        cfg, costs = self.config, self.costs
        rng = np.random.default_rng([cfg.seed, self.steps])
        self.steps += 1
        L = self.model.layers
        # Step 1: attention, routing and the planners' estimates of every layer.
        x = self.step_inputs(batches, rng)
        att, att_est, pairs, pairs_est, dispatch = x["att"], x["att_est"], x["pairs"], x["pairs_est"], x["dispatch"]
        tokens_est = x["tokens_est"]
        # Step 2: the layers' timelines.
        if cfg.timeline == "fast":
            inputs = StepInputs(
                attention_us=att,
                attention_est_us=att_est,
                dispatch_us=dispatch,
                sent=x["sent"],
                sent_est=x["sent_est"],
                tokens_est=tokens_est,
                top_share=self.top_share,
                fetch_experts=self.fetch_experts,
                oewf=np.arange(L) > 0,
            )
            t = step_timeline(inputs, costs, self.mode, links=cfg.links, launch=cfg.launch, commit=cfg.commit)
            layer_us, base_us, ready = t.end_us, t.base_us, t.ready_us
            moves, moved, kernel_us = t.moves.sum(), t.moved_tokens.sum(), t.kernel_us.sum()
            refused, abandoned, dropped = t.refused.sum(), t.abandoned.sum(), t.dropped.sum()
        else:
            layer_us, base_us, ready = np.empty(L), np.empty(L), np.empty((L, cfg.num_ranks))
            moves = moved = refused = abandoned = dropped = kernel_us = 0.0
            for layer in range(L):
                full = self.expert_placements is None
                inp = LayerInputs(
                    attention_us=att[layer],
                    dispatch_us=dispatch[layer],
                    pairs=self.expert_pairs(layer, pairs[layer]) if full else pairs[layer],
                    attention_est_us=att_est[layer],
                    pairs_est=self.expert_pairs(layer, pairs_est[layer]) if full else pairs_est[layer],
                    tokens_est=tokens_est[layer],
                    oewf=layer > 0,
                )
                res = layer_timeline(inp, costs, self.mode, **cfg.timeline_options())
                layer_us[layer], base_us[layer], ready[layer] = res.end_us, res.base_end_us, res.ready_us
                moves += len(res.accepted)
                moved += float(sum(r.n_trans for r in res.accepted))
                refused, abandoned, dropped = refused + res.refused, abandoned + res.abandoned, dropped + res.dropped
                kernel_us += float(sum(k.duration_us for ks in res.kernels for k in ks))
        live = np.broadcast_to(np.array([b.num_chunks > 0 for b in batches])[None, :], att.shape)
        record = StepRecord(
            attention_s=att * 1e-6,
            layer_us=layer_us,
            base_us=base_us,
            gap_us=float((att.max(axis=1, keepdims=True) - att).sum()),  # App. A: at dispatch entry
            oewf_moves=int(moves),
            oewf_tokens=float(moved),
            oewf_refused=int(refused),
            oewf_abandoned=int(abandoned),
            oewf_dropped=int(dropped),
            oewf_longer=int((layer_us > base_us * (1 + 1e-12)).sum()),
            attention_err=np.abs(att_est - att)[live] / att[live],
            token_err=x["token_err"],
            ffn_kernel_us=float(kernel_us),
            ffn_merged_us=float(costs.ffn_us(x["recv"]).sum()),
        )
        return float(layer_us.sum()) * 1e-6, record
