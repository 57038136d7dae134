"""A tiny decoder-only MoE language model built on `tempo_jax.MoE`, trained with optax AdamW.

Byte-level, on a small real text corpus that ships with every CPython and is the same in all of them: the names of
the Unicode 3.2 characters (`unicodedata.ucd_3_2_0`, frozen for IDNA; ~0.35 MB of English words, one name a line).
No downloads, and the same bytes on Python 3.11 and 3.13 (the interpreter's own docs, `pydoc_data`, differ).

    result = train(LMConfig(), steps=40)            # on the 8 fake CPU devices of the tests
    result.losses                                   # [steps] training loss (cross-entropy + auxiliary terms)
    result.trace                                    # RoutingTrace of the recorded routing (record=True)
    result.imbalance                                # [steps] max / mean expert load, averaged over layers

Balancing (each optional, `LMConfig`): the Switch / GShard load-balancing loss (``aux_loss`` coefficient), the
router z-loss (``z_loss``) and DeepSeek-V3's auxiliary-loss-free balancing (``balance_rate``: the router's
selection-only score bias moves by balance_rate·sign(mean load − load) after every step, outside the gradient).

Glossary additions: B batch, Q sequence length, V vocabulary (256 bytes)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import Placement
from solvers.checks import plain_scalars

from ..layer.config import MoEConfig, make_ep_mesh
from ..layer.module import MoE, aux_losses, place_on_mesh
from ..layer.routing import RouterConfig
from ..metrics import Watcher, WatchOptions
from ..workloads import RoutingTrace

__all__ = ["LMConfig", "TinyMoELM", "TrainResult", "corpus", "train"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LMConfig:
    """Model and training shape. ``slots_per_rank · D`` physical slots hold the ``experts`` (EPLB, even load).
    ``aux_loss`` / ``z_loss``: coefficients of the layers' load-balancing and z losses in the training loss;
    ``balance_rate``: aux-free balancing's step (0: off; on: the router gets a selection-only score bias);
    ``capacity``: the MoE layers' `MoEConfig.capacity` (default "auto": dropless rounds)."""

    dim: int = 64
    layers: int = 2
    heads: int = 4
    seq_len: int = 64
    batch: int = 8
    experts: int = 8
    top_k: int = 2
    ffn: int = 64
    slots_per_rank: int = 2
    lr: float = 3e-3
    dispatch_mode: str = "sample"
    aux_loss: float = 0.0
    z_loss: float = 0.0
    balance_rate: float = 0.0
    capacity: int | str | None = "auto"

    def __post_init__(self):
        plain_scalars(self)  # np.int64(4) behaves as 4


#: Name prefixes of the Unicode 3.2 characters left out of `corpus`: numbered names (ideographs, syllables).
_NUMBERED = ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH", "HANGUL SYLLABLE")


def corpus() -> np.ndarray:
    """uint8 bytes of the Unicode 3.2 character names in code-point order, one a line, numbered names left out
    (`unicodedata.ucd_3_2_0`: the same database in every CPython 3, so the same corpus on every Python)."""
    import unicodedata

    db = unicodedata.ucd_3_2_0
    names = (db.name(chr(cp), "") for cp in range(0x110000))
    text = "\n".join(n for n in names if n and not n.startswith(_NUMBERED))
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8)


class Block(nnx.Module):
    def __init__(self, cfg: LMConfig, moe_cfg: MoEConfig, placement: Placement, mesh, rngs: nnx.Rngs, record: bool):
        self.norm1 = nnx.RMSNorm(cfg.dim, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=cfg.heads, in_features=cfg.dim, qkv_features=cfg.dim, decode=False, rngs=rngs
        )
        self.norm2 = nnx.RMSNorm(cfg.dim, rngs=rngs)
        self.moe = MoE(moe_cfg, placement, mesh=mesh, rngs=rngs, record=record)

    def __call__(self, x, mask, decode: bool = False):
        x = x + self.attn(self.norm1(x), mask=mask, decode=decode)
        return x + self.moe(self.norm2(x))


