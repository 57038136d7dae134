"""The expert-parallel MoE layer: functional core (`moe_forward`) and its dense reference.

Inside `jax.shard_map` over the ``ep`` mesh axis (tokens data-parallel, physical expert slots
expert-parallel), per rank, the stages of `tempo_jax.layer.stages`:

  route → dispatch (table → physical slot, counts) → pack by destination (rows + slot ids) → exchange →
  expert FFN (sort by local slot, grouped-GEMM SwiGLU) → return → weighted combine.

The per-rank inputs are one pytree (`RankInputs`) whose shard_map specs come from the same structure, and the
result is one type (`MoEOutput`: out, counts, counter, stats).

Replicas hold identical weights, so the output does not depend on the dispatch table, the policy or the mode:
every choice computes the same function as `moe_reference` (up to float reassociation). That is the project's
central invariant.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels import COUNTER_DTYPE, fp8_path
from pallas_kernels.fp8 import fake_quantize_rows
from solvers import LaunchSchedule

from . import cascade_exec, copies, exchange_ffn, fp8, relief, stages
from .cascade_plan import check_fetches
from .config import MoEConfig, auto_capacity
from .exchange import EXCHANGE, CallShape, block_exchange, choose_exchange, exchange_platform
from .experts import (
    LATENT_KEYS,
    OUTPUT_KEYS,
    block_output,
    expert_out_norm,
    glu,
    latent_back,
    latent_rows,
    shared_ffn,
)
from .fp8 import SCALE_KEYS
from .mesh import LayerAxes, layer_axes, onto_mesh, param_spec, token_axes
from .params import EXPERT_KEYS, check_params
from .replicas import tie_replicas
from .routing import Routing, expert_nodes
from .scopes import scoped
from .stages import route
from .tables import PlacementArrays, Tables, check_placement_arrays, check_tables

__all__ = [
    "MoEAux",
    "MoEAuxParts",
    "MoEOutput",
    "MoEStats",
    "RankInputs",
    "ShardStats",
    "moe_forward",
    "moe_reference",
    "reduce_aux",
]

ROUTER_KEYS = (
    "router",
    "router_bias",
    "score_bias",
    "router_scale",
    "expert_scale",
    "router_shared",
    "router_gain",
    "router_in",
    "router_in_bias",
    "router_carry",
    "router_norm",
    "router_fc1",
    "router_fc1_bias",
    "router_fc2",
    "router_fc2_bias",
)
SHARED_KEYS = ("shared_w_gate", "shared_w_up", "shared_w_down", "shared_gate")


def moe_reference(
    params: dict,
    x: jax.Array,
    config: MoEConfig,
    routing=None,
    router_x=None,
    expert_set=None,
    router_state=None,
    expert_nodes=None,
) -> jax.Array:
    """Dense single-device MoE: every token through its top-k experts (and the shared experts), no dispatch.
    ``[T, H]`` → ``[T, H]``. ``params``: the *logical* layout ``[E, ...]`` (`tempo_jax.layer.params.to_logical`
    of the layer's physical parameters).

    ``routing``: optional ``(topk_ids [T, K], weights [T, K])`` replacing the router (as in `moe_forward`);
    ``router_x``: optional ``[T, H]`` the router reads instead of ``x`` (as in `moe_forward`); ``expert_set``:
    optional ``[T]`` int each token's expert set (``RouterConfig.expert_sets``; as in `moe_forward`);
    ``router_state``: optional ``[T, Rh]`` the previous layer's router state (``RouterConfig.carried_state``; as in
    `moe_forward`; the state this layer hands on is `tempo_jax.layer.routing.route`'s ``state``); ``expert_nodes``:
    ``[E]`` int each expert's node, for node-limited routing (``RouterConfig.max_nodes``;
    `tempo_jax.layer.routing.expert_nodes` of the placement the layer runs).

    Raises:
      ValueError: parameters in the physical layout ``[P, ...]`` (one row per slot: `to_logical` them first), or
        any other mismatch with ``config`` (`tempo_jax.layer.params.check_params`).
    """
    E = config.experts
    rows = {k: jnp.shape(params[k])[0] for k in ("w_gate", "w_up", "w_down") if k in params}
    if any(n != E for n in rows.values()):
        raise ValueError(
            f"moe_reference: the expert arrays have {sorted(set(rows.values()))} rows, the config {E} experts: it "
            "takes the logical layout [E, ...]; convert physical parameters with "
            "tempo_jax.layer.to_logical(params, placement)"
        )
    check_params(params, config, num_slots=None, where="moe_reference")
    shared_w = None
    if routing is None:
        nodes = None
        if expert_nodes is not None:
            expert_nodes = np.asarray(expert_nodes, np.int32)
            nodes = (expert_nodes, int(expert_nodes.max(initial=0)) + 1)
        xr = x if router_x is None else router_x
        rt = route(xr, params, config.router, config.top_k, expert_set, router_state, nodes)
        ids, w, shared_w = rt.ids, rt.gate, rt.shared
    else:
        _no_replay_with_routed_shared(config, "moe_reference")
        ids, w = routing
    hp = jax.lax.Precision.HIGHEST
    xs = x.astype(config.dtype)
    params = fp8.dequantize_weights(params, fp8.layer_block(config.fp8_block), config.dtype)
    if config.router.weight_on == "input":  # Σ_k f_{e_k}(w_k · x): each pair through its expert alone
        out = _reference_input_weighted(params, xs, ids, w, config)
        return block_output(out, params, config.output).astype(x.dtype)
    xl = xs if config.latent is None else latent_rows(x, params, config.latent, config.dtype)  # at the experts' width
    xq = _gemm_input(xl, config)
    gated = config.expert.gated  # plain experts: no gate projection
    g = jnp.einsum("th,ehf->etf", xq, params["w_gate"], precision=hp) if gated else None
    u = jnp.einsum("th,ehf->etf", xq, params["w_up"], precision=hp)
    if config.expert.bias:
        g, u = (g + params["b_gate"][:, None] if gated else None), u + params["b_up"][:, None]
    h = _gemm_input(glu(g, u, config.expert), config)
    y = jnp.einsum("etf,efh->eth", h, _scaled_down(params, config), precision=hp)  # [E, T, L]
    if config.expert.bias:
        y = y + params["b_down"][:, None]
    if config.expert.out_norm_eps is not None:
        y = expert_out_norm(y, config.expert.out_norm_eps)
    picked = y[jnp.minimum(ids, config.experts - 1), jnp.arange(x.shape[0])[:, None]]  # [T, K, H]
    if config.zero_experts:  # a zero-computation expert's output: the token itself, or nothing
        zero = (ids >= config.experts)[..., None]
        kept = xs[:, None, :].astype(picked.dtype) if config.zero_expert_output == "identity" else 0
        picked = jnp.where(zero, kept, picked)
    out = jnp.einsum("tk,tkh->th", w.astype(picked.dtype), picked)
    if config.latent is not None:
        out = latent_back(out, params)
    if config.shared is not None:
        out = out + shared_ffn(x, params, config.shared, config.dtype, shared_w).astype(out.dtype)
    return block_output(out, params, config.output).astype(x.dtype)


def _scaled_down(weights: dict, config: MoEConfig):
    """``w_down`` with each output column times ``1 + expert_out_scale`` where the experts' outputs are normed
    (`ExpertConfig.out_norm_eps`: the scale before the norm, folded into the weight), else as it is (parts too)."""
    if config.expert.out_norm_eps is None:
        return weights["w_down"]
    scale = 1.0 + weights["expert_out_scale"].astype(jnp.float32)
    return jax.tree.map(lambda w: (w.astype(jnp.float32) * scale).astype(w.dtype), weights["w_down"])


def _no_replay_with_routed_shared(config: MoEConfig, where: str) -> None:
    if config.router.shared_rows:
        raise ValueError(
            f"{where}: routing= replays the routed experts' ids and weights, but this router also weights the shared "
            "experts (RouterConfig.shared_rows), which replayed routing does not carry; run the router (routing=None)"
        )


def _gemm_input(rows: jax.Array, config: MoEConfig) -> jax.Array:
    """``rows [..., T, K]`` as a grouped GEMM multiplies them: with ``fp8_activations`` each row quantized to e4m3 per
    1 × b1 block and back (`pallas_kernels.fp8.fake_quantize_rows`), else as they are."""
    block = config.fp8_activation_block
    return rows if block is None else fake_quantize_rows(rows, block)


def _reference_input_weighted(params: dict, xs: jax.Array, ids: jax.Array, w: jax.Array, config: MoEConfig):
    """`moe_reference` when the router's weight scales the expert's input (Llama-4): ``[T, H]`` float32."""
    hp = jax.lax.Precision.HIGHEST
    rows = _gemm_input(xs[:, None, :] * w[..., None].astype(xs.dtype), config)  # [T, K, H]
    gated = config.expert.gated
    g = jnp.einsum("tkh,tkhf->tkf", rows, params["w_gate"][ids], precision=hp) if gated else None
    u = jnp.einsum("tkh,tkhf->tkf", rows, params["w_up"][ids], precision=hp)
    if config.expert.bias:
        g, u = (g + params["b_gate"][ids] if gated else None), u + params["b_up"][ids]
    h = _gemm_input(glu(g, u, config.expert), config)
    y = jnp.einsum("tkf,tkfh->tkh", h, params["w_down"][ids], precision=hp)
    if config.expert.bias:
        y = y + params["b_down"][ids]
    out = y.sum(axis=1).astype(jnp.float32)
    if config.shared is not None:
        out = out + shared_ffn(xs, params, config.shared, config.dtype).astype(out.dtype)
    return out


class RankInputs(NamedTuple):
    """What each device's body receives; `specs` gives the shard_map spec of every field.

    Split over the token axes (batch axes, then ``ep``: ``[Ng·D·n, ...]`` globally, ``[n, ...]`` per device): x
    [T, H], router_x [T, H] (the router's own input, or None: x), expert_set [T] (each token's expert set, or
    None), router_state [T, Rh] (the previous layer's router state, or None), ids / gate [T, K] (replayed routing),
    valid [T]
    (False: a padding or masked token). Split by
    `tempo_jax.layer.mesh.param_spec`: experts (the physical expert arrays ``[P, ...]``: w_gate, w_up, w_down,
    biases; over ``ep``, and the tensor / fsdp axes when named) and shared (the shared experts' parameters, or
    None). Over ``ep`` only: counter [D, E] (one per EP rank, the same in every EP group). Replicated: router
    (``router [H, E]``, ``router_bias``, ``score_bias``), output (``out_bias``, ``out_norm``: `OutputConfig`),
    table [Gs, E, R], log2phy [E, R], phy2log [P], key.
    """

    x: jax.Array
    router_x: jax.Array | None
    expert_set: jax.Array | None
    router_state: jax.Array | None
    router: dict
    experts: dict
    shared: dict | None
    output: dict
    table: jax.Array
    log2phy: jax.Array
    phy2log: jax.Array
    counter: jax.Array
    key: jax.Array
    ids: jax.Array
    gate: jax.Array
    valid: jax.Array

    _TOKENS = ("x", "router_x", "expert_set", "router_state", "ids", "gate", "valid")

    def specs(self, axes: LayerAxes) -> RankInputs:
        """The shard_map spec of every field of these inputs on ``axes``."""

        def of(field, value):
            if value is None:
                return None
            if field in self._TOKENS:
                return axes.token_spec
            if field in ("experts", "shared"):
                return None if value is None else {k: param_spec(k, axes) for k in value}
            return P(axes.ep) if field == "counter" else P()

        return RankInputs(*(of(f, v) for f, v in zip(self._fields, self, strict=True)))


class MoEStats(NamedTuple):
    """Per-device statistics of one forward pass: leading axis Ng·D, the token shards (EP group b's rank d at
    b·D + d; D without batch axes).

    Attributes:
      gpu_tokens: ``[D]`` rows each rank's experts computed (the paper's N_g).
      gpu_activations: ``[D]`` experts with pairs on the rank (G_g; its slots of one expert are one group).
      slot_tokens: ``[D, S]`` rows each local slot computed.
      drops: ``[D]`` pairs each source rank could not send (blocks over capacity); 0 when dropless.
      max_block: ``[D]`` the largest (source, destination) block each source wanted to send (the capacity a
        dropless run needs).
      replica_counts: ``[D, E, R]`` pairs each source sent to each replica column.
      topk_ids: ``[T, K]`` the routing (for traces).
      rounds: ``[D]`` exchange rounds of the call (``capacity="auto"``: ⌈largest block / C⌉; otherwise 1).
      invalid_ids: ``[D]`` pairs of real tokens whose routed expert id lies outside [0, E + Z) (replayed routing under
        ``jit``, where it cannot be refused): they are computed by no expert and contribute nothing.
      plan_rounds: ``[D]`` improvement rounds the in-graph plan ran (``dispatch="ingraph"``: at most
        ``dispatch_rounds``; every rank plans the same); 0 with tables.
      copies: ``[D]`` experts each rank received into its dynamic slots this call (``dynamic_slots``; 0 otherwise):
        times one expert's bytes, what its copies moved.
    """

    gpu_tokens: jax.Array
    gpu_activations: jax.Array
    slot_tokens: jax.Array
    drops: jax.Array
    max_block: jax.Array
    replica_counts: jax.Array
    topk_ids: jax.Array
    rounds: jax.Array
    invalid_ids: jax.Array
    plan_rounds: jax.Array
    copies: jax.Array


class ShardStats(NamedTuple):
    """What `tempo_jax.MoE` keeps of each call's `MoEStats` (``moe.stats``, one state variable, set once a call):
    every leaf leads with the token-shard axis n = Ng·D (a stack of layers built with ``nnx.vmap`` adds ``[L]`` in
    front). `tempo_jax.metrics` reads these fields; a new field here is stored, checkpointed and captured with the
    rest.

    Attributes:
      shard_counts: ``[n, E]`` pairs each shard sent to each expert (`MoEStats.replica_counts` summed over its
        replica columns: the width R of those changes with a re-placement, this shape does not).
      gpu_tokens, gpu_activations, drops, rounds, invalid_ids, plan_rounds, copies: ``[n]``, as in `MoEStats`.
    """

    shard_counts: jax.Array
    gpu_tokens: jax.Array
    gpu_activations: jax.Array
    drops: jax.Array
    rounds: jax.Array
    invalid_ids: jax.Array
    plan_rounds: jax.Array
    copies: jax.Array

    @classmethod
    def of(cls, stats: MoEStats) -> ShardStats:
        """The stored form of one call's `MoEStats`."""
        rest = {name: getattr(stats, name) for name in cls._fields if name != "shard_counts"}
        return cls(shard_counts=jnp.sum(stats.replica_counts, axis=-1), **rest)

    @classmethod
    def before_any_call(cls, shards: int, experts: int) -> ShardStats:
        """``shards`` n and ``experts`` E: no pairs yet, one exchange round (what a layer holds before its first
        call)."""
        zero = jnp.zeros((shards,), jnp.int32)
        return cls(jnp.zeros((shards, experts), jnp.int32), zero, zero, zero, jnp.ones_like(zero), zero, zero, zero)

    @classmethod
    def specs(cls, shard_axis) -> ShardStats:
        """Each leaf's spec as a tuple of its rank (the layer's `LAYER_SPEC` metadata): the shard axis first."""
        return cls(*((shard_axis, None) if name == "shard_counts" else (shard_axis,) for name in cls._fields))


