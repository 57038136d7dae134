"""Reliability, round 4 (issue 40): the layer, serve, calibrate and solve surfaces. Each class of problem the probe
found has a test that failed before: silently wrong results, silently ignored options, crashes on bounded sizes.
(The Hugging Face loader's rows are in tests/test_hf_import.py, the CascadeEP trace rows in
tests/test_cascade_inputs.py.)
"""

import dataclasses
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numeric import assert_close

import tempo_jax
from solvers import CostModel, Placement
from solvers.fit import read_samples
from tempo_jax.cli import main
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference, to_logical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.routing import RouterConfig
from tempo_jax.runtime.serve_config import ServeConfig
from tempo_jax.sim import CascadeConfig, PhaseConfig

D, E, K, H = 8, 8, 2, 16


@pytest.fixture(scope="module")
def layer():
    placement = Placement.spread(E, D, 2)
    cfg = MoEConfig(hidden=H, ffn=8, experts=E, top_k=K, slots_per_rank=2, dispatch_mode="quota")
    mesh = make_ep_mesh(D)
    return placement, cfg, mesh, init_params(jax.random.key(0), cfg, placement, mesh=mesh)


# ------------------------------------------------------------------------------------------------ silently wrong
def test_out_of_range_replayed_ids_under_jit_contribute_nothing_and_are_counted(layer):
    """Eagerly such ids are refused; under ``jit`` only the mask can act: the pair is computed by no expert (not
    by rank 0's last slot, as before), its gate weight adds nothing, and ``stats.invalid_ids`` counts it."""
    placement, cfg, mesh, params = layer
    pa = dispatch_tables.placement_arrays(placement)
    T = D * 4
    x = jax.random.normal(jax.random.key(1), (T, H))
    ids = np.tile(np.arange(K, dtype=np.int32), (T, 1))
    bad = ids.copy()
    bad[0, 1], bad[5, 0] = E, -1  # id 8 with E = 8, and −1
    w = jnp.full((T, K), 0.5)

    @jax.jit
    def run(ids):
        return moe_forward(
            params,
            x,
            mesh=mesh,
            placement_arrays=pa,
            tables=dispatch_tables.uniform(placement),
            config=cfg,
            routing=(ids, w),
        )

    got = run(jnp.asarray(bad))
    keep = np.ones((T, K), bool)
    keep[0, 1] = keep[5, 0] = False
    want = moe_reference(to_logical(params, placement), x, cfg, routing=(jnp.asarray(ids), w * keep))
    assert_close(got.out, want)
    assert int(got.stats.invalid_ids.sum()) == 2 and int(got.stats.drops.sum()) == 0
    assert int(got.counts.sum()) == T * K - 2  # counted nowhere else
    with pytest.raises(ValueError, match=r"routing ids must lie in \[0, 8\)"):
        moe_forward(
            params,
            x,
            mesh=mesh,
            placement_arrays=pa,
            tables=dispatch_tables.uniform(placement),
            config=cfg,
            routing=(jnp.asarray(bad), w),
        )


def test_numpy_scalars_in_configs_behave_as_python_numbers(layer):
    """``MoEConfig(capacity=np.int64(4))`` dropped pairs with no warning and ``total_drops`` 0: every numpy scalar
    a config accepts is now the Python number at construction (and so the drops are counted and warned)."""
    placement, cfg, mesh, _ = layer
    small = dataclasses.replace(cfg, capacity=np.int64(4))
    assert type(small.capacity) is int
    moe = tempo_jax.MoE(small, placement, mesh=mesh, rngs=nnx.Rngs(0))
    x = jnp.ones((D * 16, H))  # every token to the same experts: blocks of 32 > 4
    with pytest.warns(UserWarning, match="token–expert pairs were dropped"):
        moe(x)
    assert moe.total_drops > 0
    built = [
        MoEConfig(
            hidden=np.int64(8), ffn=np.int32(4), experts=8, top_k=2, slots_per_rank=1, capacity_factor=np.float32(1.5)
        ),
        RouterConfig(balance_rate=np.float64(0.1), score_bias=np.bool_(True)),
        CostModel(b=np.float64(14.0), beta=np.float32(0.1), tile=np.int64(128)),
        ServeConfig(steps=np.int64(10)),
        CascadeConfig(max_requests=np.int64(12)),
        PhaseConfig(seed=np.int64(1)),
    ]
    for c in built:
        for f in dataclasses.fields(c):
            assert not isinstance(getattr(c, f.name), np.generic), (type(c).__name__, f.name)


# ------------------------------------------------------------------------------------------------ ignored options
@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(model="layer", routing="recorded", experts=8, top_k=1, skew=3.0), "shape the synthetic stream"),
        (dict(model="layer", routing="recorded", drift=0.5), "drift=0.5 shape the synthetic stream"),
        (dict(model="layer", routing="recorded", kappa=10.0), "kappa=10.0 shape the synthetic stream"),
        (dict(steps=5, kill_worker_at=5), "past the last step"),
        (dict(every_steps=2, period_s=0.5), "period_s would never act"),
        (dict(fallback="static", staleness_s=None), "the fallback is published only"),
    ],
)
def test_serve_refuses_options_another_option_makes_inert(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        ServeConfig(**kw)


def test_serve_cli_refuses_recorded_routing_with_synthetic_options(capsys):
    argv = ["serve", "--model", "layer", "--routing", "recorded", "--experts", "8", "--top-k", "1", "--skew", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "shape the synthetic stream" in err and "Traceback" not in err


def test_calibrate_csv_with_an_unknown_column_is_refused(tmp_path):
    p = tmp_path / "prof.csv"
    p.write_text("G,N,t,tiles\n" + "".join(f"{g},{n},{5 + g + n / 100},{g}\n" for g in (1, 2, 4, 8) for n in (8, 800)))
    with pytest.raises(ValueError, match=r"unknown columns \['tiles'\] \(the M-tile column is named T\)"):
        read_samples(p)
    assert main(["calibrate", str(p)]) == 2


# ------------------------------------------------------------------------------------------------ bounded sizes
def test_solve_counts_npz_declaring_a_huge_array_is_a_usage_error(tmp_path, capsys):
    """A 200-byte .npz whose member declares 2^37 int64 ended in MemoryError ("internal failure"): the header is
    read first and the size bounded, naming the option."""
    p = tmp_path / "huge.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.int64))
    header["shape"] = (2**37,)
    with zipfile.ZipFile(p, "w") as zf, zf.open("counts.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 64)
    assert main(["solve", "--counts", str(p)]) == 2
    err = capsys.readouterr().err
    assert "--counts" in err and "declares shape [137438953472]" in err and "Traceback" not in err