class TinyMoELM(nnx.Module):
    """Embedding → ``layers`` × (attention + MoE) → RMSNorm → tied output head. ``[B, L]`` bytes → logits.

    Args:
      cfg: `LMConfig`.
      mesh: the mesh: an ``ep`` axis (`make_ep_mesh`) or `tempo_jax.layer.make_mesh`'s ``data × ep × tensor`` (the
        MoE layers split tokens over ``data`` and every expert's F over ``tensor``).
      rngs: ``nnx.Rngs`` (``params``, optionally ``dispatch``).
      record: keep each MoE layer's routing (`TrainResult.trace`).
      placements: one `solvers.Placement` per MoE layer (default: EPLB-even over ``slots_per_rank`` slots per
        rank); its slots per rank set the layer's.

    ``model(tokens)`` is a prefill step (causal attention over ``[B, L]``); after ``model.init_cache(B, L)``,
    ``model(tokens [B, 1], decode=True)`` is one decode step through the attention's KV cache.
    """

    def __init__(
        self, cfg: LMConfig, *, mesh, rngs: nnx.Rngs, record: bool = False, placements: list[Placement] | None = None
    ):
        D = mesh.shape["ep"]
        tensor = "tensor" if mesh.shape.get("tensor", 1) > 1 else None  # a make_mesh tensor axis splits each F
        if placements is None:
            placements = [Placement.from_eplb(np.ones(cfg.experts), cfg.slots_per_rank * D, D)] * cfg.layers
        if len(placements) != cfg.layers:
            raise ValueError(f"TinyMoELM: {len(placements)} placements for {cfg.layers} layers")
        router = RouterConfig(score_bias=cfg.balance_rate > 0, balance_rate=cfg.balance_rate)
        moe_cfgs = [
            MoEConfig(
                hidden=cfg.dim,
                ffn=cfg.ffn,
                experts=cfg.experts,
                top_k=cfg.top_k,
                slots_per_rank=p.slots_per_rank,
                dispatch_mode=cfg.dispatch_mode,
                router=router,
                capacity=cfg.capacity,
                tensor_axis=tensor,
            )
            for p in placements
        ]
        self.cfg = cfg
        self.placements = tuple(placements)
        self.embed = nnx.Embed(256, cfg.dim, rngs=rngs)
        blocks = [Block(cfg, c, p, mesh, rngs, record) for c, p in zip(moe_cfgs, placements, strict=True)]
        self.blocks = nnx.List(blocks)
        self.norm = nnx.RMSNorm(cfg.dim, rngs=rngs)
        self.mesh = mesh
        place_on_mesh(self, mesh)

    def init_cache(self, batch: int, length: int) -> None:
        """An empty KV cache of ``length`` positions for ``batch`` sequences in every attention layer (placed on
        the mesh like the rest of the state, so a jitted decode step sees one sharding and compiles once)."""
        for block in self.blocks:
            block.attn.init_cache((batch, length, self.cfg.dim))
        place_on_mesh(self, self.mesh)

    def __call__(self, tokens: jax.Array, *, decode: bool = False) -> jax.Array:
        x = self.embed(tokens)
        mask = None if decode else nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask, decode)
        return self.embed.attend(self.norm(x))


@dataclasses.dataclass
class TrainResult:
    """Losses ``[steps]``, wall time, the recorded routing (None unless ``record=True``), the model, and
    ``imbalance [steps]``: max / mean pairs per expert of each step, averaged over the MoE layers (1 = balanced)."""

    losses: np.ndarray
    seconds: float
    trace: RoutingTrace | None
    model: TinyMoELM
    imbalance: np.ndarray


def _batches(data: np.ndarray, cfg: LMConfig, seed: int):
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, data.size - cfg.seq_len - 1, cfg.batch)
        win = np.stack([data[s : s + cfg.seq_len + 1] for s in starts]).astype(np.int32)
        yield jnp.asarray(win[:, :-1]), jnp.asarray(win[:, 1:])


