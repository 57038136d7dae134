"""`RoutingTrace`: one in-memory representation for every routing recording (numpy only).

Glossary additions: B tokens per rank.

A trace holds, per MoE layer, *either*

- ``topk_ids[layer]``: int64 ``[T, K]`` logical expert ids per token (token order as recorded, K distinct
  ids per row, column 0 = highest router score), optionally with ``topk_weights[layer]`` float32 ``[T, K]``;
- or ``rank_counts[layer]``: int64 ``[I, Gs, E]`` token–expert-pair counts that each of Gs source ranks sent
  to each expert in each of I recorded forward iterations (per-token identity was not recorded).

Batches (what the dispatch solvers consume) are ``counts [D, E]``: token–expert pairs from each of D
source ranks to each expert, for B tokens per rank, so every row sums to B·K.

- Per-token traces: batch ``b`` takes the consecutive tokens ``[b·B·D, (b+1)·B·D)`` and deals them to
  ranks in contiguous chunks of B (rank g gets ``[b·B·D + g·B, b·B·D + (g+1)·B)``); any ``D`` works and
  the leftover ``T mod B·D`` tokens are not used.
- Per-rank recordings: ``D`` must equal the recorded Gs (ranks are never regrouped). With B equal to the
  recorded tokens per rank, batch ``i`` is exactly recorded iteration ``i``. With a smaller B, each rank's
  recorded tokens of an iteration are put in a fixed pseudo-random order (seeded by layer, iteration and
  rank, so replays are reproducible) and cut into ``n_rec // B`` disjoint sub-batches: a sub-batch is a
  uniformly random B-token subset of that rank's recorded batch (multivariate hypergeometric), which is
  the best one can do without token order. Iteration ``i`` yields batches ``[i·m, (i+1)·m)`` with
  ``m = n_rec // B``. Sub-batching needs K = 1 (all bundled per-rank recordings are top-1): with K > 1 it
  would split a token's K experts apart, so only B = n_rec is accepted then.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from solvers.checks import check_int

__all__ = ["RoutingTrace"]

# Fixed seed of the within-rank shuffle used to sub-batch per-rank recordings (see module docstring).
_SUBBATCH_SEED = 0x7E3B0


def _frozen_map(name: str, mapping: Mapping, dtype: type) -> Mapping[int, np.ndarray]:
    out = {}
    for layer, arr in mapping.items():
        if isinstance(layer, bool) or not isinstance(layer, int | np.integer):
            raise ValueError(f"{name} keys must be integer layer ids, got {layer!r}")
        src = np.asarray(arr)
        if dtype is np.int64 and src.size and not np.issubdtype(src.dtype, np.integer):
            raise ValueError(f"{name}[{layer}] must hold integers, got dtype {src.dtype}")
        a = np.array(src, dtype=dtype, copy=True)
        a.setflags(write=False)
        out[int(layer)] = a
    return MappingProxyType(dict(sorted(out.items())))


@dataclass(frozen=True, eq=False)
class RoutingTrace:
    """Routing of one model on one recording, per MoE layer (see the module docstring for the layouts).

    Attributes:
        name: registry name (e.g. ``"flame_moe_290m"``).
        model: model the routing came from.
        num_experts: E, logical (routed) experts per layer.
        top_k: K, experts per token.
        topk_ids: ``{layer: int64 [T, K]}`` for per-token recordings, else ``None``.
        rank_counts: ``{layer: int64 [I, Gs, E]}`` for per-rank count recordings, else ``None``.
        topk_weights: ``{layer: float32 [T, K]}`` router scores matching ``topk_ids`` where recorded.
        source: where the data was read from.
        notes: caveats about this recording (degenerate layers, sorted rows, ...).

    Arrays are copied and made read-only; the mappings are read-only views.
    """

    name: str
    model: str
    num_experts: int
    top_k: int
    topk_ids: Mapping[int, np.ndarray] | None = field(default=None, repr=False)
    rank_counts: Mapping[int, np.ndarray] | None = field(default=None, repr=False)
    topk_weights: Mapping[int, np.ndarray] | None = field(default=None, repr=False)
    source: str = ""
    notes: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        E = check_int("num_experts", self.num_experts)
        K = check_int("top_k", self.top_k)
        if K > E:
            raise ValueError(f"top_k={K} exceeds num_experts={E}")
        if (self.topk_ids is None) == (self.rank_counts is None):
            raise ValueError("give exactly one of topk_ids (per-token) or rank_counts (per-rank counts)")
        if self.topk_ids is not None:
            ids = _frozen_map("topk_ids", self.topk_ids, np.int64)
            if not ids:
                raise ValueError("topk_ids holds no layer")
            for layer, a in ids.items():
                if a.ndim != 2 or a.shape[1] != K:
                    raise ValueError(f"topk_ids[{layer}] must be [T, K={K}], got shape {a.shape}")
                if a.size and (a.min() < 0 or a.max() >= E):
                    raise ValueError(f"topk_ids[{layer}] has expert ids outside [0, {E})")
                if K > 1 and a.size and np.any(np.diff(np.sort(a, axis=1), axis=1) == 0):
                    raise ValueError(f"topk_ids[{layer}] repeats an expert within a token")
            object.__setattr__(self, "topk_ids", ids)
            if self.topk_weights is not None:
                w = _frozen_map("topk_weights", self.topk_weights, np.float32)
                for layer, a in w.items():
                    if layer not in ids or a.shape != ids[layer].shape:
                        raise ValueError(f"topk_weights[{layer}] must match topk_ids[{layer}] in shape")
                    bad = ~(np.isfinite(a) & (a >= 0))
                    if bad.any():
                        t, k = np.argwhere(bad)[0]
                        raise ValueError(
                            f"topk_weights[{layer}] must be finite and >= 0, got {a[t, k].item()!r} at token {t}, "
                            f"slot {k}"
                        )
                object.__setattr__(self, "topk_weights", w)
        else:
            if self.topk_weights is not None:
                raise ValueError("topk_weights needs per-token topk_ids")
            rc = _frozen_map("rank_counts", self.rank_counts, np.int64)
            if not rc:
                raise ValueError("rank_counts holds no layer")
            shapes = set()
            for layer, a in rc.items():
                if a.ndim != 3 or a.shape[2] != E or a.shape[0] < 1 or a.shape[1] < 1:
                    raise ValueError(f"rank_counts[{layer}] must be [I, Gs, E={E}], got shape {a.shape}")
                if a.min() < 0:
                    raise ValueError(f"rank_counts[{layer}] has negative counts")
                if np.any(a.sum(axis=2) % K):
                    raise ValueError(f"rank_counts[{layer}]: per-rank pair totals must be multiples of K={K}")
                shapes.add(a.shape[1])
            if len(shapes) != 1:
                raise ValueError(f"rank_counts layers disagree on the number of source ranks: {sorted(shapes)}")
            object.__setattr__(self, "rank_counts", rc)

    # ----------------------------------------------------------------------------------------------- info
    @property
    def layers(self) -> tuple[int, ...]:
        """Recorded MoE layer ids, ascending."""
        return tuple((self.topk_ids if self.topk_ids is not None else self.rank_counts).keys())

    @property
    def per_token(self) -> bool:
        """True for per-token recordings (``topk_ids``), False for per-rank counts (``rank_counts``)."""
        return self.topk_ids is not None

    @property
    def num_source_ranks(self) -> int | None:
        """S, the recorded source ranks of a per-rank recording; ``None`` for per-token traces."""
        if self.rank_counts is None:
            return None
        return next(iter(self.rank_counts.values())).shape[1]

    def _layer(self, layer: object) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or int(layer) not in self.layers:
            raise ValueError(f"layer {layer!r} not in trace {self.name!r}; available layers: {list(self.layers)}")
        return int(layer)

    def num_tokens(self, layer: int) -> int:
        """Tokens recorded for ``layer`` (T; for per-rank recordings the total over iterations and ranks)."""
        layer = self._layer(layer)
        if self.topk_ids is not None:
            return int(self.topk_ids[layer].shape[0])
        return int(self.rank_counts[layer].sum()) // self.top_k

    def recorded_tokens_per_rank(self, layer: int) -> np.ndarray:
        """int64 ``[I, Gs]`` tokens each source rank sent in each recorded iteration (per-rank traces only)."""
        layer = self._layer(layer)
        if self.rank_counts is None:
            raise ValueError(f"trace {self.name!r} is per-token: it records no ranks")
        return self.rank_counts[layer].sum(axis=2) // self.top_k

    def expert_load(self, layer: int) -> np.ndarray:
        """int64 ``[E]``: token–expert pairs per expert over the whole recording of ``layer``."""
        layer = self._layer(layer)
        if self.topk_ids is not None:
            return np.bincount(self.topk_ids[layer].ravel(), minlength=self.num_experts).astype(np.int64)
        return self.rank_counts[layer].sum(axis=(0, 1))

    # -------------------------------------------------------------------------------------------- batches
    def _check_shape(self, layer: object, tokens_per_rank: object, num_ranks: object) -> tuple[int, int, int]:
        layer = self._layer(layer)
        B = check_int("tokens_per_rank", tokens_per_rank)
        D = check_int("num_ranks", num_ranks)
        Gs = self.num_source_ranks
        if Gs is not None and D != Gs:
            raise ValueError(
                f"trace {self.name!r} records per-rank counts of {Gs} source ranks; num_ranks={D} is not "
                f"supported (recorded ranks are not regrouped): use num_ranks={Gs}"
            )
        return layer, B, D

    def _per_iteration(self, layer: int, B: int) -> np.ndarray:
        """Batches per recorded iteration, int64 [I] (per-rank traces)."""
        n_rec = self.recorded_tokens_per_rank(layer)  # [I, Gs]
        if self.top_k > 1 and np.any(n_rec != B):
            raise ValueError(
                f"trace {self.name!r} has top_k={self.top_k}: per-rank counts can only be replayed whole "
                f"(tokens_per_rank must equal the recorded {sorted(set(n_rec.ravel().tolist()))})"
            )
        return n_rec.min(axis=1) // B

    def num_batches(self, layer: int, tokens_per_rank: int, num_ranks: int) -> int:
        """Number of whole batches of ``tokens_per_rank`` tokens on each of ``num_ranks`` ranks in ``layer``."""
        layer, B, D = self._check_shape(layer, tokens_per_rank, num_ranks)
        if self.topk_ids is not None:
            return self.topk_ids[layer].shape[0] // (B * D)
        return int(self._per_iteration(layer, B).sum())

    def _out_of_range(self, layer: int, B: int, D: int, batch: object, n: int) -> ValueError:
        total = self.num_tokens(layer)
        if n == 0:
            return ValueError(
                f"layer {layer} of trace {self.name!r} has 0 batches of {B} tokens/rank x {D} ranks "
                f"({total} tokens recorded); use fewer tokens per rank or ranks"
            )
        return ValueError(
            f"batch {batch!r} out of range: layer {layer} of trace {self.name!r} has {n} batches of "
            f"{B} tokens/rank x {D} ranks (valid 0..{n - 1})"
        )

    def _check_batch(self, layer: int, B: int, D: int, batch: object) -> int:
        n = self.num_batches(layer, B, D)
        if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or not 0 <= batch < n:
            raise self._out_of_range(layer, B, D, batch, n)
        return int(batch)

    def _rank_streams(self, layer: int, iteration: int) -> list[np.ndarray]:
        """Per source rank, its recorded expert ids of one iteration in a fixed shuffled order."""
        counts = self.rank_counts[layer][iteration]  # [Gs, E]
        experts = np.arange(self.num_experts)
        streams = []
        for s, row in enumerate(counts):
            rng = np.random.default_rng([_SUBBATCH_SEED, layer, iteration, s])
            streams.append(rng.permutation(np.repeat(experts, row)))
        return streams

    def _stream_counts(self, streams: list[np.ndarray], j: int, B: int) -> np.ndarray:
        E = self.num_experts
        out = np.zeros((len(streams), E), np.int64)
        for s, ids in enumerate(streams):
            out[s] = np.bincount(ids[j * B : (j + 1) * B], minlength=E)
        return out

    def batch_counts(self, layer: int, tokens_per_rank: int, num_ranks: int, batch: int = 0) -> np.ndarray:
        """int64 ``[D, E]`` token–expert-pair counts of batch ``batch`` (rows sum to B·K).

        Args:
            layer: MoE layer id (one of ``self.layers``).
            tokens_per_rank: B, tokens on each source rank.
            num_ranks: D source ranks (must equal the recorded Gs for per-rank recordings).
            batch: batch index in ``range(self.num_batches(layer, B, D))``.
        """
        layer, B, D = self._check_shape(layer, tokens_per_rank, num_ranks)
        batch = self._check_batch(layer, B, D, batch)
        E = self.num_experts
        if self.topk_ids is not None:
            ids = self.topk_ids[layer][batch * B * D : (batch + 1) * B * D].reshape(D, B * self.top_k)
            flat = (np.arange(D)[:, None] * E + ids).ravel()
            return np.bincount(flat, minlength=D * E).reshape(D, E).astype(np.int64)
        per_iter = self._per_iteration(layer, B)
        ends = np.cumsum(per_iter)
        it = int(np.searchsorted(ends, batch, side="right"))
        j = batch - int(ends[it] - per_iter[it])
        rec = self.rank_counts[layer][it]
        if np.all(rec.sum(axis=1) == B * self.top_k):  # whole recorded iteration: exact, no shuffle
            return rec.copy()
        return self._stream_counts(self._rank_streams(layer, it), j, B)

    def batches(self, layer: int, tokens_per_rank: int, num_ranks: int) -> Iterator[np.ndarray]:
        """Yield every ``batch_counts(layer, tokens_per_rank, num_ranks, b)``, ``[D, E]`` each, in order."""
        layer, B, D = self._check_shape(layer, tokens_per_rank, num_ranks)
        n = self.num_batches(layer, B, D)
        if self.topk_ids is not None:
            for b in range(n):
                yield self.batch_counts(layer, B, D, b)
            return
        for it, m in enumerate(self._per_iteration(layer, B)):
            rec = self.rank_counts[layer][it]
            if m == 1 and np.all(rec.sum(axis=1) == B * self.top_k):
                yield rec.copy()
                continue
            streams = self._rank_streams(layer, it)
            for j in range(int(m)):
                yield self._stream_counts(streams, j, B)

    def batch_topk_ids(self, layer: int, tokens_per_rank: int, num_ranks: int, batch: int = 0) -> np.ndarray:
        """int64 ``[D, B, K]`` expert ids of the tokens of ``batch`` on each rank (per-token traces only)."""
        layer, B, D = self._check_shape(layer, tokens_per_rank, num_ranks)
        if self.topk_ids is None:
            raise ValueError(f"trace {self.name!r} records per-rank counts only, not per-token expert ids")
        batch = self._check_batch(layer, B, D, batch)
        ids = self.topk_ids[layer][batch * B * D : (batch + 1) * B * D]
        return ids.reshape(D, B, self.top_k).copy()

    def __repr__(self) -> str:
        kind = "per-token topk_ids" if self.per_token else f"rank_counts of {self.num_source_ranks} ranks"
        return (
            f"RoutingTrace(name={self.name!r}, model={self.model!r}, E={self.num_experts}, K={self.top_k}, "
            f"layers={list(self.layers)}, {kind}, source={self.source!r})"
        )