class MoEAux(NamedTuple):
    """Training signals of one forward pass, over all tokens of the call, every EP group's (float32 scalars):
    ``load_balance_loss`` = E·Σ_e f_e·P_e (Switch / GShard: f the pairs' fractions per expert, P the mean router
    probability; 1 when balanced), ``z_loss`` = mean(logsumexp(router logits)²), and ``expert_load`` ``[E]`` the
    pairs per expert (what aux-free balancing reads). Padding and masked tokens count nowhere. With replayed routing
    or ``aux_losses=False`` (eval) both losses are 0."""

    load_balance_loss: jax.Array
    z_loss: jax.Array
    expert_load: jax.Array


class MoEAuxParts(NamedTuple):
    """`MoEAux`'s sufficient statistics per token shard (``moe_forward(aux_losses="local")``), leading axis Ng·D like
    `MoEStats` (stack layers in front: ``[L, Ng·D, ...]`` out of a scan): ``load [E]`` pairs per expert,
    ``prob_sum [E]`` the router probabilities summed over the shard's real tokens, ``z_sum`` Σ logsumexp(logits)²,
    ``tokens`` real tokens (float32). `reduce_aux` turns them into `MoEAux`: after a scan over layers one reduction
    over the shards serves the whole stack (one collective), where each layer's own runs once per layer in the loop."""

    load: jax.Array
    prob_sum: jax.Array
    z_sum: jax.Array
    tokens: jax.Array


