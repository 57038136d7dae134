"""Routers of the MoE families the layer expresses, and the training losses over their probabilities.

A `RouterConfig` says how logits become choices and weights; `route` applies it to a rank's tokens:

0. The router's own input (Gemma 4): optionally a scale-free RMS norm ``x / sqrt(mean(x²) + norm_eps)``, times a
   learned vector ``router_scale [H]``, times the constant ``input_multiplier`` (Gemma 4: H^-1/2), in float32. The
   router may read another input than the experts (``moe_forward(..., router_x=)``: Gemma 4 routes the residual
   stream while its experts read a differently normed one).
1. ``logits = x·W (+ b)`` in float32 (``b``: gpt-oss's router bias). With a router MLP (``mlp_width`` Rh > 0;
   Zaya): the router's hidden ``s = x·D + d (+ γ ⊙ s_prev)`` ``[T, Rh]`` — ``s_prev`` the state the previous layer's
   router handed on (``carried_state``; absent at a model's first MoE layer) — is the state this layer hands on, and
   ``logits = gelu(gelu(rms(s)·n·A + a)·B + b)·W`` (``rms``: an RMS norm with ``norm_eps`` and learned weight ``n``;
   exact erf GELU; ``W [Rh, E]``).
2. Scores: ``softmax`` over all E experts (Mixtral, Qwen2/3-MoE), ``sigmoid`` (DeepSeek-V3, GLM), ``sqrt_softplus``
   = sqrt(softplus(logits)) (DeepSeek-V4), ``softmax_topk`` (gpt-oss: the top-k of the raw logits, softmax
   over those k only), or ``sparsemixer`` (PhiMoE in eval, below).
3. Choice scores = scores + the selection-only ``score_bias`` (DeepSeek-V3's ``e_score_correction_bias``: it
   changes which experts are chosen, never their weights; no gradient flows into it); with ``bias_on="logits"``
   the bias is added to the raw logits instead (Kolibri-1 chooses on ``logits + bias``, weights ``sigmoid(logit)``).
   With ``expert_sets`` > 1 (ERNIE-4.5-VL: text and vision experts), the E experts are that many equal consecutive
   sets and each token chooses only in its own (``expert_set [T]``, given per call; 0 for every token when not):
   the other sets' logits are −∞ before scoring, so a softmax normalises over the token's set alone, and their
   choice scores −∞ (a selection bias cannot lift them).
4. Group-limited choice (``n_group > 1``): E experts in ``n_group`` equal groups; a group's score is the sum of its
   two best choice scores; experts outside the ``topk_group`` best groups cannot be chosen. Node-limited choice
   (``max_nodes`` M > 0; DeepSeek-V3 §2.1.2): the groups are the nodes the experts live on (`route`'s ``nodes``:
   each expert's node from the placement), a node scores the sum of its best ⌈K / M⌉ choice scores (fewer where
   it holds fewer experts), and each token chooses only among the experts of its M best nodes — so its row crosses
   to at most M nodes.
5. The top-k experts by choice score; their weights are the (unbiased) scores, renormalised to sum to 1 when
   ``renormalize`` (divided by sum + ``renorm_eps``), then multiplied by the chosen experts' learned
   ``expert_scale [E]`` (Gemma 4's ``per_expert_scale``) and by ``scaling`` (routed_scaling_factor).
6. Capacity-limited routing (``expert_capacity`` C, ``capacity_window`` W; Switch Transformers): the rows in
   consecutive windows of W tokens (a sequence each); in each window an expert takes at most C pairs, claimed in
   row order (then by k), and the pairs past it are dropped: weight 0, so a token whose pairs all drop passes
   through the block as 0 (the model's residual keeps it), as the family computes in eval mode too.
7. Router-weighted shared experts (``shared_rows`` S > 0; Inkling): S more router columns ``router_shared [H, S]``
   score the shared experts with the same function; the routed top-k and all S shared scores are renormalised
   together (their sum), and every weight is multiplied by ``scaling`` and, with ``gain``, by a learned scalar
   ``router_gain [1]``. The S shared weights ``[T, S]`` scale each shared expert's hidden activations
   (`tempo_jax.layer.experts.shared_ffn`).
   Step 6 runs after the weights (a dropped pair's weight is 0) and before step 7.

Sparsemixer (PhiMoE): the k-th choice is the best logit m_k among the experts not yet chosen; its weight is its
softmax over those experts whose logit l is within a relative ``2·mixer_eps`` of it, ``(m_k − l) / max(|l|, m_k)
≤ 2·mixer_eps`` (the mask carries no gradient). This is transformers' eval-mode routing; its training mode samples
the choices (Gumbel) with a Heun gradient estimator, which the layer does not.

Training (returned by the layer, `MoEAux`): the Switch / GShard load-balancing loss ``E·Σ_e f_e·P_e`` over the
router probabilities P (the scores normalised over experts) and the layer's pair fractions f, the router
z-loss ``mean(logsumexp(logits)²)``, and DeepSeek-V3's auxiliary-loss-free balancing (`balance_update`: the
score bias moves by ``rate·sign(mean load − load)``, outside the gradient).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np

from solvers.checks import plain_scalars

__all__ = [
    "SCORINGS",
    "RouterConfig",
    "Routing",
    "balance_update",
    "expert_nodes",
    "route",
    "router_input",
    "router_mlp",
]

Scoring = Literal["softmax", "sigmoid", "sqrt_softplus", "softmax_topk", "sparsemixer"]
SCORINGS: tuple[str, ...] = get_args(Scoring)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """How the router turns logits into choices and weights (see the module).

    Attributes:
      scoring: "softmax", "sigmoid", "sqrt_softplus", "softmax_topk" or "sparsemixer".
      bias: a learned router bias [E] added to the logits (gpt-oss).
      score_bias: a selection-only correction bias [E] (DeepSeek-V3, GLM, DeepSeek-V4).
      bias_on: what the score bias is added to for the choice: "scores" (after the scoring function: DeepSeek-V3)
        or "logits" (before it: Kolibri-1).
      n_group: expert groups of the group-limited choice (1: off). topk_group: groups kept.
      group_score: a group's score: "top2" (the sum of its two best choice scores: DeepSeek-V3, GLM, dots1) or
        "max" (its best: DeepSeek-V2's group_limited_greedy).
      max_nodes: node-limited routing (step 4): each token's experts on at most this many nodes of the placement
        (`MoEConfig.node_axis`'s nodes); 0: off.
      renormalize: divide the chosen weights by their sum (+ renorm_eps).
      renorm_eps: added to the sum before dividing (DeepSeek: 1e-20; Qwen, Mixtral: 0).
      scaling: routed_scaling_factor, applied last.
      balance_rate: aux-free balancing step γ of `balance_update` (0: the score bias stays put).
      weight_on: where a chosen expert's weight applies: "output" (``w · f(x)``, every family but one) or "input"
        (``f(w · x)``: Llama-4 scales the token before its expert).
      mixer_eps: sparsemixer's relative logit window (PhiMoE's ``router_jitter_noise``; see the module).
      input_norm: normalise the router's input by its RMS (no learned weight; Gemma 4) before the projection.
      norm_eps: the epsilon of ``input_norm`` (added to the mean square).
      input_scale: a learned vector ``router_scale [H]`` multiplies the router's input (after ``input_norm``).
      input_multiplier: a constant multiplying the router's input (Gemma 4: H^-1/2).
      expert_scale: a learned ``expert_scale [E]`` multiplies each chosen expert's weight after renormalisation
        (Gemma 4's ``per_expert_scale``; trained like the router).
      shared_rows: S router columns for the shared experts, normalised with the routed top-k (step 6; Inkling; 0:
        the shared experts, if any, are unweighted). Needs ``MoEConfig.shared`` with ``count`` = S.
      gain: a learned scalar ``router_gain [1]`` multiplies every weight (Inkling's ``global_scale``).
      mlp_width: Rh, the width of a router MLP (step 1; Zaya): the router's input is projected to Rh, then RMS-normed
        (learned weight, ``norm_eps``) and passed through two GELU layers before ``router [Rh, E]``; the projection
        ``s [T, Rh]`` is the router state the layer returns. 0: the linear router.
      carried_state: add the previous layer's router state times a learned ``router_carry [Rh]`` to ``s`` (Zaya's
        layers after the first); the state is given per call (`route`'s ``state``; None: nothing added).
      expert_sets: the E experts in this many equal consecutive sets; a token routes within its own set only
        (step 3; `route`'s ``expert_set``; ERNIE-4.5-VL's text and vision experts). 1: one set.
      expert_capacity: C pairs per expert per window (step 6; Switch's ``expert_capacity``); None: no limit.
      capacity_window: W, the tokens of one window (a sequence: the layer's tokens are W-row sequences one after
        another, and every token shard holds whole ones). Set with ``expert_capacity``.
    """

    scoring: Scoring = "softmax"
    bias: bool = False
    score_bias: bool = False
    bias_on: str = "scores"
    n_group: int = 1
    topk_group: int = 1
    renormalize: bool = True
    renorm_eps: float = 0.0
    scaling: float = 1.0
    balance_rate: float = 0.0
    group_score: str = "top2"
    weight_on: str = "output"
    mixer_eps: float = 0.01
    input_norm: bool = False
    norm_eps: float = 1e-6
    input_scale: bool = False
    input_multiplier: float = 1.0
    expert_scale: bool = False
    shared_rows: int = 0
    gain: bool = False
    expert_capacity: int | None = None
    capacity_window: int | None = None
    expert_sets: int = 1
    mlp_width: int = 0
    carried_state: bool = False
    max_nodes: int = 0

    def __post_init__(self):
        plain_scalars(self)  # np.int64(4) behaves as 4

    def validate(self, experts: int, top_k: int) -> None:
        """Raise ValueError when this router cannot route ``top_k`` of ``experts`` experts."""
        w = "RouterConfig"
        if self.scoring not in SCORINGS:
            raise ValueError(f"{w}: unknown scoring {self.scoring!r}; one of {list(SCORINGS)}")
        for name in (
            "bias",
            "score_bias",
            "renormalize",
            "input_norm",
            "input_scale",
            "expert_scale",
            "gain",
            "carried_state",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{w}.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("n_group", "topk_group"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{w}.{name} must be an integer >= 1, got {v!r}")
        m = self.max_nodes
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"{w}.max_nodes must be an integer >= 0 (0: not node-limited), got {m!r}")
        if m and (self.n_group > 1 or self.scoring == "sparsemixer" or self.expert_sets > 1):
            raise ValueError(
                f"{w}: max_nodes={m} limits the choice to the best nodes; with n_group > 1, expert_sets > 1 or "
                "sparsemixer the choice is limited otherwise: use one of them"
            )
        if experts % self.n_group:
            raise ValueError(f"{w}: n_group={self.n_group} does not divide experts={experts}")
        if self.topk_group > self.n_group:
            raise ValueError(f"{w}: topk_group={self.topk_group} exceeds n_group={self.n_group}")
        if self.n_group > 1 and self.group_score == "top2" and experts // self.n_group < 2:
            raise ValueError(f"{w}: a group's score sums its two best experts; {experts // self.n_group} per group")
        if top_k > self.topk_group * (experts // self.n_group):
            raise ValueError(
                f"{w}: top_k={top_k} exceeds the {self.topk_group} kept groups' "
                f"{self.topk_group * (experts // self.n_group)} experts"
            )
        for name in ("renorm_eps", "scaling", "balance_rate", "mixer_eps", "norm_eps", "input_multiplier"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (v >= 0 and v < float("inf")):
                raise ValueError(f"{w}.{name} must be a finite number >= 0, got {v!r}")
        if self.scaling == 0:
            raise ValueError(f"{w}.scaling must be > 0 (every routed output would be 0)")
        if self.input_multiplier == 0:
            raise ValueError(f"{w}.input_multiplier must be > 0 (every router input would be 0)")
        if not (self.input_norm or self.mlp_width) and self.norm_eps != RouterConfig.norm_eps:
            raise ValueError(
                f"{w}.norm_eps={self.norm_eps} is the epsilon of the router's input norm or of its MLP's norm; with "
                "input_norm=False and mlp_width=0 it would be ignored (leave it out or set input_norm=True)"
            )
        if self.scoring == "softmax_topk" and self.renorm_eps:
            raise ValueError(
                f"{w}: softmax_topk weights sum to 1 already; renorm_eps={self.renorm_eps} would be ignored"
            )
        if self.scoring == "sparsemixer" and (self.score_bias or self.n_group > 1):
            raise ValueError(
                f"{w}: sparsemixer chooses on the raw logits; a score bias or group-limited choice "
                "(score_bias, n_group) is not defined with it"
            )
        if self.balance_rate and not self.score_bias:
            raise ValueError(f"{w}: balance_rate > 0 moves the score bias; set score_bias=True")
        if self.group_score not in ("top2", "max"):
            raise ValueError(f"{w}.group_score must be 'top2' or 'max', got {self.group_score!r}")
        if self.n_group == 1 and self.group_score != RouterConfig.group_score:
            raise ValueError(
                f"{w}.group_score={self.group_score!r} scores expert groups; with n_group=1 there is no "
                "group choice to score (set n_group > 1 or leave group_score out)"
            )
        if not self.renormalize and self.renorm_eps:
            raise ValueError(
                f"{w}.renorm_eps={self.renorm_eps} is added to the renormalising sum; with "
                "renormalize=False nothing is renormalised (drop renorm_eps or set renormalize=True)"
            )
        if self.scoring != "sparsemixer" and self.mixer_eps != RouterConfig.mixer_eps:
            raise ValueError(
                f"{w}.mixer_eps={self.mixer_eps} is sparsemixer's logit window; scoring "
                f"{self.scoring!r} would ignore it (leave it out or set scoring='sparsemixer')"
            )
        if self.bias_on not in ("scores", "logits"):
            raise ValueError(f"{w}.bias_on must be 'scores' or 'logits', got {self.bias_on!r}")
        if self.bias_on != RouterConfig.bias_on and not self.score_bias:
            raise ValueError(f"{w}.bias_on={self.bias_on!r} places the score bias; set score_bias=True or leave it out")
        if self.weight_on not in ("output", "input"):
            raise ValueError(f"{w}.weight_on must be 'output' or 'input', got {self.weight_on!r}")
        for name in ("expert_capacity", "capacity_window"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{w}.{name} must be None or an integer >= 1, got {v!r}")
        if (self.expert_capacity is None) != (self.capacity_window is None):
            raise ValueError(
                f"{w}: expert_capacity (pairs per expert per window) and capacity_window (tokens per window) go "
                f"together; got expert_capacity={self.expert_capacity}, capacity_window={self.capacity_window}"
            )
        v = self.expert_sets
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{w}.expert_sets must be an integer >= 1, got {v!r}")
        if experts % v:
            raise ValueError(f"{w}: expert_sets={v} does not divide the router's {experts} experts into equal sets")
        if v > 1 and top_k > experts // v:
            raise ValueError(f"{w}: top_k={top_k} exceeds the {experts // v} experts of one set (expert_sets={v})")
        if v > 1 and (self.n_group > 1 or self.scoring == "sparsemixer"):
            raise ValueError(f"{w}: expert_sets > 1 is not defined with group-limited choice or sparsemixer scoring")
        v = self.mlp_width
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{w}.mlp_width must be an integer >= 0 (0: a linear router), got {v!r}")
        if self.carried_state and not v:
            raise ValueError(
                f"{w}.carried_state adds the previous layer's router state to the router MLP's input: it "
                "needs mlp_width > 0"
            )
        if v and (self.input_norm or self.input_scale or self.input_multiplier != 1.0):
            raise ValueError(
                f"{w}: mlp_width={v} projects the router's input before its own norm; input_norm, "
                "input_scale and input_multiplier are not defined with it"
            )
        if v and (self.shared_rows or self.scoring == "sparsemixer"):
            raise ValueError(f"{w}: mlp_width={v} is not defined with shared_rows or sparsemixer scoring")
        v = self.shared_rows
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{w}.shared_rows must be an integer >= 0, got {v!r}")
        if v and self.scoring not in ("sigmoid", "sqrt_softplus"):
            raise ValueError(
                f"{w}.shared_rows={v} scores the shared experts beside the routed ones one by one: it needs an "
                f"elementwise scoring ('sigmoid' or 'sqrt_softplus'), got {self.scoring!r}"
            )
        if v and self.weight_on != "output":
            raise ValueError(f"{w}.shared_rows weights the shared experts' outputs: it needs weight_on='output'")


class Routing(NamedTuple):
    """A rank's routing: ``ids [T, K]`` int32 experts, ``gate [T, K]`` float32 combine weights, ``probs [T, E]``
    float32 router probabilities (scores normalised over experts: the load-balancing loss reads them), ``logits
    [T, E]`` float32 (the z-loss reads them), ``shared [T, S]`` float32 the shared experts' weights (step 6; None
    without ``shared_rows``), ``state [T, Rh]`` float32 the router state a router MLP hands on (None without
    ``mlp_width``)."""

    ids: jax.Array
    gate: jax.Array
    probs: jax.Array
    logits: jax.Array
    shared: jax.Array | None = None
    state: jax.Array | None = None


def _scores(logits: jax.Array, scoring: str) -> jax.Array:
    if scoring == "softmax":
        return jax.nn.softmax(logits, axis=-1)
    if scoring == "sigmoid":
        return jax.nn.sigmoid(logits)
    if scoring == "sqrt_softplus":
        return jnp.sqrt(jax.nn.softplus(logits))
    return logits  # softmax_topk, sparsemixer: choose on the raw logits


def _sparsemixer(logits: jax.Array, top_k: int, eps: float) -> tuple[jax.Array, jax.Array]:
    """PhiMoE's eval-mode sparsemixer (see the module): ``ids [T, K]`` and their weights ``[T, K]``."""
    ids, weights = [], []
    free = logits
    for _ in range(top_k):
        best, pick = jax.lax.top_k(free, 1)  # [T, 1]
        factor = jnp.maximum(jnp.abs(logits), best)
        far = jax.lax.stop_gradient((best - logits) / factor > 2 * eps)  # 0 / 0 is NaN: not far, as in torch
        gates = jax.nn.softmax(jnp.where(far, -jnp.inf, free), axis=-1)
        ids.append(pick)
        weights.append(jnp.take_along_axis(gates, pick, axis=1))
        free = jnp.where(jnp.arange(logits.shape[1]) == pick, -jnp.inf, free)
    return jnp.concatenate(ids, axis=1), jnp.concatenate(weights, axis=1)


def router_input(x: jax.Array, params: dict, config: RouterConfig) -> jax.Array:
    """Step 0 of the module: the router's input ``x [T, H]`` → ``[T, H]`` float32 (its RMS norm, learned scale
    ``router_scale [H]`` and constant multiplier, where the config has them)."""
    x = x.astype(jnp.float32)
    if config.input_norm:
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + config.norm_eps)
    if config.input_scale:
        x = x * params["router_scale"].astype(jnp.float32)
    if config.input_multiplier != 1.0:
        x = x * config.input_multiplier
    return x


def router_mlp(x: jax.Array, params: dict, config: RouterConfig, state: jax.Array | None = None):
    """Step 1 with a router MLP (``config.mlp_width`` Rh): ``x [T, H]`` and the previous layer's ``state [T, Rh]``
    (``carried_state``; None: nothing carried) → ``(features [T, Rh], state [T, Rh])``, float32: the router state
    ``s = x·router_in + router_in_bias (+ router_carry ⊙ state)`` and the MLP's last hidden
    ``gelu(gelu(rms(s)·router_norm·router_fc1 + router_fc1_bias)·router_fc2 + router_fc2_bias)``."""
    hp, f32 = jax.lax.Precision.HIGHEST, jnp.float32
    s = jnp.dot(x.astype(f32), params["router_in"].astype(f32), precision=hp) + params["router_in_bias"].astype(f32)
    if config.carried_state and state is not None:
        s = s + state.astype(f32) * params["router_carry"].astype(f32)
    h = s * jax.lax.rsqrt(jnp.mean(s * s, axis=-1, keepdims=True) + config.norm_eps) * params["router_norm"]
    for layer in ("router_fc1", "router_fc2"):
        h = jnp.dot(h, params[layer].astype(f32), precision=hp) + params[f"{layer}_bias"].astype(f32)
        h = jax.nn.gelu(h, approximate=False)
    return h, s


def _node_limited(choice: jax.Array, nodes: tuple[jax.Array, int], max_nodes: int, top_k: int) -> jax.Array:
    """Step 4's node limit: ``choice [T, E]`` with the experts outside each token's ``max_nodes`` best nodes at
    −∞; a node scores the sum of its best ⌈K / M⌉ choice scores (``nodes``: ``(expert_node [E], Nn)``)."""
    expert_node, num_nodes = nodes
    expert_node = jnp.asarray(expert_node, jnp.int32)
    q = -(-top_k // max_nodes)
    on = expert_node[None, :] == jnp.arange(num_nodes)[:, None]  # [Nn, E]
    per_node = jnp.where(on[None], choice[:, None, :], -jnp.inf)  # [T, Nn, E]
    best = jax.lax.top_k(per_node, q)[0]  # [T, Nn, q]
    score = jnp.sum(jnp.where(jnp.isfinite(best), best, 0.0), axis=-1)
    score = jnp.where(jnp.any(on, axis=1)[None, :], score, -jnp.inf)  # a node without experts is never kept
    kept = jax.lax.top_k(score, min(max_nodes, num_nodes))[1]  # [T, M]
    keep = jnp.zeros(score.shape, bool).at[jnp.arange(score.shape[0])[:, None], kept].set(True)
    allowed = jnp.take_along_axis(keep, jnp.broadcast_to(expert_node[None, :], choice.shape), axis=1)
    return jnp.where(allowed, choice, -jnp.inf)


def expert_nodes(phy2log, num_experts: int, num_nodes: int):
    """Each expert's node ``[E]`` int32 from the placement's ``phy2log [P]`` (the P slots in rank order over Nn
    equal nodes): the node of its slots — numpy in, numpy out (an expert with slots on two nodes raises
    ValueError: node-limited routing counts each expert on one node); a traced array in, the node of its last
    slot out (the layer's in-graph copy of what the host checked)."""
    P = phy2log.shape[0]
    if not isinstance(phy2log, np.ndarray):
        slot_node = (jnp.arange(P) // (P // num_nodes)).astype(jnp.int32)
        hi = jnp.full((num_experts,), -1, jnp.int32).at[phy2log].max(slot_node)
        return jnp.maximum(hi, 0)
    slot_node = np.arange(P) // (P // num_nodes)
    lo = np.full(num_experts, num_nodes, np.int64)
    hi = np.full(num_experts, -1, np.int64)
    np.minimum.at(lo, phy2log, slot_node)
    np.maximum.at(hi, phy2log, slot_node)
    split = np.flatnonzero((hi >= 0) & (lo != hi))
    if split.size:
        e = int(split[0])
        raise ValueError(
            f"expert {e} has slots on nodes {int(lo[e])} and {int(hi[e])}; node-limited routing "
            "(RouterConfig.max_nodes) counts each expert on one node: keep an expert's replicas on one node"
        )
    return np.maximum(hi, 0).astype(np.int32)


def route(
    x: jax.Array,
    params: dict,
    config: RouterConfig,
    top_k: int,
    expert_set: jax.Array | None = None,
    state: jax.Array | None = None,
    nodes: tuple[jax.Array, int] | None = None,
) -> Routing:
    """The router of ``config`` over ``x [T, H]`` with ``params`` (``router [H, E]``, optional ``router_bias [E]``,
    ``score_bias [E]``, ``router_scale [H]``, ``expert_scale [E]``, ``router_shared [H, S]``, ``router_gain [1]``;
    with a router MLP ``router [Rh, E]`` and the `router_mlp` arrays) → `Routing`. ``expert_set [T]`` int: each
    token's set with ``config.expert_sets`` > 1 (None: set 0); ``state [T, Rh]``: the previous layer's router state
    (``carried_state``; None: nothing carried); ``nodes``: ``(expert_node [E] int, Nn)``, each expert's node and
    the node count, for ``config.max_nodes`` (`expert_nodes`)."""
    if config.max_nodes and nodes is None:
        raise ValueError(
            f"route: RouterConfig(max_nodes={config.max_nodes}) chooses among the experts' nodes; give nodes=("
            "expert_node [E], Nn) (the layer passes them from the placement; moe_reference takes expert_nodes=)"
        )
    carried = None
    if config.mlp_width:
        x, carried = router_mlp(x, params, config, state)
    else:
        x = router_input(x, params, config)
    logits = jnp.dot(x, params["router"].astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    if config.bias:
        logits = logits + params["router_bias"].astype(jnp.float32)
    T, E = logits.shape
    in_set = None
    if config.expert_sets > 1:  # a token chooses within its own set: the other sets' logits are -inf
        own = jnp.zeros((T,), jnp.int32) if expert_set is None else expert_set.astype(jnp.int32)
        in_set = jnp.arange(E)[None, :] // (E // config.expert_sets) == own[:, None]
        logits = jnp.where(in_set, logits, -jnp.inf)
    # Step 1: scores, and the choice scores (selection-only bias, no gradient into it).
    scores = _scores(logits, config.scoring)
    choice = scores
    if config.score_bias:
        base = logits if config.bias_on == "logits" else scores
        choice = base + jax.lax.stop_gradient(params["score_bias"].astype(jnp.float32))
    if in_set is not None:  # (a selection bias must not lift another set's expert)
        choice = jnp.where(in_set, choice, -jnp.inf)
    choice = jax.lax.stop_gradient(choice)
    # Step 2: group-limited choice: a group scores the sum of its two best; experts of other groups are out.
    if config.n_group > 1:
        grouped = choice.reshape(T, config.n_group, E // config.n_group)
        if config.group_score == "max":
            group_score = jnp.max(grouped, axis=-1)  # [T, n_group]: DeepSeek-V2
        else:
            group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [T, n_group]
        kept = jax.lax.top_k(group_score, config.topk_group)[1]  # [T, topk_group]
        keep = jnp.zeros((T, config.n_group), bool).at[jnp.arange(T)[:, None], kept].set(True)
        choice = jnp.where(jnp.repeat(keep, E // config.n_group, axis=1), choice, -jnp.inf)
    if config.max_nodes:
        choice = _node_limited(choice, nodes, config.max_nodes, top_k)
    # Step 3: the top-k and their weights from the unbiased scores.
    if config.scoring == "sparsemixer":
        ids, picked = _sparsemixer(logits, top_k, config.mixer_eps)
    else:
        _, ids = jax.lax.top_k(choice, top_k)
        picked = jnp.take_along_axis(scores, ids, axis=1)
    if config.scoring == "softmax_topk":
        gate = jax.nn.softmax(picked, axis=-1)
        probs = jax.nn.softmax(logits, axis=-1)
    else:
        gate = picked
        shared = None
        if config.shared_rows:  # step 6: the shared experts' scores, renormalised with the routed top-k
            hp = jax.lax.Precision.HIGHEST
            shared = _scores(jnp.dot(x, params["router_shared"].astype(jnp.float32), precision=hp), config.scoring)
        if config.renormalize:
            total = jnp.sum(gate, axis=-1, keepdims=True) + config.renorm_eps
            if shared is not None:
                total = total + jnp.sum(shared, axis=-1, keepdims=True)
                shared = shared / total
            gate = gate / total
        if config.scoring == "softmax":
            probs = scores
        elif config.scoring == "sparsemixer":
            probs = jax.nn.softmax(logits, axis=-1)
        else:
            probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    if config.expert_scale:
        gate = gate * params["expert_scale"].astype(jnp.float32)[ids]
    if config.expert_capacity is not None:
        gate = jnp.where(_within_capacity(ids, E, config.expert_capacity, config.capacity_window), gate, 0.0)
    if config.shared_rows:
        gain = config.scaling * (params["router_gain"].astype(jnp.float32)[0] if config.gain else 1.0)
        return Routing(ids.astype(jnp.int32), gate * gain, probs, logits, shared * gain)
    if config.gain:
        gate = gate * params["router_gain"].astype(jnp.float32)[0]
    return Routing(ids.astype(jnp.int32), gate * config.scaling, probs, logits, None, carried)


def _within_capacity(ids: jax.Array, experts: int, capacity: int, window: int) -> jax.Array:
    """Step 6: ``[T, K]`` whether each pair is among the first ``capacity`` claims of its expert in its window of
    ``window`` rows (claims in row order, then by k). T must be a multiple of ``window``."""
    T, K = ids.shape
    if T % window:
        raise ValueError(
            f"route: capacity-limited routing counts claims per window of {window} tokens (RouterConfig."
            f"capacity_window), but this shard holds {T} tokens; give whole windows (T a multiple of {window})"
        )
    claims = jax.nn.one_hot(ids.reshape(T // window, window * K), experts, dtype=jnp.int32)  # [n, W·K, E]
    rank = jnp.cumsum(claims, axis=1)  # the claim's place in its expert's queue (1-based)
    place = jnp.sum(rank * claims, axis=-1).reshape(T, K)
    return place <= capacity


def balance_update(score_bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
    """DeepSeek-V3's auxiliary-loss-free balancing: ``score_bias [E] + rate·sign(mean(load) − load)`` for the
    per-expert ``load [E]`` of a step (outside the gradient: under-loaded experts become likelier to be chosen)."""
    load = jax.lax.stop_gradient(load.astype(jnp.float32))
    return jax.lax.stop_gradient(score_bias + rate * jnp.sign(jnp.mean(load) - load))
