"""Lowering for a CUDA GPU on a machine without one (the kernels' "lowers for CUDA" tests).

Pallas's Triton lowering reads the target GPU from the device it runs on. Without a GPU, jax 0.10 assumed
compute capability 9.0 (Hopper); jax 0.12 asks to be told, through the abstract device of an abstract mesh.
`lower_for_cuda` names that same target (an H100) on every jax, so the lowered text is the same.
"""

import jax

#: The GPU the tests lower for: Hopper, compute capability 9.0.
TARGET = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")


def lower_for_cuda(fn, *args) -> str:
    """The StableHLO text of ``jax.jit(fn)`` at ``args``, lowered for CUDA with `TARGET` as the device."""
    mesh = jax.sharding.AbstractMesh((1,), ("target",), abstract_device=TARGET)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
