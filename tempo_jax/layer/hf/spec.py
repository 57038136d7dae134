"""What a Hugging Face MoE family is to the importer: where its block's tensors sit (`TensorNames`), how its
config.json becomes the layer's configuration (`Family`), the config read the way transformers reads it (`Cfg`), and
the warning for training-time noise the layer does not apply (`TrainingNoiseWarning`). The families themselves are
`tempo_jax.layer.hf.catalog`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

__all__ = ["MAX_LAYERS", "Cfg", "Family", "TensorNames", "TrainingNoiseWarning"]

#: Largest ``num_hidden_layers`` a config may declare (a typo of 1e9 would otherwise build a billion-entry list).
MAX_LAYERS = 100_000


@dataclasses.dataclass(frozen=True)
class TensorNames:
    """Where one family's MoE-block tensors sit, relative to the block (see `tempo_jax.layer.hf.tensors`).

    Attributes:
      router: the router weight ``[E, H]`` (on-disk name first, then the in-memory one).
      router_bias: the learned router bias ``[E]`` (gpt-oss).
      score_bias: the selection-only score bias (``[E]`` or ``[1, E]``).
      experts: the per-expert names of gate / up / down under ``experts.{e}.`` (torch Linear ``[out, in]``); plain
        experts (no gate) read up / down only.
      expert_key: the per-expert tensor name from the expert ``e`` and that name ``p`` (Switch Transformers:
        ``experts.expert_{e}.{p}.weight``); plain experts saved fused are ``experts.{up}`` ``[E, F, H]`` /
        ``experts.{down}`` ``[E, H, F]`` (Nemotron-H's in-memory layout).
      fused: the fused layout's kind: "gate_up" (``experts.gate_up_proj [E, 2F, H]`` gate rows first, or
        ``[E, H, 2F]`` gate columns first when ``transposed``), "interleaved" (gpt-oss: gate / up alternate),
        "input_linear" (Granite), "dbrx" (``experts.mlp.w1 / v1 / w2 [E·F, H]``, w2 the down weight transposed).
      transposed: the fused experts are stored ``[E, H, 2F]`` / ``[E, F, H]`` (decided by shape when both occur).
      hub_fused: transformers saves the "gate_up" experts fused (no per-expert conversion for the family), so the
        export writes them so. fused_names: the hub names of the fused gate_up / down tensors (Aria:
        ``experts.fc1.weight`` / ``experts.fc2.weight``); the in-memory names are read too.
        fused_interleaved: under the hub names, gate and up rows alternate along 2F (Inkling 2's ``w13_weight``:
        row 2i the gate's i-th, 2i + 1 the up's; transformers de-interleaves on load).
      shared: the shared experts' prefixes (``shared_experts.``, …), gate / up / down names, and the per-token
        shared gate ``[1, H]``; ``shared_fused``: gate and up in one ``input_linear [2Fs, H]`` (Granite).
      router_scale: the router input's learned scale ``[H]`` (Gemma 4's ``router.scale``).
      router_gain: the learned scalar ``[1]`` multiplying every router weight (Inkling's ``gate.global_scale``); with
        ``RouterConfig.shared_rows`` S the router tensor holds E + S rows, the routed experts' first.
      expert_scale: the learned per-expert weight scale ``[E]`` (Gemma 4's ``router.per_expert_scale``).
      shared_stacked: the shared experts as three stacked tensors under these names (no ``.weight``): gate / up
        ``[S, Fs, H]``, down ``[S, H, Fs]`` (Inkling); ``shared_interleaved``: the hub's ``(gate_up, down)`` names of
        the same with gate and up rows alternating in one ``[S, 2Fs, H]`` (Inkling's multimodal files).
      shared_gate_up: the shared experts' gate and up as one ``gate_up_proj`` Linear ``[2Fs, H]`` (gate rows first)
        in the layout transformers saves (MiniMax-M3's text model); read wherever present, written when set.
      stacked_names: the experts as three stacked tensors ``gate [E, F, H]``, ``up [E, F, H]``, ``down [E, H, F]``
        under these names (Step-3.7's hub files: ``moe.gate_proj.weight``, …), tried before the fused layout; None:
        no such layout.
      expert_sets: the sub-blocks of expert sets a token type chooses between, in set order (ERNIE-4.5-VL's
        ``text_moe.`` / ``vision_moe.``: a router, a selection bias ``[1, E_s]`` and fused experts each, their widths
        may differ: narrower sets are zero-padded to the layer's F, which changes no output or gradient); their hub
        files hold the routers as ``names.router`` transposed ``[H, E_s]`` one per set, the biases stacked ``[sets,
        E_s]`` under ``names.score_bias[0]`` and the experts per expert, set after set. None: one set.
      latent: the latent experts' tensors (``LatentConfig``): the in-projection ``[L, H]``, the norm weight ``[L]``
        (or None), the out-projection ``[H, L]`` and the experts' shared output scale ``[L]`` (or None) — MuSE-Spark's
        ``pre_expert_proj`` / ``pre_expert_norm`` / ``post_expert_proj`` / ``experts.post_expert_norm``, Nemotron-H's
        ``fc1_latent_proj`` / ``fc2_latent_proj``.
      router_mlp: a router MLP's tensors (``RouterConfig.mlp_width`` Rh; Zaya): the input projection ``[Rh, H]`` and its
        bias, the carried state's scale ``[Rh]`` (read with ``carried_state``), the MLP's RMSNorm weight ``[Rh]``, its
        two Linear ``[Rh, Rh]`` layers and their biases; ``router`` is then its output projection ``[E, Rh]``.
      zero_expert_rows: the experts' gate / up tensors also hold rows for the zero-computation experts, which
        transformers loads and never reads (LongCat-Flash; the export writes zeros there); False: E rows (Zaya).
      output_bias / output_norm: the block output's learned bias / RMSNorm weight ``[H]`` (JetMoE's ``bias``,
        A.X-K1's ``post_mlp_layernorm.weight``; `tempo_jax.layer.experts.OutputConfig`).
    """

    router: tuple[str, ...] = ("gate.weight",)
    router_bias: str | None = None
    router_scale: str | None = None
    expert_scale: str | None = None
    score_bias: tuple[str, ...] = ("gate.e_score_correction_bias",)
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    expert_key: str = "experts.{e}.{p}.weight"
    fused: str = "gate_up"
    transposed: bool | None = False
    hub_fused: bool = False
    fused_names: tuple[str, str] = ("experts.gate_up_proj", "experts.down_proj")
    fused_interleaved: bool = False
    shared: tuple[str, ...] = ("shared_experts.",)
    shared_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    shared_fused: bool = False
    shared_gate: str = "shared_expert_gate.weight"
    shared_gate_up: bool = False
    shared_stacked: tuple[str, str, str] | None = None
    shared_interleaved: tuple[str, str] | None = None
    router_gain: str | None = None
    stacked_names: tuple[str, str, str] | None = None
    expert_sets: tuple[str, ...] | None = None
    latent: tuple[str | None, ...] | None = None
    router_mlp: tuple[str, ...] | None = None
    zero_expert_rows: bool = False
    output_bias: str = "bias"
    output_norm: str = "post_mlp_layernorm.weight"


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: ``fields(c)`` → the `MoEConfig` fields (``c`` a `Cfg`), ``layers(c)`` → its MoE decoder
    layers, ``prefixes`` the block's on-disk prefixes (``{}`` the layer index; the first that holds tensors wins),
    ``siblings`` further prefixes of the same MoE unit (Granite's shared MLP), ``names`` its tensors,
    ``refuse(c)`` → why a config cannot be expressed (None: it can), ``noise(c)`` → its training-time noise
    settings that are on (``{key: value}``: the layer computes the eval-mode block, and says so), ``parts`` the
    sub-prefixes under the prefix that belong to the block when it sits directly in the decoder layer beside
    attention and norms (Gemma 4: ``router.``, ``experts.``; empty: everything under the prefix), ``nested`` where
    its MoE keys sit in config.json (a dotted path, or several tried in order; "" the top level), ``twin`` the family
    whose transformers fixture tests the same block under another config layout (`tests/test_hf_coverage.py`),
    ``locate(c, layer)`` → the block's prefixes for a layer where one template cannot say (Switch Transformers:
    encoder and decoder MoE layers numbered one after the other; None: ``prefixes`` formatted with the layer)."""

    fields: Callable
    layers: Callable
    prefixes: tuple[str, ...] = ("model.layers.{}.mlp.",)
    siblings: tuple[tuple[str, str], ...] = ()
    names: TensorNames = TensorNames()
    refuse: Callable = lambda c: None  # noqa: E731
    nested: str | tuple[str, ...] | None = None
    twin: str | None = None
    noise: Callable = lambda c: {}  # noqa: E731
    parts: tuple[str, ...] = ()
    locate: Callable | None = None

    def prefixes_at(self, c, layer: int) -> tuple[str, ...]:
        """The block's prefixes at decoder ``layer`` of config ``c`` (a `Cfg`), the first that holds tensors wins."""
        if self.locate is not None:
            return tuple(self.locate(c, layer))
        return tuple(p.format(layer) for p in self.prefixes)

    def owns(self, key: str) -> bool:
        """Whether ``key`` (relative to the block's prefix) is one of the block's tensors."""
        return not self.parts or key.startswith(self.parts)


class TrainingNoiseWarning(UserWarning):
    """A checkpoint's config turns on training-time noise (router or input jitter) that transformers applies only in
    training mode; the layer computes the eval-mode block, in training too."""


class Cfg:
    """A config.json dict read the way its configuration class reads it: any of a key's spellings (the class's
    ``attribute_map``), its default when absent, the type checked (``where`` names the family in errors);
    ``layer`` the decoder layer being imported (None: not given), for the families whose constants are per layer."""

    def __init__(self, config: Mapping, where: str, layer: int | None = None):
        self.config, self.where, self.layer = config, where, layer
        self.sequence: int | None = None  # the tokens per sequence, where routing counts per sequence

    def per_layer(self, key: str, what: str):
        """``config[key][layer]`` of a per-layer list (None when the config has no list): the ``layer`` given to the
        import (a ValueError saying so when it is missing or out of range)."""
        values = self.config.get(key)
        if values is None:
            return None
        if not isinstance(values, list | tuple):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be a list (one {what} per layer), got {values!r}")
        if self.layer is None or not 0 <= self.layer < len(values):
            raise ValueError(
                f"moe_from_hf: {self.where}'s {what} is per layer ({key}: {list(values)[:8]}…): give layer= "
                f"(0 … {len(values) - 1})"
            )
        return values[self.layer]

    def get(self, *keys: str, default=..., kind=int):
        for k in keys:
            if k in self.config and self.config[k] is not None:
                return self._typed(k, self.config[k], kind)
        if default is ...:
            raise ValueError(
                f"moe_from_hf: config.json of {self.where!r} lacks {keys[0]!r}"
                + (f" (or {', '.join(map(repr, keys[1:]))})" if len(keys) > 1 else "")
            )
        return default

    def _typed(self, key: str, v, kind):
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be an integer, got {v!r}")
        if kind is float and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be a number, got {v!r}")
        if kind is bool and not isinstance(v, bool):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be true or false, got {v!r}")
        if kind is list and (
            not isinstance(v, list | tuple) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        ):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be a list of integer layer ids, got {v!r}")
        if kind is int and key.startswith(("num_hidden_layers", "n_layers")) and not 1 <= v <= MAX_LAYERS:
            raise ValueError(f"moe_from_hf: config[{key!r}] = {v} layers; it must lie in [1, {MAX_LAYERS:,}]")
        return v

    def num_layers(self) -> int:
        L = self.get("num_hidden_layers", "n_layers")
        if isinstance(L, int) and not 1 <= L <= MAX_LAYERS:
            raise ValueError(f"moe_from_hf: num_hidden_layers = {L}; it must lie in [1, {MAX_LAYERS:,}]")
        return L

    def positive(self, *keys: str, default=...) -> int:
        v = self.get(*keys, default=default)
        if v < 1:
            raise ValueError(f"moe_from_hf: config[{keys[0]!r}] must be >= 1, got {v}")
        return v
