"""Lowering for a CUDA GPU on a machine without one (the kernels' "lowers for CUDA" tests).

Pallas's Triton lowering reads the target GPU from the device it runs on. Without a GPU, jax 0.10 assumed
compute capability 9.0 (Hopper); jax 0.12 asks to be told, through the abstract device of an abstract mesh.
`lower_for_cuda` names that same target (an H100) on every jax, so the lowered text is the same.

These tests lower the Pallas kernels through the Triton backend, which JAX 0.11 deprecated: on jax >= 0.11 the
lowering must raise its DeprecationWarning ("The Pallas Triton backend is deprecated"), and `lower_for_cuda`
checks that it does (on jax 0.10 that none does), so the warning is expected here and nowhere else. The
kernels stay the reference kernels and the jax 0.10 GPU path; "auto" never picks them on jax >= 0.11
(`pallas_kernels.implementations.GMM`; tests/test_tokamax.py).
"""

import warnings

import jax

from pallas_kernels import triton_backend

#: The GPU the tests lower for: Hopper, compute capability 9.0.
TARGET = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")


def lower_for_cuda(fn, *args) -> str:
    """The StableHLO text of ``jax.jit(fn)`` at ``args``, lowered for CUDA with `TARGET` as the device.

    Asserts that the lowering raised the Pallas Triton DeprecationWarning exactly when this JAX deprecated the
    backend and the program lowers a Triton kernel.
    """
    mesh = jax.sharding.AbstractMesh((1,), ("target",), abstract_device=TARGET)
    with warnings.catch_warnings(record=True) as caught, jax.sharding.use_abstract_mesh(mesh):
        warnings.simplefilter("always", DeprecationWarning)
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    deprecations = [w for w in caught if "Pallas Triton backend is deprecated" in str(w.message)]
    lowers_triton = "xla.gpu.triton" in text
    assert bool(deprecations) == (triton_backend.deprecated() and lowers_triton), (
        f"jax {jax.__version__}: {len(deprecations)} Pallas Triton deprecation warnings, Triton kernels lowered: "
        f"{lowers_triton}"
    )
    return text
