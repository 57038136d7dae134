"""Implementation names and the one rule that resolves "auto" per platform (for every op with several paths).

An op (the grouped GEMM, the dispatch kernel, the token exchange of `tempo_jax`) declares an
`ImplementationTable`: its concrete implementations, the preference order "auto" follows on each platform,
which implementations depend on something optional (the Pallas Triton backend), and what interpret mode
picks. `resolve` validates a name once (the error lists the valid ones) and turns "auto" into a concrete
implementation for the current platform:

    GMM.resolve("auto")                  # "chunked" on CPU; on a GPU "tokamax", else "pallas" (jax < 0.11), else
                                         # "ragged_dot"
    GMM.resolve("auto", interpret=True)  # "pallas" (the kernel in interpret mode, on any platform)

jax only; imports nothing from `solvers` or `tempo_jax`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

import jax

from pallas_kernels import tokamax_backend, triton_backend

__all__ = ["DISPATCH", "DispatchImpl", "GMM", "GmmImpl", "ImplementationTable", "Platform", "platform"]

Platform = Literal["cpu", "gpu", "tpu"]
GmmImpl = Literal["auto", "pallas", "chunked", "ragged_dot", "tokamax", "megablox", "mosaic"]
DispatchImpl = Literal["auto", "pallas", "pallas_tpu", "xla"]


def platform() -> str:
    """The default JAX backend as one of `Platform` ("cuda" / "rocm" count as "gpu"; others pass through)."""
    name = jax.default_backend()
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


@dataclass(frozen=True)
class ImplementationTable:
    """The implementations of one op and how "auto" chooses among them.

    Attributes:
      op: the op's name (for error messages).
      names: every accepted name, "auto" first (e.g. ``get_args(GmmImpl)``).
      auto: platform → implementations in order of preference; "auto" takes the first available one
        (platforms not listed use ``auto["default"]``).
      requires: implementation → availability check (e.g. the Pallas Triton backend on a GPU).
      interpret: what "auto" resolves to when ``interpret=True`` (None: interpret mode changes nothing).
    """

    op: str
    names: tuple[str, ...]
    auto: Mapping[str, tuple[str, ...]]
    requires: Mapping[str, Callable[[], bool]] = field(default_factory=dict)
    interpret: str | None = None

    def validate(self, name: str) -> str:
        """``name`` if it is one of `names`, else ValueError listing them."""
        if name not in self.names:
            raise ValueError(f"{self.op}: unknown implementation {name!r}; valid: {list(self.names)}")
        return name

    def resolve(self, name: str, *, interpret: bool = False, on: str | None = None) -> str:
        """The concrete implementation ``name`` stands for on platform ``on`` (default: the current one)."""
        self.validate(name)
        if name != "auto":
            return name
        if interpret and self.interpret is not None:
            return self.interpret
        prefs = self.auto.get(on or platform(), self.auto["default"])
        for impl in prefs:
            if self.requires.get(impl, lambda: True)():
                return impl
        return prefs[-1]


def _mosaic_on_gpu() -> bool:
    """The project's Mosaic GPU kernel can run here: jax >= 0.12 with Pallas Mosaic GPU, on a GPU
    (`pallas_kernels.gmm_mosaic`; imported only when asked, so jax 0.10 never imports Mosaic GPU)."""
    from pallas_kernels import gmm_mosaic

    return platform() == "gpu" and gmm_mosaic.available()


def _triton_on_gpu() -> bool:
    return triton_backend.available()


def _triton_not_deprecated() -> bool:
    """The Pallas Triton backend is there and this JAX has not deprecated it (jax < 0.11)."""
    return triton_backend.available() and not triton_backend.deprecated()


#: `pallas_kernels.gmm`: on a GPU tokamax where it is installed (jax >= 0.11.1), else the Pallas kernel while
#: JAX ships its Triton backend undeprecated (jax < 0.11), else `jax.lax.ragged_dot` — "auto" never picks the
#: deprecated backend (`implementation="pallas"` still does); the chunked XLA path on CPU, `jax.lax.ragged_dot`
#: elsewhere, on a TPU megablox's Pallas TPU kernels (MaxText's default there; no TPU has timed them against
#: `ragged_dot` here); interpret mode runs the Pallas kernel. The GPU order is what the H200 measured
#: (results/gpu/bench_gemm.json: tokamax and the Pallas kernel each several times `ragged_dot`'s TFLOP/s).
#: "mosaic" (the project's own Mosaic GPU kernel, `pallas_kernels.gmm_mosaic`) is in no "auto" list: it has been
#: checked only in GPU interpret mode and lowered for sm_90 from CPU; "auto" takes it on a GPU only after a GPU run
#: measures it faster than tokamax (then it goes first in the "gpu" list, its `requires` check already in place).
GMM = ImplementationTable(
    op="gmm",
    names=get_args(GmmImpl),
    auto={
        "gpu": ("tokamax", "pallas", "ragged_dot"),
        "cpu": ("chunked",),
        "tpu": ("megablox", "ragged_dot"),
        "default": ("ragged_dot",),
    },
    requires={"pallas": _triton_not_deprecated, "tokamax": tokamax_backend.available, "mosaic": _mosaic_on_gpu},
    interpret="pallas",
)

#: `pallas_kernels.dispatch`: the Pallas kernel on a GPU with Triton (or in interpret mode), else the jnp path. The
#: TPU kernel ("pallas_tpu", `pallas_kernels.dispatch_tpu`) is checked in TPU interpret mode and lowered for TPU
#: here but has not run on a TPU, so "auto" on a TPU stays the jnp path until one measures it.
DISPATCH = ImplementationTable(
    op="dispatch",
    names=get_args(DispatchImpl),
    auto={"gpu": ("pallas", "xla"), "default": ("xla",)},
    requires={"pallas": _triton_on_gpu},
    interpret="pallas",
)