def train(
    cfg: LMConfig = LMConfig(),
    *,
    steps: int = 40,
    seed: int = 0,
    mesh=None,
    record: bool = False,
    model: TinyMoELM | None = None,
    logdir: str | None = None,
    watch: WatchOptions | None = None,
) -> TrainResult:
    """Train the tiny MoE LM for ``steps`` AdamW steps on the shipped corpus (a new model, or ``model``, built with
    ``cfg`` and ``mesh``); optionally record routing.

    ``logdir``: write TensorBoard event files there (``train/loss``, ``train/imbalance`` and every MoE layer's
    balancedness, modelled makespans, drops, rounds and expert-load histogram per step) and ``metrics.jsonl``
    (`tempo-jax report LOGDIR`); ``watch``: any other `tempo_jax.metrics.WatchOptions` (a Prometheus port …)."""
    mesh = mesh or make_ep_mesh()
    if model is None:
        model = TinyMoELM(cfg, mesh=mesh, rngs=nnx.Rngs(params=seed, dispatch=seed + 1), record=record)
    opt = nnx.Optimizer(model, optax.adamw(cfg.lr, weight_decay=0.01), wrt=nnx.Param)
    place_on_mesh(opt, mesh)

    @nnx.jit(graph=False)  # tree mode: only the state that changed comes back (no copy of the rest)
    def step(model, opt, x, y):
        def loss_fn(m):
            loss = optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()
            aux = aux_losses(m)  # every MoE layer's losses of this forward, summed
            return loss + cfg.aux_loss * aux["load_balance"] + cfg.z_loss * aux["z"]

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        loads = jnp.stack([block.moe.expert_load.get_value() for block in model.blocks])  # [layers, E]
        return loss, jnp.mean(loads.max(axis=1) / loads.mean(axis=1))

    data = corpus()
    batches = _batches(data, cfg, seed)
    groups = mesh.shape.get("data", 1)  # data parallelism: each data replica gets its rows of the batch
    rows = NamedSharding(mesh, P("data")) if groups > 1 and cfg.batch % groups == 0 else None
    losses, ids = [], {i: [] for i in range(cfg.layers)}
    watch = watch or WatchOptions()
    if logdir is not None:
        watch = dataclasses.replace(watch, logdir=str(logdir), jsonl=watch.jsonl or str(Path(logdir) / "metrics.jsonl"))
    t0 = time.perf_counter()
    imbalance = []
    with Watcher(watch) if watch.active else contextlib.nullcontext() as watcher:
        for s in range(steps):
            x, y = next(batches)
            if rows is not None:
                x, y = jax.device_put((x, y), rows)
            t_step = time.perf_counter()
            loss, skew = step(model, opt, x, y)
            losses.append(float(loss))
            imbalance.append(float(skew))
            if watcher is not None:  # host copies start now; this step is recorded after the next one
                ms = (time.perf_counter() - t_step) * 1e3
                scalars = {"train/loss": losses[-1], "train/imbalance": imbalance[-1]}
                watcher.step(s, model, kind="train", step_ms=ms, scalars=scalars)
            if record:
                for i, block in enumerate(model.blocks):
                    ids[i].append(np.asarray(block.moe.topk_ids.get_value()))
    seconds = time.perf_counter() - t0
    trace = None
    if record:
        trace = RoutingTrace(
            name="tiny_moe_lm",
            model=f"tempo_jax.lm.model.TinyMoELM({cfg.layers}×{cfg.experts} experts, top-{cfg.top_k})",
            num_experts=cfg.experts,
            top_k=cfg.top_k,
            topk_ids={i: np.concatenate(v) for i, v in ids.items()},
            source="recorded by tempo_jax.lm.model.train",
            notes=f"{steps} training steps of {cfg.batch}×{cfg.seq_len} tokens; routing during training",
        )
    return TrainResult(np.array(losses), seconds, trace, model, np.array(imbalance))
