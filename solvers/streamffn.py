"""Asynchronous EP launch schedules: sync, async and streamFFN (CascadeEP §3.2, App. C).

Two views of the same rule:

* `launch_groups` — per destination rank, with real arrival times: which source ranks' tokens each grouped
  FFN kernel covers, and when it runs on the rank's GPU. This is what a timeline simulator replays.
* `LaunchSchedule` — rank-uniform: one grouping of the D source ranks (in predicted arrival order) used by
  every destination, so the JAX layer compiles one program per structure: per-group shifted exchanges, then
  one grouped GEMM per group.

streamFFN rule (§3.2): sources become ready in arrival order; ready tokens accumulate until they reach the
launch threshold θ, then one grouped kernel is launched over them; once every source has arrived the rest is
flushed regardless of θ. Sources arriving at the same instant are ready together (they are added before the
threshold is checked). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checks import check_array, check_choice, check_real
from .throughput import ThroughputCurve, stream_threshold

__all__ = [
    "LAUNCH_MODES",
    "ExchangeShift",
    "LaunchGroup",
    "LaunchSchedule",
    "launch_groups",
    "partition_ends",
    "partition_sources",
    "run_partition",
]

#: Valid ``mode`` names of `launch_groups` and `LaunchSchedule.from_arrivals`.
LAUNCH_MODES = ("sync", "async", "stream")


def partition_ends(arrival: np.ndarray, tokens: np.ndarray, mode: str, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The launch rule on many destinations at once: sources ``[..., S]`` → ``(order [..., S], ends [..., S])``.

    Args:
      arrival: ``[..., S]`` float arrival times; tokens: ``[..., S]`` tokens per source; mode: one of
      `LAUNCH_MODES`; theta: the stream threshold in tokens (ignored by sync and async).

    ``order`` lists the sources by arrival (ties to the lower index); ``ends[..., j]`` is True where the group
    holding the j-th arrival launches (its last source). `partition_sources` reads one row as lists.
    """
    arrival, tokens = np.asarray(arrival, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
    order = np.argsort(arrival, axis=-1, kind="stable")
    S = arrival.shape[-1]
    # Step 1: sync launches once, when the last source has arrived; async launches every source on its own.
    if mode == "sync":
        ends = np.zeros(arrival.shape, dtype=bool)
        ends[..., S - 1 :] = True
        return order, ends
    if mode == "async":
        return order, np.ones(arrival.shape, dtype=bool)
    # Step 2: stream — walk the arrivals; sources of one instant join the pending group together.
    take = (lambda a: a[order]) if arrival.ndim == 1 else (lambda a: np.take_along_axis(a, order, axis=-1))
    a_sorted, t_sorted = take(arrival), take(tokens)
    last = np.ones((*arrival.shape[:-1], 1), dtype=bool)
    instant_end = np.concatenate([a_sorted[..., :-1] != a_sorted[..., 1:], last], axis=-1)
    # One row: python floats (the rule's loop at scalar speed); many: one array per position across the rows.
    columns = (lambda a: a.tolist()) if arrival.ndim == 1 else (lambda a: list(np.moveaxis(a, -1, 0)))
    tok_at, instant_at = columns(t_sorted), columns(instant_end)
    pending, ends = 0.0, []
    for j in range(S):
        pending = pending + tok_at[j]
        # Step 3: launch at θ, or flush when the last source has arrived.
        end = instant_at[j] & ((pending >= theta) | (j == S - 1))
        ends.append(end)
        pending = pending * (end ^ True)  # a launch empties the pending group
    if not ends:
        return order, np.zeros(arrival.shape, dtype=bool)
    return order, np.asarray(ends, dtype=bool).transpose(*range(1, arrival.ndim), 0)


def partition_sources(arrival: np.ndarray, tokens: np.ndarray, mode: str, theta: float) -> list[list[int]]:
    """All sources split into launch groups (in launch order), zero-token sources included (no validation).

    Args:
      arrival: ``[Gs]`` float arrival times; tokens: ``[Gs]`` tokens per source; mode: one of `LAUNCH_MODES`;
      theta: the stream threshold in tokens (ignored by sync and async).

    Every source lands in exactly one group: the one pending when it arrives (`partition_ends` on one row).
    `launch_groups` is the checked entry point; simulators call this in their inner loops.
    """
    order, ends = partition_ends(arrival, tokens, mode, theta)
    if mode == "sync":
        return [order.tolist()]
    groups, pending = [], []
    for s, last in zip(order.tolist(), ends.tolist(), strict=True):  # cut the arrival order after each launch
        pending.append(s)
        if last:
            groups.append(pending)
            pending = []
    return groups


def _stream_theta(fn: str, curve, threshold, rho) -> float:
    if threshold is not None:
        return check_real("threshold", threshold, where=fn, minimum=0.0, allow_inf=True)
    if not isinstance(curve, ThroughputCurve):
        raise ValueError(f"{fn}: mode='stream' needs a ThroughputCurve (or an explicit threshold=θ tokens)")
    return float(stream_threshold(curve, rho))


@dataclass(frozen=True, kw_only=True)
class LaunchGroup:
    """One grouped FFN kernel on a destination rank.

    Attributes:
      sources: source ranks whose tokens it covers, in arrival order. A zero-token source is listed in the
        group pending when it arrived (the launch waited for it); it is in no group if no kernel followed.
      tokens: expert tokens the kernel computes (Σ over ``sources``).
      ready_us: when its last source arrived (µs).
      start_us / end_us: when the kernel runs on the rank's GPU (µs).
    """

    sources: tuple[int, ...]
    tokens: float
    ready_us: float
    start_us: float
    end_us: float

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


def launch_groups(
    arrival_us,
    tokens,
    curve: ThroughputCurve,
    *,
    mode: str,
    threshold: float | None = None,
    start_us: float = 0.0,
    efficiency: float = 1.0,
    rho: float = 0.9,
) -> tuple[LaunchGroup, ...]:
    """Grouped FFN kernels of one destination rank under sync / async / stream execution (§3.2).

    Args:
      arrival_us: ``[Gs]`` time each source's routed tokens are ready at this rank (µs, ≥ 0).
      tokens: ``[Gs]`` expert tokens each source sends here (≥ 0; zero-token sources still count as
        arrived but create no kernel).
      curve: the rank's `ThroughputCurve`; a kernel of N tokens lasts ``curve.ffn_time(N)``.
      mode: ``"sync"`` — one kernel over all sources once the last has arrived (synchronous EP);
        ``"async"`` — one kernel per source at its arrival, no threshold (the paper's Async ablation);
        ``"stream"`` — streamFFN: accumulate arrivals until the pending tokens reach θ, launch, and flush the
        rest when every source has arrived.
      threshold: θ in tokens (stream mode only; default ``stream_threshold(curve, rho)``).
      start_us: the rank's GPU is free from this time (µs), e.g. when its own attention and dispatch end.
      efficiency: factor in (0, 1] dividing the throughput of stream-mode kernels (their duration is
        ``F(N) / efficiency``). The model runs kernels one after another on the GPU; streamFFN's multi-stream
        overlap of partially filled final waves is not modelled, and the paper measures streamFFN at 97.3% of
        synchronous throughput, so ``efficiency=0.973`` reproduces that loss. Default 1.0. Ignored by the
        other modes.
      rho: target fraction of peak for the default θ (stream mode only).

    Returns:
      The kernels in execution order. Kernel k starts at max(its ready time, kernel k−1's end, start_us) and
      ends ``F(tokens)`` (stream: ``/ efficiency``) later. Empty when no source sends tokens.
    """
    fn = "launch_groups"
    # Step 1: validate.
    mode = check_choice("mode", mode, LAUNCH_MODES, where=fn)
    arrival = check_array(
        "arrival_us", arrival_us, where=fn, ndims=(1,), nonnegative=True, hint="one arrival time per source"
    )
    tok = check_array(
        "tokens", tokens, where=fn, shape=arrival.shape, nonnegative=True, hint="one token count per source"
    )
    if not isinstance(curve, ThroughputCurve):
        raise ValueError(f"{fn}: curve must be a ThroughputCurve, got {type(curve).__name__}")
    t0 = check_real("start_us", start_us, where=fn, minimum=0.0)
    eff = check_real("efficiency", efficiency, where=fn, minimum=0.0, strict=True, maximum=1.0)
    theta = _stream_theta(fn, curve, threshold, rho) if mode == "stream" else 0.0
    slow = 1.0 / eff if mode == "stream" else 1.0

    # Step 2: partition the sources into launches, then run them back to back.
    groups = partition_sources(arrival, tok, mode, theta)
    return run_partition(groups, arrival, tok, curve.ffn_time, start_us=t0, slow=slow)


def run_partition(groups, arrival, tokens, ffn_time, *, start_us: float = 0.0, slow: float = 1.0):
    """Run launch groups back to back on one rank's GPU (no validation; `launch_groups` checks its inputs).

    Args:
      groups: source lists in launch order (`partition_sources`).
      arrival: ``[Gs]`` arrival times (µs); tokens: ``[Gs]`` tokens per source.
      ffn_time: N → µs (e.g. `ThroughputCurve.ffn_time`).
      start_us: the GPU is free from this time; slow: duration multiplier.

    Returns:
      ``tuple[LaunchGroup, ...]``: kernel k starts at max(its ready time, kernel k−1's end, start_us); groups
      without tokens launch nothing.
    """
    out: list[LaunchGroup] = []
    gpu_free = float(start_us)
    tok, arr = np.asarray(tokens, dtype=np.float64).tolist(), np.asarray(arrival, dtype=np.float64).tolist()
    for group in groups:
        n = sum(tok[s] for s in group)
        if n <= 0:
            continue
        ready = max(arr[s] for s in group)
        start = max(ready, gpu_free)
        end = start + float(ffn_time(n)) * slow
        out.append(LaunchGroup(sources=tuple(group), tokens=n, ready_us=ready, start_us=start, end_us=end))
        gpu_free = end
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class ExchangeShift:
    """One partial permutation of the exchange (a shift): every listed source sends to ``(source + shift) mod D``.

    Attributes:
      group: index of the launch group whose sources this shift carries.
      shift: k in 0 … D−1 (k = 0 is the local block, source = destination).
      pairs: ``((source, destination), …)``, sources and destinations each distinct.
    """

    group: int
    shift: int
    pairs: tuple[tuple[int, int], ...]


@dataclass(frozen=True, kw_only=True)
class LaunchSchedule:
    """Rank-uniform launch plan: the D source ranks grouped in predicted arrival order (streamFFN).

    Every destination runs the same plan: receive group 0's sources, run one grouped GEMM over them, then
    group 1's, …. The structure is static, so the JAX layer compiles it once per `key`.

    Attributes:
      num_ranks: D, EP ranks (each is one source and one destination).
      order: predicted arrival order of the D source ranks (a permutation of 0 … D−1).
      groups: consecutive runs of ``order``; their concatenation is ``order`` (each rank exactly once).
    """

    num_ranks: int
    order: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        fn = "LaunchSchedule"
        D = self.num_ranks
        if not isinstance(D, int | np.integer) or D < 1:
            raise ValueError(f"{fn}: num_ranks must be an integer ≥ 1, got {D!r}")
        order = tuple(int(r) for r in self.order)
        groups = tuple(tuple(int(r) for r in g) for g in self.groups)
        if sorted(order) != list(range(D)):
            raise ValueError(f"{fn}: order must be a permutation of 0..{D - 1}, got {order}")
        if any(len(g) == 0 for g in groups):
            raise ValueError(f"{fn}: groups must be non-empty, got {groups}")
        if tuple(r for g in groups for r in g) != order:
            raise ValueError(
                f"{fn}: groups {groups} must be consecutive runs of order {order} covering every rank exactly once"
            )
        object.__setattr__(self, "num_ranks", int(D))
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "groups", groups)

    @classmethod
    def sync(cls, num_ranks: int) -> LaunchSchedule:
        """Synchronous EP: one group of all D ranks (order 0 … D−1)."""
        if not isinstance(num_ranks, int | np.integer) or num_ranks < 1:
            raise ValueError(f"LaunchSchedule.sync: num_ranks must be an integer ≥ 1, got {num_ranks!r}")
        order = tuple(range(int(num_ranks)))
        return cls(num_ranks=int(num_ranks), order=order, groups=(order,))

    @classmethod
    def stragglers(cls, num_ranks: int, late) -> LaunchSchedule:
        """Two launch groups: every rank not in ``late``, then the ``late`` ranks (each ascending; ``late`` empty =
        `sync`). The compile-friendly form: the structure is only the straggler set, so a D-rank layer has at
        most 2^D − 1 programs (255 for D = 8), and in practice the few sets a deployment's imbalance produces."""
        fn = "LaunchSchedule.stragglers"
        if not isinstance(num_ranks, int | np.integer) or num_ranks < 1:
            raise ValueError(f"{fn}: num_ranks must be an integer ≥ 1, got {num_ranks!r}")
        late = sorted({int(r) for r in late})
        if any(not 0 <= r < num_ranks for r in late):
            raise ValueError(f"{fn}: late ranks {late} must lie in 0..{num_ranks - 1}")
        early = [r for r in range(int(num_ranks)) if r not in late]
        if not late or not early:
            return cls.sync(int(num_ranks))
        return cls(num_ranks=int(num_ranks), order=(*early, *late), groups=(tuple(early), tuple(late)))

    @classmethod
    def from_arrivals(
        cls,
        arrival_us,
        tokens,
        curve: ThroughputCurve | None = None,
        *,
        mode: str = "stream",
        rho: float = 0.9,
        threshold: float | None = None,
    ) -> LaunchSchedule:
        """Group the source ranks by predicted arrival and the streamFFN threshold.

        Args:
          arrival_us: ``[D]`` predicted time each source rank finishes dispatch (µs, ≥ 0; e.g. A_d + D_d).
          tokens: ``[D, D]`` tokens source s sends to destination d (≥ 0).
          curve: `ThroughputCurve` giving θ = ``stream_threshold(curve, rho)`` (stream mode).
          mode: ``"stream"`` (default), ``"sync"`` (one group) or ``"async"`` (one group per source).
          rho: target fraction of peak throughput for θ, in (0, 1].
          threshold: θ in tokens; overrides ``curve`` and ``rho``.

        The rank-uniform plan applies the threshold to the mean tokens per destination: source s adds
        Σ_d tokens[s, d] / D to the pending count. Order ties go to the lower rank; simultaneous arrivals
        join the pending group together; the last group is flushed when every source has arrived (a
        zero-token source still belongs to the group pending when it arrives).
        """
        fn = "LaunchSchedule.from_arrivals"
        # Step 1: validate.
        mode = check_choice("mode", mode, LAUNCH_MODES, where=fn)
        arrival = check_array(
            "arrival_us", arrival_us, where=fn, ndims=(1,), nonnegative=True, hint="one time per source rank"
        )
        D = arrival.shape[0]
        if D == 0:
            raise ValueError(f"{fn}: arrival_us is empty; give one arrival time per source rank")
        tok = check_array(
            "tokens", tokens, where=fn, shape=(D, D), nonnegative=True, hint="[source, destination] token counts"
        )
        theta = _stream_theta(fn, curve, threshold, rho) if mode == "stream" else 0.0
        # Step 2: mean tokens per destination of each source, then the shared partition rule.
        groups = partition_sources(arrival, tok.sum(axis=1) / D, mode, theta)
        order = tuple(r for g in groups for r in g)
        return cls(num_ranks=D, order=order, groups=tuple(tuple(g) for g in groups))

    @property
    def group_of(self) -> tuple[int, ...]:
        """``[D]`` index of the group each source rank belongs to."""
        out = [0] * self.num_ranks
        for gi, g in enumerate(self.groups):
            for r in g:
                out[r] = gi
        return tuple(out)

    @property
    def shifts(self) -> tuple[ExchangeShift, ...]:
        """The exchange as partial permutations, group by group, shift k = 0 … D−1 within a group.

        Shift (g, k) carries source s → destination (s + k) mod D for every s in group g, so the shifts
        cover every (source, destination) pair exactly once, and each is a partial permutation (a
        ``ppermute``). k = 0 is the local block.
        """
        D = self.num_ranks
        return tuple(
            ExchangeShift(group=gi, shift=k, pairs=tuple((s, (s + k) % D) for s in g))
            for gi, g in enumerate(self.groups)
            for k in range(D)
        )

    @property
    def key(self) -> tuple:
        """Hashable structure for a compile cache: ``("LaunchSchedule", D, groups)``."""
        return ("LaunchSchedule", self.num_ranks, self.groups)
