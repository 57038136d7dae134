"""The CascadeEP simulator's vocabulary: its layer modes, link models, launch modes and the labels they print as
(`reference_timeline` defines what each one does; every other module reads the names from here).

numpy-free, no imports."""

from __future__ import annotations

__all__ = ["COMMITS", "HELPER_STREAM_EFFICIENCY", "LABELS", "LAUNCHES", "LAYER_MODES", "LINKS", "MODE_POLICIES"]

#: The paper's four modes (§4.3's ablation): synchronous EP, per-source launching, + streamFFN, + OEWF.
LAYER_MODES = ("sync", "async", "async_sf", "cascade")
#: How a mode prints.
LABELS = {"sync": "Sync", "async": "Async", "async_sf": "Async+SF", "cascade": "CascadeEP"}
#: Link models: serialised ports with protected fetches, the same with FIFO fetches, the paper's uncontended links.
LINKS = ("contention", "fifo", "paper")
#: Launch modes: actual readiness, predicted groups per destination, the layer's one shared schedule.
LAUNCHES = ("reactive", "planned", "layer")
#: App. C's commit of a reassigned kernel, two readings (`reference_timeline.protected_start`): in the helper's first
#: idle interval from the weights' arrival, else abandoned (``"first"``, the default), or in the earliest idle
#: interval after it that holds the whole kernel (``"any"``: wherever the helper's own kernels are not delayed).
COMMITS = ("first", "any")
#: Throughput a kernel on a second stream retains (CascadeEP §4.3: streamFFN keeps 97.3% of synchronous EP's
#: matched-work FFN throughput): the helper's reassigned kernel lasts F(N_trans) / this under ``links="contention"``.
HELPER_STREAM_EFFICIENCY = 0.973
#: Launch policies a rank may pick in each mode: the mode's own rule last (guard=False keeps only that one; the fast
#: timeline runs that one: ``MODE_POLICIES[mode][-1]``).
MODE_POLICIES = {
    "sync": ("sync",),
    "async": ("sync", "async"),
    "async_sf": ("sync", "async", "stream"),
    "cascade": ("sync", "async", "stream"),
}