def reduce_aux(parts: MoEAuxParts, top_k: int) -> MoEAux:
    """`MoEAux` from ``parts`` (`MoEAuxParts`, any leading axes ``[..., Ng·D, ...]``: the shard axis is the one before
    each field's own): the same values the layer computes with ``aux_losses=True`` — per leading index (a layer of a
    stack) — from one sum over the shards (under ``jit`` on sharded parts: one all-reduce for every layer at once)."""
    load, prob = jnp.sum(parts.load, axis=-2), jnp.sum(parts.prob_sum, axis=-2)
    z, tokens = jnp.sum(parts.z_sum, axis=-1), jnp.maximum(jnp.sum(parts.tokens, axis=-1), 1.0)
    E = load.shape[-1]
    fraction = load / (tokens[..., None] * top_k)
    lb = E * jnp.sum(jax.lax.stop_gradient(fraction) * prob / tokens[..., None], axis=-1)
    return MoEAux(lb, z / tokens, load)


class MoEOutput(NamedTuple):
    """`moe_forward`'s result: ``out [T, H]``, ``counts [D, E]`` pairs per source rank and logical expert,
    ``counter [D, E]`` uint32 updated cumulative counters, ``stats`` (`MoEStats`), ``aux`` (`MoEAux`),
    ``router_state [T, Rh]`` float32 the router state a router MLP hands to the next layer (``RouterConfig.mlp_width``;
    None otherwise, and with replayed routing).

    With batch axes (Ng EP groups) ``counts`` and ``counter`` are summed over the groups: source rank d of every
    group reads the same table row group, so the tables balance what all of them send (what a
    `DispatchController` observes). One group's counts: ``stats.replica_counts.sum(-1).reshape(Ng, D, E)[b]``."""

    out: jax.Array
    counts: jax.Array
    counter: jax.Array
    stats: MoEStats
    aux: MoEAux
    router_state: jax.Array | None = None


def _aux(rt: Routing | None, counts: jax.Array, valid: jax.Array, *, axis, top_k: int, mode: str):
    """`MoEAux` from this device's routing, pair counts ``[E]`` and real tokens ``valid [T]``, reduced over the
    token axes ``axis`` (``mode``: "layer" the losses, "load" the load only, "local" this shard's `MoEAuxParts` —
    unreduced, for `reduce_aux`)."""
    if mode == "load":
        zero = jnp.zeros((), jnp.float32)
        return MoEAux(zero, zero, jax.lax.psum(counts.astype(jnp.float32), axis))
    w = valid.astype(jnp.float32)
    if rt.probs is None:  # replayed routing: the load only, the rest zero
        E = counts.shape[0]
        prob_sum, z_sum = jnp.zeros((E,), jnp.float32), jnp.zeros((), jnp.float32)
    else:  # the routed experts' probabilities (zero-computation experts' columns, after them, left out)
        prob_sum = jnp.sum(rt.probs[:, : counts.shape[0]] * w[:, None], axis=0)
        z_sum = jnp.sum(w * jax.nn.logsumexp(rt.logits, axis=-1) ** 2)
    parts = MoEAuxParts(counts.astype(jnp.float32), prob_sum, z_sum, jnp.sum(w))
    if mode == "local":
        return MoEAuxParts(*(a[None] for a in parts))
    return reduce_aux(MoEAuxParts(*(jax.lax.psum(a, axis)[None] for a in parts)), top_k)


@dataclasses.dataclass(frozen=True)
class _Call:
    """What one call adds to the config (hashable: a key of the compiled programs): the exchange implementation,
    the tables' source groups, whether the routing is given, ``capacity`` = (kind, C), whether to compute
    the auxiliary losses, and the sharding of a concrete input, which the output keeps."""

    exchange: str
    groups: int
    given_routing: bool
    capacity: tuple[str, int]
    aux_losses: bool | str
    out_sharding: NamedSharding | None = None


class _Sent(NamedTuple):
    """Step 2's result on one rank: the dispatch kernel's ``dp`` (`stages.Dispatched`), each pair's destination rank
    ``dest`` and local slot there ``local`` ``[T·K]`` int32 (D: never sent), the in-graph plan's dynamic copies
    ``plan`` (`_CopyPlan` or None) and its improvement rounds ``plan_rounds`` (0 with tables)."""

    dp: stages.Dispatched
    dest: jax.Array
    local: jax.Array
    plan: _CopyPlan | None
    plan_rounds: jax.Array


