"""`ServeConfig`: one serving run's options, checked when built (`tempo-jax serve`, `tempo_jax.runtime.serving`).

The one serving loop (`tempo_jax.runtime.serving.loop.serve_loop`) reads it for either served model: the bare layer
(`serving.layer_model`, ``model="layer"``) or the tiny LM (`serving.lm_model`, ``model="lm"``).
An option that does nothing for the chosen model or routing is refused, naming the option that would use it.
"""

from __future__ import annotations

import dataclasses
import functools

from pallas_kernels import DISPATCH_MODES
from solvers import PRESETS
from solvers.checks import check_choice, check_int, check_real, plain_scalars

from ..layer.mesh import parse_mesh
from ..workloads import TRACES
from .controller_config import ControllerConfig

__all__ = ["DEFAULT_COST", "DEFAULT_TRACE", "MAX_SERVE_ELEMENTS", "MODELS", "ROUTINGS", "SYNTHETIC_ONLY", "ServeConfig"]

ROUTINGS = ("synthetic", "recorded")
MODELS = ("lm", "layer")
DEFAULT_COST = "dsv3_fp8_offline"
MAX_SERVE_ELEMENTS = 2**28  # largest weight / activation array a serving run may allocate
DEFAULT_TRACE = "flame_moe_290m"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """One serving run (command: ``tempo-jax serve``; hardware: any jax backend, 8 fake CPU devices by default).

    Attributes:
      model: "lm" (the tiny MoE language model, every MoE layer with live tables: `tempo_jax.runtime.serving.lm_model`;
        reads ``layers``, ``seq_len``, ``decode_steps``, ``train_steps``) or "layer" (the bare MoE layer on a
        routing stream: ``routing``, ``trace``, ``skew``, ``drift``, ``kappa``, ``check_every``). Setting an option
        of the other model is refused, never ignored.
      steps: serving steps after the warm-up.
      tokens_per_rank: tokens each of the D ranks serves per step.
      routing: ``"synthetic"`` (drifting Zipf) or ``"recorded"`` (``trace``, layer by layer, cycled).
      trace: ``routing="recorded"``: the recorded routing trace (a `tempo_jax.workloads.TRACES` name; the bundled
        copy when offline; default ``flame_moe_290m``). Refused with synthetic routing, which would ignore it.
      experts: synthetic stream: E.
      top_k: synthetic stream: K.
      skew: synthetic stream: Zipf s.
      drift: synthetic stream: AR(1) step σ of the log popularity per step.
      kappa: synthetic stream: Dirichlet concentration of each step's batch (inf: no batch noise).
      hidden: the layer's H (the LM's width).
      ffn: the layer's F.
      layers: "lm": MoE layers of the LM.
      seq_len: "lm": tokens per sequence of a prefill step.
      decode_steps: "lm": decode steps after each prefill step.
      train_steps: "lm": training steps before serving (0: a freshly initialised model, whose routing is noise
        around its mean load: nothing for stale tables to exploit; a trained model's routing persists).
      replication: physical slots / experts (EPLB from the stream's long-run load).
      dispatch_mode: the layer's dispatch mode (``"quota"``: deterministic, realises the tables' plan).
      policy: the policy the solver worker solves.
      cost: the cost preset the policy optimises (default ``dsv3_fp8_offline``; not with ``cost_json``).
      cost_json: a CostModel JSON file instead of ``cost`` (e.g. the one `tempo-jax calibrate --measure --out`
        fitted on this backend); giving both is refused.
      solver_mode: where the controller solves (``"process"``: the solver worker process).
      period_s: refresher snapshot period, seconds.
      every_steps: refresh every this many steps instead of by time.
      budget_s: results arriving later than this after submission are not published.
      staleness_s: tables older than this are replaced by the fallback's.
      fallback: the fallback tables (``"uniform"`` or ``"static"``).
      kill_worker_at: SIGKILL the worker after this step (None: never).
      rebalance_every: the slow timescale: every this many windows the runtime proposes an EPLB placement from the
        load it accumulated. It is priced: the policy's modelled makespan of the last batch on the placement served
        and on the proposal, the gain over the steps the proposal is expected to serve (as many as since the last
        proposal), and the move's modelled time (the busiest rank's rows at ``move_gbps``). The experts move only
        when the gain exceeds ``move_margin`` × the move (`tempo_jax.MoE.set_placement`; the bare layer: the
        functional `tempo_jax.layer.replicas.migrate`), and the controller re-solves its last window over the new
        placement at once; otherwise the proposal is dismissed. Each proposal is reported (applied or not, bytes,
        time, makespans, gain and move). None: the placement stays.
      move_gbps: the link bandwidth a re-placement's rows cross, GB/s per rank (default 50: one 400 Gb/s NIC, the
        inter-node case; NVLink is ~10× more).
      move_margin: a re-placement must gain this many times its modelled move time (≥ 1).
      block: steps per on/off block of the step-time comparison (0: the worker stays on throughout).
      check_every: compare the layer's output with the dense reference every this many steps (off the clock;
        0: never). The report holds the largest difference (the central invariant).
      seed: routing and parameter seed.
      mesh: the serving mesh as ``data × ep × tensor`` sizes, e.g. ``"data=2,ep=4"`` (`tempo_jax.layer.make_mesh`:
        Ng = data EP groups of D = ep ranks, each group serving ``tokens_per_rank`` tokens per rank of its own, every
        group dispatching over the same tables; a tensor axis splits each expert's F). None: one ``ep`` axis over
        every device.
    """

    model: str = "lm"
    steps: int = 80
    tokens_per_rank: int = 128
    routing: str = "synthetic"
    trace: str | None = None
    experts: int = 16
    top_k: int = 4
    skew: float = 1.0
    drift: float = 0.1
    kappa: float = 500.0
    hidden: int = 128
    ffn: int = 128
    layers: int = 2
    seq_len: int = 16
    decode_steps: int = 3
    train_steps: int = 40
    replication: float = 1.5
    dispatch_mode: str = "quota"
    policy: str = "tempo"
    cost: str | None = None
    cost_json: str | None = None
    solver_mode: str = "process"
    period_s: float = 0.2
    every_steps: int | None = None
    budget_s: float = 0.2
    staleness_s: float | None = 5.0
    fallback: str = "uniform"
    kill_worker_at: int | None = None
    rebalance_every: int | None = 10
    move_gbps: float = 50.0
    move_margin: float = 2.0
    block: int = 10
    check_every: int = 10
    seed: int = 0
    mesh: str | None = None

    def __post_init__(self):
        plain_scalars(self)
        w = "ServeConfig"
        check_choice("model", self.model, MODELS, where=w)
        for name in ("steps", "tokens_per_rank", "experts", "top_k", "hidden", "ffn", "layers", "seq_len"):
            check_int(name, getattr(self, name), where=w)
        check_int("decode_steps", self.decode_steps, minimum=0, where=w)
        check_int("train_steps", self.train_steps, minimum=0, where=w)
        check_int("block", self.block, minimum=0, where=w)
        check_int("check_every", self.check_every, minimum=0, where=w)
        check_int("seed", self.seed, minimum=0, where=w)
        if self.mesh is not None:
            try:
                sizes = parse_mesh(self.mesh)
            except ValueError as err:
                raise ValueError(f"{w}.{err}") from None
            if sizes["node"] > 1:
                raise ValueError(
                    f"{w}.mesh={self.mesh!r}: the served model keeps its experts on the ep axis; a node axis (the "
                    "layer's MoEConfig(node_axis=)) is not served yet: give data=, ep= and tensor= only"
                )
        weights = self.layers * self.experts * 3 * self.hidden * self.ffn
        rows = self.tokens_per_rank * self.top_k * max(self.hidden, self.ffn)
        if weights > MAX_SERVE_ELEMENTS or rows > MAX_SERVE_ELEMENTS:  # checked before any allocation
            raise ValueError(
                f"{w}: the served model needs {weights:,} expert weights (layers·experts·3·hidden·ffn) and "
                f"{rows:,} activations per rank (tokens_per_rank·top_k·max(hidden, ffn)); each must stay within "
                f"{MAX_SERVE_ELEMENTS:,} (2^28, 1 GiB of float32): lower the sizes"
            )
        check_choice("routing", self.routing, ROUTINGS, where=w)
        other = "layer" if self.model == "lm" else "lm"
        ignored = [f"{n}={getattr(self, n)!r}" for n in _ONLY[other] if getattr(self, n) != _DEFAULTS[n]]
        if ignored:  # nothing set is silently unused
            verb, them = ("applies", "it") if len(ignored) == 1 else ("apply", "them")
            raise ValueError(
                f"{w}: {', '.join(ignored)} only {verb} to model={other!r}; model={self.model!r} would "
                f"ignore {them}: drop {them} or set model={other!r}"
            )
        check_choice("dispatch_mode", self.dispatch_mode, DISPATCH_MODES, where=w)
        if self.cost is not None and self.cost_json is not None:
            raise ValueError(
                f"{w}: give cost (a preset) or cost_json (a file), not both: cost_json would override "
                f"cost={self.cost!r}"
            )
        if self.cost_json is None:
            object.__setattr__(self, "cost", check_choice("cost", self.cost or DEFAULT_COST, tuple(PRESETS), where=w))
        if self.trace is not None and (self.model != "layer" or self.routing != "recorded"):
            raise ValueError(
                f"{w}: trace={self.trace!r} is only read by model='layer' with routing='recorded' (got "
                f"model={self.model!r}, routing={self.routing!r}); drop it or set both"
            )
        if self.routing == "recorded":
            object.__setattr__(self, "trace", check_choice("trace", self.trace or DEFAULT_TRACE, TRACES, where=w))
        check_real("replication", self.replication, minimum=1.0, where=w)
        check_real("skew", self.skew, minimum=0.0, where=w)
        check_real("drift", self.drift, minimum=0.0, where=w)
        check_real("kappa", self.kappa, minimum=0.0, strict=True, allow_inf=True, where=w)
        check_real("period_s", self.period_s, minimum=0.0, strict=True, where=w)
        _ = self.controller  # the dispatch controller's settings, checked here once (`ControllerConfig`)
        if self.every_steps is not None:
            check_int("every_steps", self.every_steps, where=w)
        check_real("move_gbps", self.move_gbps, minimum=0.0, strict=True, where=w)
        check_real("move_margin", self.move_margin, minimum=1.0, where=w)
        if self.kill_worker_at is not None:
            check_int("kill_worker_at", self.kill_worker_at, minimum=0, where=w)
            if self.solver_mode != "process":
                raise ValueError(f"{w}: kill_worker_at needs solver_mode='process' (got {self.solver_mode!r})")
            if self.kill_worker_at >= self.steps:
                raise ValueError(
                    f"{w}: kill_worker_at={self.kill_worker_at} is past the last step ({self.steps - 1}): "
                    "the worker would never be killed; give a step below steps"
                )
        # Step 2: options that another one makes inert are refused, never silently unused.
        if self.routing == "recorded":
            unused = [f"{n}={getattr(self, n)!r}" for n in SYNTHETIC_ONLY if getattr(self, n) != _DEFAULTS[n]]
            if unused:
                raise ValueError(
                    f"{w}: {', '.join(unused)} shape the synthetic stream; routing='recorded' replays "
                    f"the trace's own experts, top-k and popularity: drop them or use "
                    "routing='synthetic'"
                )
        if self.every_steps is not None and self.period_s != _DEFAULTS["period_s"]:
            raise ValueError(
                f"{w}: period_s={self.period_s} and every_steps={self.every_steps}: the refresher runs by steps when "
                "every_steps is set, so period_s would never act; give one of them"
            )
        pricing = [
            f"{n}={getattr(self, n)!r}" for n in ("move_gbps", "move_margin") if getattr(self, n) != _DEFAULTS[n]
        ]
        if pricing and self.rebalance_every is None:
            raise ValueError(
                f"{w}: {', '.join(pricing)} price re-placements, and rebalance_every=None proposes none: "
                "drop them or set rebalance_every"
            )
        if self.fallback != _DEFAULTS["fallback"] and self.staleness_s is None:
            raise ValueError(
                f"{w}: fallback={self.fallback!r} with staleness_s=None: the fallback is published only "
                "when tables grow older than staleness_s; set staleness_s or drop fallback"
            )

    #: The options only one of the two served models reads (the rest apply to both).

    @functools.cached_property
    def controller(self) -> ControllerConfig:
        """The dispatch controller's settings of this run (`ControllerConfig`: policy, solver mode, budget,
        staleness, fallback, re-placement period), built and checked once, with the config."""
        return ControllerConfig(
            policy=self.policy,
            solver_mode=self.solver_mode,
            budget_s=self.budget_s,
            staleness_s=self.staleness_s,
            fallback=self.fallback,
            rebalance_every=self.rebalance_every,
        )

    def acting(self) -> dict:
        """The options that act, as a dict (what serve.json records): not the other model's options, not the synthetic
        stream's with recorded routing, not ``period_s`` when the refresher runs by steps, not ``fallback`` without
        ``staleness_s``, and one of ``cost`` / ``cost_json``."""
        other = "layer" if self.model == "lm" else "lm"
        drop = set(_ONLY[other]) | ({"cost", "cost_json"} - {"cost_json" if self.cost_json else "cost"})
        drop |= set(SYNTHETIC_ONLY) if self.routing == "recorded" else set()
        drop |= {"period_s"} if self.every_steps is not None else set()
        drop |= {"fallback"} if self.staleness_s is None else set()
        drop |= {"move_gbps", "move_margin"} if self.rebalance_every is None else set()
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in drop}


_ONLY = {
    "layer": ("routing", "skew", "drift", "kappa", "check_every"),  # trace: its own check names both needs
    "lm": ("layers", "seq_len", "decode_steps", "train_steps"),
}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServeConfig)}
#: The options that shape the synthetic routing stream only.
SYNTHETIC_ONLY = ("experts", "top_k", "skew", "drift", "kappa")
