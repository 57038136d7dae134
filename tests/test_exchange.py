"""The exchanges' ragged metadata (`tempo_jax.layer.exchange.ragged_metadata`): XLA:CPU cannot run
`jax.lax.ragged_all_to_all`, so its semantics — update i to peer j at ``j·U + i`` of each array, the sender giving
the offsets where its rows land (XLA's ragged-all-to-all) — are emulated here, and the plain and split exchanges must
deliver the same rows; the layer with each lowers (the GPU check runs them)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ep_case import small_ep_case

from tempo_jax.layer import moe_forward
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.exchange import SPLIT_UPDATES, lowering_for, ragged_metadata


def _emulate(bufs: np.ndarray, meta: list, updates: int) -> np.ndarray:
    """ragged_all_to_all over D ranks: rank s's update i to peer j copies ``send_sizes[j·U + i]`` rows from its
    input at ``input_offsets[j·U + i]`` into rank j's output at ``output_offsets[j·U + i]``; each receiver's
    ``recv_sizes[s·U + i]`` must match what s sends it (XLA requires it)."""
    D = bufs.shape[0]
    out = np.zeros_like(bufs)
    for s in range(D):
        in_off, send, out_off, _ = (np.asarray(a) for a in meta[s])
        for j in range(D):
            for i in range(updates):
                u = j * updates + i
                assert np.asarray(meta[j][3])[s * updates + i] == send[u], "recv_sizes disagree with send_sizes"
                out[j, out_off[u] : out_off[u] + send[u]] = bufs[s, in_off[u] : in_off[u] + send[u]]
                assert in_off[u] + send[u] <= bufs.shape[1] and out_off[u] + send[u] <= bufs.shape[1]
    return out


@pytest.mark.parametrize(("D", "C"), [(4, 8), (3, 5), (8, 3), (2, 17)])
@pytest.mark.parametrize("updates", [1, 2, SPLIT_UPDATES])
def test_split_updates_deliver_the_plain_exchanges_rows(D, C, updates):
    rng = np.random.default_rng(D * 100 + C)
    counts = rng.integers(0, C + 1, (D, D))  # counts[s, j]: rows rank s sends rank j (valid rows first)
    counts[0, -1] = C  # a full block
    counts[-1, 0] = 0  # an empty one
    bufs = rng.standard_normal((D, D * C, 3))  # rank s's buffer: block j = rows for rank j
    U = min(updates, C)
    meta = [ragged_metadata(jnp.asarray(counts[s]), jnp.asarray(counts[:, s]), s, C, U) for s in range(D)]
    got = _emulate(bufs, meta, U)
    want = np.zeros_like(bufs)  # rank j's block s = the first counts[s, j] rows of rank s's block j
    for s in range(D):
        for j in range(D):
            n = counts[s, j]
            want[j, s * C : s * C + n] = bufs[s, j * C : j * C + n]
    np.testing.assert_array_equal(got, want)
    for a in meta[0]:
        assert a.shape == (D * U,) and a.dtype == jnp.int32


@pytest.mark.parametrize("exchange", ["ragged", "ragged_split"])
def test_the_ragged_exchanges_lower_with_their_updates(exchange):
    """The layer with each ragged exchange traces and lowers here; the split one's metadata has D·U entries."""
    placement, config, params, mesh = small_ep_case(1)
    config = dataclasses.replace(config, exchange=exchange)
    x = jax.random.normal(jax.random.key(2), (8 * 16, 32))
    pa = dispatch_tables.placement_arrays(placement)
    f = jax.jit(
        lambda p, x: moe_forward(
            p, x, mesh=mesh, placement_arrays=pa, tables=dispatch_tables.uniform(placement), config=config
        )
    )
    with lowering_for("gpu"):
        text = f.lower(params, x).as_text()
    calls = [line for line in text.splitlines() if "ragged_all_to_all" in line and "custom_call" in line]
    assert calls
    D = mesh.shape["ep"]
    n = D * (SPLIT_UPDATES if exchange == "ragged_split" else 1)
    assert all(f"tensor<{n}xi32>" in line for line in calls), calls[0]


@pytest.mark.parametrize("exchange", ["ragged", "ragged_split"])
def test_dynamic_copies_move_their_weights_with_the_ragged_exchange(exchange):
    """With dynamic slots and a ragged exchange the copies' weights travel in one more ragged all-to-all (only the
    copies move on a GPU) beside the rows' two, with the split's D·U metadata (the weight exchange's blocks are
    k = 1 slot: one update each)."""
    from solvers import CopyCost, CostModel

    placement, config, params, mesh = small_ep_case(1)
    x = jax.random.normal(jax.random.key(2), (8 * 16, 32))
    pa = dispatch_tables.placement_arrays(placement)
    linear = CostModel(a=0.0, b=0.0, c=0.0, beta=1.0)
    base = dataclasses.replace(config, exchange=exchange, dispatch="ingraph", dispatch_mode="quota", cost=linear)
    calls = {}
    for k in (0, 1):
        cfg = dataclasses.replace(base, dynamic_slots=k, copy_cost=CopyCost(1e3, 1e6) if k else None)
        f = jax.jit(lambda p, x, c=cfg: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=None, config=c))
        with lowering_for("gpu"):
            text = f.lower(params, x).as_text()
        calls[k] = [line for line in text.splitlines() if "ragged_all_to_all" in line and "custom_call" in line]
    assert len(calls[1]) == len(calls[0]) + 1, (len(calls[0]), len(calls[1]))
    D, split = mesh.shape["ep"], exchange == "ragged_split"
    rows, weights = D * (SPLIT_UPDATES if split else 1), D  # a block of k = 1 slot is one update
    assert sum(f"tensor<{rows}xi32>" in line for line in calls[1]) >= len(calls[0])
    assert any(f"tensor<{weights}xi32>" in line and f"tensor<{rows}xi32>" not in line for line in calls[1]) or not split