def _local_moe(inp: RankInputs, *, config: MoEConfig, axes: LayerAxes, call: _Call) -> MoEOutput:
    """Per-device body (inside shard_map over ``axes.named``): `tempo_jax.layer.stages` composed, steps 3–6 by the
    call's `tempo_jax.layer.exchange_ffn` implementation (one exchange, dropless rounds or CascadeEP's schedule).
    Every collective but the counts' and losses' sums runs along ``ep``, inside this device's EP group."""
    K = config.top_k
    # Step 1: route (the family's router, or the replayed routing).
    if call.given_routing:
        rt = Routing(inp.ids, inp.gate, None, None)
    else:
        x_router = inp.x if inp.router_x is None else inp.router_x
        nodes = None
        if config.router.max_nodes:  # node-limited: each expert's node from the placement (checked on the host)
            Nn = axes.size(config.node_axis)
            nodes = (expert_nodes(inp.phy2log, config.experts, Nn), Nn)
        rt = route(x_router, inp.router, config.router, K, inp.expert_set, inp.router_state, nodes)
    # Step 2: dispatch: logical expert → physical slot, with counts (in-graph: this batch's own table).
    sent = _dispatch(rt, inp, config=config, axes=axes, call=call)
    # The rank's expert weights: its stored slots, this call's dynamic copies and OEWF's fetched slots (OEWF keeps
    # the helper's pairs for them on the helper).
    blocks = block_exchange(call.exchange)  # what moves whole slots (replica gradients, copies)
    weights, dest, local = _rank_weights(inp, rt, sent, config=config, axes=axes, exchange=blocks)
    if config.expert.out_norm_eps is not None:  # the experts' output scale folded into w_down (one [L] vector)
        weights = {**weights, "w_down": _scaled_down({**weights, **inp.output}, config)}
    # Steps 3–6: send → expert FFN → return.
    if config.router.weight_on == "input":  # Llama-4: each pair's row is its token scaled by the pair's weight
        x_rows = (inp.x[:, None, :] * rt.gate[..., None]).reshape(inp.x.shape[0] * K, -1)
        k_rows, row_gate = 1, jnp.ones((x_rows.shape[0], 1), rt.gate.dtype)
    else:
        x_rows, k_rows, row_gate = inp.x, K, rt.gate
    if config.latent is not None:  # the experts' width L: each token projected before it is sent
        x_rows = latent_rows(inp.x, inp.output, config.latent, config.dtype)
    path = exchange_ffn.for_call(config, exchange=call.exchange, capacity=call.capacity, top_k=k_rows)
    done = path.run(x_rows, row_gate, dest, local, weights)  # Steps 3–7 (the combine included): [rows, H]
    # + the shared experts, data-parallel on this rank's tokens; with a tensor axis every device holds its F / Tp
    # share of each row's result: the one reduction of the layer over that axis.
    out = done.out if k_rows == K else done.out.reshape(inp.x.shape[0], K, -1).sum(axis=1)
    if config.latent is not None:  # (a linear map: with a tensor axis each device's partial sum, summed below)
        out = latent_back(out, inp.output)
    if config.shared is not None:
        out = out + shared_ffn(inp.x, inp.shared, config.shared, config.dtype, rt.shared)
    if axes.tensor is not None:
        out = jax.lax.psum(out, axes.tensor)
    if config.zero_experts and config.zero_expert_output == "identity":  # w·x of pairs on zero-computation experts
        out = out + _identity_pairs(inp.x, rt, inp.valid, config.experts)
    out = block_output(out, inp.output, config.output)  # the block's output bias and norm, on whole rows
    stats = _stats(inp, rt, sent, done, config=config)
    if call.aux_losses == "local":
        mode = "local"
    else:
        mode = "layer" if call.aux_losses and not call.given_routing else "load"
    aux = _aux(rt, sent.dp.counts, inp.valid, axis=axes.tokens, top_k=K, mode=mode)
    counts, counter = sent.dp.counts, sent.dp.counter
    if axes.batch:  # every EP group's source d reads one table row group: count them together
        counts = jax.lax.psum(counts, axes.batch)
        counter = inp.counter[0] + counts.astype(counter.dtype)
    return MoEOutput(out.astype(inp.x.dtype), counts[None], counter[None], stats, aux, rt.state)


def _identity_pairs(x: jax.Array, rt: Routing, valid: jax.Array, experts: int) -> jax.Array:
    """``Σ_k w_k · x`` over each token's pairs on zero-computation experts (ids >= ``experts``) → ``[T, H]``
    float32: computed where the token is, sent nowhere."""
    w = jnp.where((rt.ids >= experts) & valid[:, None], rt.gate, 0.0)
    return jnp.sum(w, axis=1)[:, None] * x.astype(jnp.float32)


def _dispatch(rt: Routing, inp: RankInputs, *, config: MoEConfig, axes: LayerAxes, call: _Call) -> _Sent:
    """Step 2 on one rank: this rank's table row group (or the in-graph plan's quota row) → each pair's physical
    slot (`stages.dispatch_pairs`), split into destination rank and local slot; with dynamic copies, a copy column's
    slot D·S + m·k + j is rank m's dynamic slot S + j."""
    axis, K, S = config.expert_axes, config.top_k, config.slots_per_rank
    D, d = jax.lax.axis_size(axis), jax.lax.axis_index(axis)
    T = rt.ids.shape[0]
    sample = config.dispatch_mode == "sample"
    shard = jax.lax.axis_index(axes.tokens) if axes.batch else d  # this token shard (tensor ranks share it)
    uniforms = jax.random.uniform(jax.random.fold_in(inp.key, shard), (T, K)) if sample else None
    log2phy, plan = inp.log2phy, None
    if config.dispatch == "ingraph":
        table, plan_rounds, plan = _ingraph_table(rt.ids, inp.valid, inp.log2phy, config=config, num_ranks=D, rank=d)
        if plan is not None:  # dynamic copies: the copy slots are columns of the table after the fixed ones
            log2phy = plan.log2phy
    else:
        table, plan_rounds = inp.table[(d * call.groups) // D], jnp.int32(0)
    dp = stages.dispatch_pairs(
        rt,
        table,
        log2phy,
        inp.counter[0],
        mode=config.dispatch_mode,
        uniforms=uniforms,
        interpret=config.interpret,
        valid=inp.valid,
    )
    dest, local = stages.split_slots(dp.slot, S, D)  # padding / masked / out-of-range pairs: rank D, never sent
    local = stages.merge_rank_replicas(dest, local, inp.phy2log, S)  # one group per (expert, rank)
    if plan is not None:
        k, v = config.dynamic_slots, dp.slot - D * S
        dest, local = jnp.where(v >= 0, v // k, dest), jnp.where(v >= 0, S + v % k, local)
    return _Sent(dp, dest, local, plan, plan_rounds)


def _rank_weights(inp: RankInputs, rt: Routing, sent: _Sent, *, config: MoEConfig, axes: LayerAxes, exchange: str):
    """This rank's expert weights as its FFN reads them → ``(weights, dest, local)``: the stored slots (``[S, ...]``, no
    gather; replicas' gradients summed per group), this call's dynamic copies and OEWF's fetched slots as a second part
    along the slots (the stored slots are never copied), gathered over an FSDP axis; FP8 experts as `fp8.BlockScaled`
    where the grouped GEMM reads FP8 in its kernel (tokamax), else dequantized (`fp8.gemm_weights`). OEWF redirects the
    helper's pairs for the fetched experts to them: ``dest`` / ``local`` ``[T·K]``."""
    axis, S = config.expert_axes, config.slots_per_rank
    dest, local, plan = sent.dest, sent.local, sent.plan
    weights = tie_replicas(
        inp.experts,
        inp.phy2log,
        axis=axis,
        slots_per_rank=S,
        num_experts=config.experts,
        exchange=exchange,
        method=config.replica_sync,
    )
    if plan is not None:  # dynamic copies: this rank's k extra slots, fetched from their sources
        mine = jax.lax.dynamic_slice_in_dim(inp.phy2log, jax.lax.axis_index(axis) * S, S)
        got = copies.fetch_copies(weights, mine, plan.copy_expert, plan.copy_source, axis=axis, exchange=exchange)
        weights = {name: (w, got[name]) for name, w in weights.items()}  # parts: the stored slots are not copied
    if config.fetches:  # OEWF: fetched weights become extra local slots; the helper keeps its pairs for them
        ids = rt.ids.reshape(-1)
        fetch = functools.partial(cascade_exec.apply_fetches, axis=axis, slots_per_rank=S)
        dest, local, weights = fetch(config.fetches, ids, dest, local, inp.phy2log, weights)
    weights = _local_weights(weights, axes)  # FP8 experts: gathered as stored, then as the grouped GEMM takes them
    block = fp8.layer_block(config.fp8_block)
    weights = fp8.gemm_weights(weights, block, config.dtype, in_kernel=_fp8_in_kernel(weights, config))
    return weights, dest, local


def _fp8_in_kernel(weights: dict, config: MoEConfig) -> bool:
    """Whether this rank's FP8 experts go to the grouped GEMM as stored (`pallas_kernels.fp8_path` is "fp8" for each
    weight's local shape), decided once per call: a weight the kernel cannot take whole is dequantized here once, not
    inside every GEMM (a CascadeEP schedule launches several). False without FP8 experts (nothing is asked)."""
    if config.expert_dtype != "fp8_block":
        return False
    block = fp8.layer_block(config.fp8_block)
    for name in SCALE_KEYS:
        w = weights[name][0] if isinstance(weights[name], tuple) else weights[name]  # parts share their H and F
        kw = dict(interpret=config.interpret, dtype=config.dtype, shape=w.shape, block=block)
        if fp8_path(config.gmm_impl, **kw) != "fp8":
            return False
    return True


def _stats(inp: RankInputs, rt: Routing, sent: _Sent, done: stages.Exchanged, *, config: MoEConfig) -> MoEStats:
    """This rank's `MoEStats` (each field with a leading axis of 1: the shard_map concatenates the ranks)."""
    S, K, plan = config.slots_per_rank, config.top_k, sent.plan
    real = jnp.repeat(inp.valid, K)
    unsent = real & (sent.dp.slot < 0)
    if config.zero_experts:  # pairs on zero-computation experts (ids E … E+Z−1) are sent nowhere by design
        unsent = unsent & ~((rt.ids >= config.experts) & (rt.ids < config.routed_choices)).reshape(-1)
    invalid_ids = jnp.sum(unsent).astype(jnp.int32)
    d = jax.lax.axis_index(config.expert_axes)
    return MoEStats(
        gpu_tokens=jnp.sum(done.group_sizes)[None],
        gpu_activations=jnp.sum(done.group_sizes > 0)[None],
        slot_tokens=done.group_sizes[:S][None],
        drops=jnp.sum(done.wanted - done.sent)[None],
        max_block=jnp.max(done.wanted)[None],
        replica_counts=sent.dp.replica_counts[None],
        topk_ids=jnp.where(inp.valid[:, None], rt.ids, -1),
        rounds=done.rounds[None],
        invalid_ids=invalid_ids[None],
        plan_rounds=sent.plan_rounds[None],
        copies=(jnp.int32(0) if plan is None else jnp.sum(plan.copy_expert[d] >= 0, dtype=jnp.int32))[None],
    )


def _local_weights(weights: dict, axes: LayerAxes) -> dict:
    """This device's expert arrays as the FFN uses them: gathered over the fsdp axis (its transpose reduce-scatters
    the gradients), and with a tensor axis ``b_down`` kept on tensor rank 0 only (the ranks' partial outputs are
    summed, so the bias is added once)."""
    if axes.fsdp is not None:
        dims = {"w_gate": 1, "w_up": 1, "w_down": 2}  # H, which FSDP splits (FP8 block scales alike)
        dims.update({SCALE_KEYS[k]: d for k, d in dims.items()})
        weights = {
            k: (jax.lax.all_gather(w, axes.fsdp, axis=dims[k], tiled=True) if k in dims else w)
            for k, w in weights.items()
        }
    if axes.tensor is not None and "b_down" in weights:
        first = jax.lax.axis_index(axes.tensor) == 0
        only_first = jax.tree.map(lambda b: jnp.where(first, b, 0).astype(b.dtype), weights["b_down"])
        weights = {**weights, "b_down": only_first}
    return weights


class _CopyPlan(NamedTuple):
    """The in-graph plan's dynamic copies (`tempo_jax.layer.copies`): ``log2phy [E, R + D·k]`` with the copy
    columns (slot D·S + m·k + j for rank m's dynamic slot j), and ``copy_expert`` / ``copy_source`` ``[D, k]``."""

    log2phy: jax.Array
    copy_expert: jax.Array
    copy_source: jax.Array


@scoped("moe_plan")
def _ingraph_table(
    ids: jax.Array, valid: jax.Array, log2phy: jax.Array, *, config: MoEConfig, num_ranks: int, rank: jax.Array
):
    """This rank's in-graph table (`tempo_jax.layer.relief`): its valid pair counts all-gathered over the axis
    ``[D, E]``, the plan of the totals (the same on every rank) and this source's quota row ``[E, R]``; the
    improvement rounds the plan ran; and with ``dynamic_slots`` the copies (`_CopyPlan`; the table is then
    ``[E, R + D·k]``), else None."""
    E, D, S = config.experts, num_ranks, config.slots_per_rank
    ok = valid[:, None] & (ids >= 0) & (ids < E)
    counts = jax.ops.segment_sum(
        ok.reshape(-1).astype(jnp.int32), jnp.where(ok, ids, E).reshape(-1), num_segments=E + 1
    )[:E]
    every = jax.lax.all_gather(counts, config.expert_axes)  # [D, E]: the one collective of the in-graph dispatch
    ranks = relief.replica_ranks(log2phy, S, D)
    n, rounds_, plan = jnp.sum(every, axis=0), config.dispatch_rounds, None
    if not config.dynamic_slots:
        x, ran = relief.relief(n, ranks, config.cost, D, rounds_, num_slots=D * S, with_rounds=True)
    else:
        k = config.dynamic_slots
        x, cexp, csrc, ctok, ran = copies.plan_copies(
            n, ranks, config.cost, D, k, config.copy_cost, rounds_, num_slots=D * S, with_rounds=True
        )
        col = jnp.arange(E)[:, None] == cexp.reshape(1, D * k)  # [E, D·k]: the copy columns of each expert
        x = jnp.concatenate([x, jnp.where(col, ctok.reshape(1, D * k), 0.0)], axis=1)
        slots = D * S + jnp.arange(D * k, dtype=log2phy.dtype)
        plan = _CopyPlan(jnp.concatenate([log2phy, jnp.where(col, slots[None, :], -1)], axis=1), cexp, csrc)
    mine = jax.lax.dynamic_slice_in_dim(every, rank, 1, axis=0)  # [1, E]
    before = jnp.sum(jnp.where(jnp.arange(num_ranks)[:, None] < rank, every, 0), axis=0)[None]  # sources before
    return relief.quotas(jnp.concatenate([before, mine]), x)[1], ran, plan


@functools.lru_cache(maxsize=64)
def _program(mesh: jax.sharding.Mesh, config: MoEConfig, call: _Call):
    """The jitted layer, built once per (mesh, config, call: exchange, table groups, routing given, capacity): the
    per-device inputs and the shard_map body in one program, so an eager call (e.g. `MoE.__call__` outside `jit`)
    is one dispatch; inside a caller's `jit` it inlines. The physical expert arrays enter as they are stored
    (sharded over the axes: each device reads its own slots, and its own F / Tp and H / Fp shares)."""
    axes = layer_axes(config, mesh)
    K, E = config.top_k, config.experts
    D, shards = axes.num_ranks, axes.shards
    body = functools.partial(_local_moe, config=config, axes=axes, call=call)
    tok, ep = axes.token_spec, P(axes.ep)
    aux_specs = MoEAuxParts(tok, tok, tok, tok) if call.aux_losses == "local" else MoEAux(P(), P(), P())
    state = tok if config.router.mlp_width and not call.given_routing else None
    out_specs = MoEOutput(tok, ep, ep, MoEStats(*(tok for _ in MoEStats._fields)), aux_specs, state)
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)

    def run(params, x, table, log2phy, phy2log, counter, key, routing, mask, router_x, expert_set, router_state):
        T = x.shape[0]
        x_sharding = jax.typeof(x).sharding if explicit else None
        if x_sharding is not None and tuple(x_sharding.mesh.axis_names) != tuple(mesh.axis_names):
            x_sharding = None  # an unplaced input (no mesh): the output stays as the layer leaves it
        pad = -T % shards  # any T: padding rows up to a multiple of Ng·D, masked out of everything, cut from the result
        valid = jnp.ones((T,), bool) if mask is None else mask.astype(bool)
        if counter is None:
            counter = jnp.zeros((D, E), COUNTER_DTYPE)
        if key is None:
            key = jax.random.key(0)
        if routing is None:
            ids, gate = jnp.zeros((T, K), jnp.int32), jnp.zeros((T, K), jnp.float32)
        else:
            ids, gate = routing[0].astype(jnp.int32), routing[1].astype(jnp.float32)
        if pad:
            x, ids, gate = (jnp.pad(a, ((0, pad), (0, 0))) for a in (x, ids, gate))
            valid = jnp.pad(valid, (0, pad))
            if router_x is not None:
                router_x = jnp.pad(router_x, ((0, pad), (0, 0)))
            if expert_set is not None:
                expert_set = jnp.pad(expert_set, (0, pad))
            if router_state is not None:
                router_state = jnp.pad(router_state, ((0, pad), (0, 0)))
        router = {k: params[k] for k in ROUTER_KEYS if k in params}
        shared = {k: params[k] for k in SHARED_KEYS if k in params} if config.shared is not None else None
        experts = {k: params[k] for k in EXPERT_KEYS if k in params}
        output = {k: params[k] for k in OUTPUT_KEYS + LATENT_KEYS if k in params}
        inputs = RankInputs(
            x,
            router_x,
            expert_set,
            router_state,
            router,
            experts,
            shared,
            output,
            table,
            log2phy,
            phy2log,
            counter,
            key,
            ids,
            gate,
            valid,
        )
        specs = inputs.specs(axes)
        if explicit:
            inputs = RankInputs(*(_reshard(a, s, mesh) for a, s in zip(inputs, specs, strict=True)))
        sharded = jax.shard_map(body, mesh=mesh, in_specs=(specs,), out_specs=out_specs, check_vma=False)
        res = sharded(inputs)
        if pad:
            res = res._replace(out=res.out[:T], stats=res.stats._replace(topk_ids=res.stats.topk_ids[:T]))
            if res.router_state is not None:
                res = res._replace(router_state=res.router_state[:T])
        if x_sharding is not None and not pad:  # the output keeps the input's sharding
            res = res._replace(out=jax.reshard(res.out, x_sharding))
        elif call.out_sharding is not None and not pad:
            res = res._replace(out=jax.lax.with_sharding_constraint(res.out, call.out_sharding))
        return res

    return jax.jit(run)


def _reshard(value, spec, mesh):
    """``value`` (an array, a dict of arrays or None) resharded to ``spec`` (one spec, or a dict of them)."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {
            k: jax.reshard(v, NamedSharding(mesh, spec if isinstance(spec, P) else spec[k])) for k, v in value.items()
        }
    return jax.reshard(value, NamedSharding(mesh, spec))


def _check_inputs(
    params,
    x,
    mesh,
    placement_arrays,
    tables,
    config,
    routing,
    capacity,
    counter=None,
    mask=None,
    router_x=None,
    expert_set=None,
    router_state=None,
) -> tuple[str, int]:
    """Every consistency check `moe_forward` can make before tracing; returns how pairs are exchanged and the
    per-rank capacity C: ``("rounds", C)`` (dropless rounds), ``("worst", T/D·K)`` or ``("fixed", C)``.

    Shapes are always checked (static, cheap). Trusted inputs — `placement_arrays(...)` and the table builders,
    both keyed by their placement — are compared by key and never read; hand-made ones are checked by value when
    concrete (an eager call). Inside a caller's `jit` only shapes and keys can be checked.
    """
    config.ranks_on(mesh)  # the expert axes are in the mesh
    axes = layer_axes(config, mesh)
    D, shards = axes.num_ranks, axes.shards
    E, S, K = config.experts, config.slots_per_rank, config.top_k
    # Step 1: shapes and dtypes.
    if jnp.ndim(x) != 2:
        raise ValueError(
            f"x must be [T, H] (tokens × hidden), got shape {jnp.shape(x)}; flatten batch and "
            "sequence axes first, e.g. x.reshape(-1, H)"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(
            f"x must be a floating-point array (float32, bfloat16, ...), got dtype {x.dtype}; "
            "cast the activations, e.g. x.astype(jnp.float32)"
        )
    T, H = x.shape
    if T == 0:
        raise ValueError("x has no tokens (T = 0); call the layer with at least one token")
    if H != config.hidden:
        raise ValueError(f"x [T, H={H}] does not match config (H={config.hidden})")
    if mask is not None and (jnp.shape(mask) != (T,) or jnp.result_type(mask) != jnp.bool_):
        raise ValueError(
            f"mask must be bool [T={T}] (True: a real token, False: padding), got "
            f"{jnp.result_type(mask)}{list(jnp.shape(mask))}"
        )
    if router_x is not None:
        if jnp.shape(router_x) != (T, H) or not jnp.issubdtype(jnp.result_type(router_x), jnp.floating):
            raise ValueError(
                f"router_x (the router's own input) must be a floating-point [T={T}, H={H}] like x, got "
                f"{jnp.result_type(router_x)}{list(jnp.shape(router_x))}"
            )
        if routing is not None:
            raise ValueError(
                "moe_forward: routing= replaces the router, so router_x (the router's input) would be unused; "
                "give one of them"
            )
    _check_expert_set(expert_set, T, config, routing)
    _check_router_state(router_state, T, config, routing)
    padded = -(-T // shards) * shards  # tokens after padding to a multiple of the token shards Ng·D
    window = config.router.capacity_window
    if window is not None and (T % shards or (T // shards) % window):
        raise ValueError(
            f"moe_forward: capacity-limited routing counts claims per sequence of {window} tokens "
            f"(RouterConfig.capacity_window), so each of the {shards} token shards must hold whole sequences: T={T} "
            f"must be a multiple of {shards}·{window} = {shards * window}"
        )
    if placement_arrays.phy2log.shape[0] != D * S:
        raise ValueError(
            f"placement has {placement_arrays.phy2log.shape[0]} slots but the mesh needs D·S = {D}·{S} = {D * S}"
        )
    check_params(params, config, num_slots=D * S, where="moe_forward")
    if placement_arrays.log2phy.shape[0] != E:
        raise ValueError(f"placement log2phy {placement_arrays.log2phy.shape} does not match E={E}")
    # Step 2: the placement and the tables (by key when trusted, by value when hand-made and concrete).
    check_placement_arrays(placement_arrays, E, D * S, where="moe_forward")
    if config.dispatch == "ingraph":
        if tables is not None:
            raise ValueError(
                "moe_forward: with MoEConfig(dispatch='ingraph') every call computes its own tables from "
                "the batch's counts; pass tables=None (or use dispatch='tables' to give them)"
            )
    elif tables is None:
        raise ValueError(
            "moe_forward: tables are required with MoEConfig(dispatch='tables') (e.g. "
            "tempo_jax.layer.tables.uniform(placement)); or set dispatch='ingraph'"
        )
    else:
        check_tables(tables, placement_arrays, where="moe_forward")
    if isinstance(config.schedule, LaunchSchedule) and config.schedule.num_ranks != D:
        raise ValueError(
            f"MoEConfig.schedule is for {config.schedule.num_ranks} ranks but the expert axes {config.expert_axes!r} "
            f"have {D}"
        )
    if config.fetches and not isinstance(placement_arrays.phy2log, jax.core.Tracer):
        check_fetches(config.fetches, np.asarray(placement_arrays.phy2log), D, S)
    if config.router.max_nodes and not isinstance(placement_arrays.phy2log, jax.core.Tracer):
        expert_nodes(np.asarray(placement_arrays.phy2log), E, axes.size(config.node_axis))  # one node per expert
    if routing is not None:
        _no_replay_with_routed_shared(config, "moe_forward")
        _check_routing(routing, T, config.routed_choices, K)
    if counter is not None:
        got = (jnp.shape(counter), jnp.result_type(counter))
        if got != ((D, E), COUNTER_DTYPE):
            raise ValueError(
                f"counter must be the [D={D}, E={E}] uint32 cumulative counter (MoEOutput.counter of "
                f"the previous call), got shape {got[0]} dtype {got[1]}"
            )
    # Step 3: capacity (rows per block): at most the worst case T/D·K.
    worst = (padded // shards) * K
    if capacity is None:
        capacity = config.capacity
    if capacity is None:
        return "worst", worst
    if capacity == "auto":
        if config.schedule != "sync":  # a launch schedule is one plan of shifted exchanges: the worst case there
            return "worst", worst
        C = auto_capacity(config, padded // shards, D)
        return ("worst", worst) if C >= worst else ("rounds", C)
    if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 1:
        raise ValueError(f"capacity must be 'auto', a positive int (rows per block) or None, got {capacity!r}")
    return ("worst", worst) if capacity >= worst else ("fixed", int(capacity))


def _exchange(config: MoEConfig, x, mesh, capacity: tuple[str, int]) -> str:
    """The call's exchange: the config's, or for "auto" the platform's block exchange or the ring, whichever
    `tempo_jax.layer.exchange.exchange_cost` prices lower for the call's shapes (never the ring with a launch
    schedule, which sends each source's rows when they are ready)."""
    on = exchange_platform(mesh)
    if config.exchange in ("ragged", "ragged_split") and on == "cpu":
        raise ValueError(
            f"MoEConfig(exchange={config.exchange!r}) sends rows with jax.lax.ragged_all_to_all, which XLA:CPU does "
            "not implement; on CPU use exchange='padded' (the same pairs in capacity-padded blocks), 'ring' or "
            "'auto' (the platform's exchange); to lower a GPU program from CPU, trace inside "
            "tempo_jax.layer.exchange.lowering_for('gpu')"
        )
    block = EXCHANGE.resolve("auto" if config.exchange in ("auto", "ring") else config.exchange, on=on)
    if config.exchange != "auto":
        return config.exchange if config.exchange == "ring" else block
    if config.schedule != "sync":
        return block
    axes = layer_axes(config, mesh)
    per_rank = -(-x.shape[0] // axes.shards)
    rows, k = (per_rank * config.top_k, 1) if config.router.weight_on == "input" else (per_rank, config.top_k)
    item = jnp.dtype(config.dtype).itemsize
    return choose_exchange(block, CallShape(rows, k, config.hidden, axes.num_ranks, capacity[1], item), on)


def _check_router_state(state, T: int, config: MoEConfig, routing) -> None:
    """``router_state``: a float ``[T, Rh]`` where the router carries a state from the previous layer."""
    if state is None:
        return
    Rh = config.router.mlp_width
    if not config.router.carried_state:
        raise ValueError(
            "moe_forward: router_state is the previous layer's router state, added to this layer's router MLP "
            f"with RouterConfig(carried_state=True); this router (mlp_width={Rh}, carried_state=False) would ignore "
            "it: leave it out (a model's first MoE layer has none)"
        )
    if jnp.shape(state) != (T, Rh) or not jnp.issubdtype(jnp.result_type(state), jnp.floating):
        raise ValueError(
            f"moe_forward: router_state must be a floating-point [T={T}, Rh={Rh}] (the previous layer's "
            f"MoEOutput.router_state), got {jnp.result_type(state)}{list(jnp.shape(state))}"
        )
    if routing is not None:
        raise ValueError("moe_forward: routing= replaces the router, so router_state would be unused; give one of them")


def _check_expert_set(expert_set, T: int, config: MoEConfig, routing) -> None:
    """``expert_set`` is None or an integer ``[T]`` of sets in [0, expert_sets), with a router that has sets."""
    if expert_set is None:
        return
    sets = config.router.expert_sets
    if sets == 1:
        raise ValueError(
            "moe_forward: expert_set= chooses each token's expert set, but RouterConfig.expert_sets is 1 (one set): "
            "set expert_sets or leave expert_set out"
        )
    if routing is not None:
        raise ValueError("moe_forward: routing= replaces the router, so expert_set= would be unused; give one of them")
    if jnp.shape(expert_set) != (T,) or not jnp.issubdtype(jnp.result_type(expert_set), jnp.integer):
        raise ValueError(
            f"moe_forward: expert_set must be an integer [T={T}] (each token's expert set), got "
            f"{jnp.result_type(expert_set)}{list(jnp.shape(expert_set))}"
        )
    if not isinstance(expert_set, jax.core.Tracer):
        e = np.asarray(expert_set)
        if e.size and (e.min() < 0 or e.max() >= sets):
            raise ValueError(f"moe_forward: expert_set values must lie in [0, {sets}), got {e.min()} … {e.max()}")


def _check_routing(routing, T: int, E: int, K: int) -> None:
    """``routing = (ids [T, K] integer, weights [T, K] floating)``; ids in [0, E) when concrete."""
    if not isinstance(routing, tuple | list) or len(routing) != 2:
        raise ValueError("routing must be a pair (topk_ids [T, K], weights [T, K])")
    ids, weights = routing
    if jnp.shape(ids) != (T, K) or jnp.shape(weights) != (T, K):
        raise ValueError(
            f"routing must be (ids, weights) of shape [T={T}, K={K}], got {jnp.shape(ids)} and {jnp.shape(weights)}"
        )
    if not jnp.issubdtype(jnp.result_type(ids), jnp.integer):
        raise ValueError(
            f"routing ids must be integers (expert ids), got dtype {jnp.result_type(ids)}; a float "
            "id would be truncated — pass the router's top-k indices as int32"
        )
    if not jnp.issubdtype(jnp.result_type(weights), jnp.floating):
        raise ValueError(f"routing weights must be floating point, got dtype {jnp.result_type(weights)}")
    if not isinstance(ids, jax.core.Tracer):
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= E):
            raise ValueError(f"routing ids must lie in [0, {E}), got min {ids.min()}, max {ids.max()}")


def moe_forward(
    params: dict,
    x: jax.Array,
    *,
    mesh: jax.sharding.Mesh,
    placement_arrays: PlacementArrays,
    tables: Tables | None,
    config: MoEConfig,
    key: jax.Array | None = None,
    counter: jax.Array | None = None,
    routing: tuple[jax.Array, jax.Array] | None = None,
    capacity: int | str | None = None,
    mask: jax.Array | None = None,
    aux_losses: bool | str = True,
    router_x: jax.Array | None = None,
    expert_set: jax.Array | None = None,
    router_state: jax.Array | None = None,
) -> MoEOutput:
    """Expert-parallel MoE forward pass.

    Args:
      params: physical parameters (`init_params`, `tempo_jax.hf`; `tempo_jax.layer.params`): router [H, E],
        w_gate/w_up [P, H, F], w_down [P, F, H] (P = D·S, slot p holding expert phy2log[p]); best sharded over the
        axis (`to_physical(..., mesh=mesh)`), so each rank reads only its own slots.
      x: [T, H] tokens, any T (split over the batch axes and the ``ep`` axis; padded inside to a multiple of the
        Ng·D token shards with rows that route nowhere and count nowhere). The output keeps x's sharding where it
        can be seen (a placed array, an Explicit mesh).
      mesh: a mesh with ``config.axis`` and the config's batch / tensor / FSDP axes (`tempo_jax.layer.mesh`,
        docs/meshes.md); any other axis sees the layer replicated.
      placement_arrays: phy2log [P] (P = D·S) and log2phy [E, R].
      tables: `Tables` with table [Gs, E, R] (device d uses group d·Gs // D) and the same log2phy; None with
        ``config.dispatch == "ingraph"`` (each call computes its own: `tempo_jax.layer.relief`).
      config: `MoEConfig`.
      key: PRNG key for sample-mode dispatch (default key 0).
      counter: [D, E] uint32 cumulative per-rank expert counters (default zeros).
      routing: optional precomputed ``(topk_ids [T, K] int32, weights [T, K] float32)`` replacing the router
        (replaying recorded routing); the router parameter is then unused.
      capacity: this call's ``"auto"`` / int rows per (source, destination) block (overrides
        ``config.capacity`` when given; an int is clamped to the dropless worst case T/D·K).
      mask: optional ``[T]`` bool, False for padding tokens of a variable-length batch: they are routed to no
        expert and left out of the counts, counters, drops, statistics, losses and balancing; their output rows
        are the shared experts' alone (zero without shared experts), through the block's `OutputConfig`.
      aux_losses: compute the load-balancing and z losses (False: zeros, no work; eval). ``"local"``: ``aux`` is this
        call's `MoEAuxParts` per token shard, not reduced: reduce a scanned stack's with one `reduce_aux` after the
        scan (one collective for every layer instead of one per layer).
      router_x: optional ``[T, H]`` the router reads instead of ``x`` (Gemma 4 routes the residual stream while its
        experts read a normed copy), split like x; differentiated like x.
      expert_set: optional ``[T]`` int, each token's expert set with ``RouterConfig.expert_sets`` > 1 (ERNIE-4.5-VL:
        0 text, 1 vision), split like x; None: every token in set 0.
      router_state: optional ``[T, Rh]`` the previous layer's router state (``RouterConfig.carried_state``: Zaya's
        layers after the first; the previous layer's ``MoEOutput.router_state``), split like x; differentiated.

    Returns:
      `MoEOutput` ``(out [T, H], counts [D, E], counter [D, E], stats, aux, router_state)``.

    Raises:
      ValueError: before tracing, on inconsistent shapes, non-float activations, non-integer routing ids,
        tables of another placement, ids out of range, experts without a replica, T = 0, a counter of another
        shape or dtype, an axis missing from the mesh or a bad capacity.
    """
    if config.batch_axes is None:  # the axes the tokens are sharded over (`tempo_jax.layer.mesh.layer_axes`)
        axes = layer_axes(config, mesh, tokens=token_axes(x, mesh))
        config = dataclasses.replace(config, batch_axes=axes.batch)
    C = _check_inputs(
        params,
        x,
        mesh,
        placement_arrays,
        tables,
        config,
        routing,
        capacity,
        counter,
        mask,
        router_x,
        expert_set,
        router_state,
    )
    x, mask, router_x, counter, expert_set, router_state = (
        onto_mesh(v, mesh) for v in (x, mask, router_x, counter, expert_set, router_state)
    )
    if routing is not None:
        routing = (onto_mesh(jnp.asarray(routing[0]), mesh), onto_mesh(jnp.asarray(routing[1]), mesh))
    if tables is None:  # in-graph dispatch: a placeholder table (unread), the placement's log2phy
        log2phy = placement_arrays.log2phy
        table = jnp.zeros((1,) + tuple(log2phy.shape), jnp.float32)
    else:
        table, log2phy = tables.table, tables.log2phy
    sharding = getattr(x, "sharding", None) if not isinstance(x, jax.core.Tracer) else None
    keep = sharding if isinstance(sharding, NamedSharding) and sharding.mesh == mesh else None
    if isinstance(aux_losses, str) and aux_losses != "local":
        raise ValueError(f"moe_forward: aux_losses must be True, False or 'local', got {aux_losses!r}")
    if aux_losses != "local":
        aux_losses = bool(aux_losses)
    call = _Call(_exchange(config, x, mesh, C), table.shape[0], routing is not None, C, aux_losses, keep)
    run = _program(mesh, config, call)
    mask = None if mask is None else jnp.asarray(mask)
    router_x = None if router_x is None else jnp.asarray(router_x)
    expert_set = None if expert_set is None else jnp.asarray(expert_set, jnp.int32)
    router_state = None if router_state is None else jnp.asarray(router_state)
    return run(
        params,
        x,
        table,
        log2phy,
        placement_arrays.phy2log,
        counter,
        key,
        routing,
        mask,
        router_x,
        expert_set,
        router_state,
    )
