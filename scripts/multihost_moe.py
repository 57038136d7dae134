"""Run the expert-parallel MoE layer once over every device of every process and save the output.

Single process (reference):   python scripts/multihost_moe.py --out ref.npz
Each of N processes:          python scripts/multihost_moe.py --out mh.npz --coordinator 127.0.0.1:PORT \\
                                  --num-processes N --process-id I
(`scripts/launch_multihost.sh` starts the N local processes; on a real cluster run one per host with the same
coordinator.) On CPU the processes talk through gloo collectives. The inputs are generated identically on
every process from fixed seeds, so every layout must produce the same output.

``--mesh data=2,ep=4`` runs on a ``data × ep × tensor`` mesh (`tempo_jax.layer.make_mesh`: data slowest, so on two
processes × 4 devices the data axis runs across the processes and ``ep`` inside each — how multi-node EP is deployed
when the links between nodes are slow); default: one ``ep`` axis over every device.

``--checkpoint DIR`` loads the layer's parameters instead from a Hugging Face checkpoint folder
(`tempo_jax.hf.load_moe_layers` with the mesh and the placement: each process reads only its slots' experts); the
experts each process read are written beside ``--out`` (``<out>.reads<I>.json``) and the loaded expert arrays are
gathered into the output file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pallas_kernels import DISPATCH_MODES

if TYPE_CHECKING:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from solvers import Placement
    from tempo_jax.layer import MoEConfig
    from tempo_jax.layer.tables import PlacementArrays, Tables


def parse_args(argv=None) -> argparse.Namespace:
    """The command line: the output file, this process's place in the group, the dispatch, the checkpoint and the
    mesh (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--dispatch-mode", default="sample", choices=DISPATCH_MODES)
    ap.add_argument(
        "--dispatch",
        default="tables",
        choices=["tables", "ingraph"],
        help="ingraph: each batch's plan computed in the step (needs --dispatch-mode quota)",
    )
    ap.add_argument("--checkpoint", help="a Hugging Face checkpoint folder: load the first MoE layer from it")
    ap.add_argument("--mesh", help="data × ep × tensor mesh, e.g. 'data=2,ep=4' (default: ep over every device)")
    return ap.parse_args(argv)


def init_distributed(args: argparse.Namespace) -> None:
    """With ``--coordinator``: join the ``--num-processes`` processes as ``--process-id`` (CPU collectives through
    gloo; GPUs use NCCL). Without: nothing, one process. Runs before anything starts a JAX backend."""
    import jax

    if args.coordinator:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives; GPUs use NCCL
        jax.distributed.initialize(args.coordinator, num_processes=args.num_processes, process_id=args.process_id)


def build_mesh(spec: str | None) -> Mesh:
    """Step 1's mesh: ``--mesh`` (e.g. ``'data=2,ep=4'``; data × ep × tensor, data slowest), else one ``ep`` axis over
    every device of every process."""
    from tempo_jax.layer import make_mesh
    from tempo_jax.layer.mesh import parse_mesh

    return make_mesh(**parse_mesh(spec)) if spec else make_mesh()


def set_up_layer(args: argparse.Namespace, mesh: Mesh) -> tuple[Placement, MoEConfig, dict | None, set[int]]:
    """Step 1: the same layer on every process, as (placement, config, params, reads). On the D ranks of the ``ep``
    axis, S = max(2, ⌈16 / D⌉) slots each. By default 12 experts placed by EPLB on the S·D slots, hidden 32, ffn 16,
    top-2, params None (`global_arrays` initialises them) and reads empty; with ``--checkpoint`` the checkpoint's first
    MoE layer instead (`load_checkpoint`: params global arrays [P, ...], reads the experts this process read).
    ``--dispatch ingraph``: each batch's plan made in the step, with the ``dsv3_fp8_offline`` costs."""
    import dataclasses

    import numpy as np

    from solvers import PRESETS, Placement
    from tempo_jax.layer import MoEConfig

    D, tensor = mesh.shape["ep"], "tensor" if mesh.shape["tensor"] > 1 else None
    E = 12
    S = max(2, -(-16 // D))  # 16 slots for the 12 experts (4 replicated) on 8 or 4 ranks
    placement = Placement.from_eplb(np.arange(E) + 1.0, S * D, D)
    config = MoEConfig(
        hidden=32, ffn=16, experts=E, top_k=2, slots_per_rank=S, dispatch_mode=args.dispatch_mode, tensor_axis=tensor
    )
    params, reads = None, set()
    if args.checkpoint:
        placement, config, params, reads = load_checkpoint(args.checkpoint, mesh, S, args.dispatch_mode, tensor)
    if args.dispatch == "ingraph":
        config = dataclasses.replace(config, dispatch="ingraph", cost=PRESETS["dsv3_fp8_offline"])
    return placement, config, params, reads


def load_checkpoint(
    folder: str, mesh: Mesh, slots_per_rank: int, dispatch_mode: str, tensor: str | None
) -> tuple[Placement, MoEConfig, dict, set[int]]:
    """The first MoE layer of the Hugging Face checkpoint ``folder``: its E experts placed by EPLB on
    ``slots_per_rank`` slots of each of the D ``ep`` ranks, loaded onto ``mesh`` (`load_moe_layers`: each process
    reads only its slots' experts) with ``dispatch_mode``. Returns (placement, config, params: global arrays
    [P, ...], the experts this process read; `FileSource.read` is wrapped to record them)."""
    import dataclasses
    import json
    import re

    import numpy as np

    from solvers import Placement
    from tempo_jax.layer.hf import load_moe_layers
    from tempo_jax.layer.hf.tensors import FileSource

    reads: set[int] = set()
    whole = FileSource.read  # record which experts this process reads

    def read(self, key, index=None):
        hit = re.match(r"experts\.(\d+)\.", key)
        if hit:
            reads.add(int(hit[1]))
        elif index is not None:
            reads.add(int(index))  # a row of a stacked expert tensor
        return whole(self, key, index)

    FileSource.read = read
    cfg0 = json.loads((Path(folder) / "config.json").read_text())
    E = cfg0.get("num_experts", cfg0.get("n_routed_experts", cfg0.get("num_local_experts")))
    D = mesh.shape["ep"]
    placement = Placement.from_eplb(np.arange(E) + 1.0, slots_per_rank * D, D)
    layers = load_moe_layers(folder, mesh=mesh, placement=placement, dispatch_mode=dispatch_mode, tensor_axis=tensor)
    config, params, _ = layers[min(layers)]
    return placement, dataclasses.replace(config, dispatch_mode=dispatch_mode), params, reads


def make_inputs(config: MoEConfig, placement: Placement) -> tuple[np.ndarray, Tables]:
    """The same inputs on every process, as numpy: tokens x [16 per device of every process, hidden] (normal, key 2)
    and the dispatch tables (uniform over ``placement``, perturbed with seed 5)."""
    import jax
    import numpy as np

    from tempo_jax.layer import tables as dispatch_tables

    x = np.asarray(jax.random.normal(jax.random.key(2), (jax.device_count() * 16, config.hidden)))
    return x, dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=5)


def put(mesh: Mesh, a, spec):
    """``a`` (the same on every process) as a global array on ``mesh`` sharded by ``spec``: each process supplies its
    addressable shards."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    a = np.asarray(a)
    return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda idx: a[idx])


def global_arrays(
    mesh: Mesh, config: MoEConfig, placement: Placement, params: dict | None, x: np.ndarray, tables: Tables
) -> tuple[dict, PlacementArrays, Tables, jax.Array]:
    """Step 2: the forward's inputs as global arrays on ``mesh`` (each process supplies its addressable shards):
    (params, placement arrays, tables, tokens). ``params`` None: initialised (key 1), physical [P, ...], each rank its
    slots (and its F / Tp share); the placement arrays and tables replicated; the tokens x [T, hidden] split over
    data × ep."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from tempo_jax.layer import init_params, layer_axes, param_shardings
    from tempo_jax.layer import tables as dispatch_tables

    if params is None:
        params = jax.tree.map(np.asarray, init_params(jax.random.key(1), config, placement))  # physical [P, ...]
        homes = param_shardings(params, mesh, config)  # each rank its slots (and its F / Tp share)
        params = {k: put(mesh, v, homes[k].spec) for k, v in params.items()}
    pa = dispatch_tables.placement_arrays(placement)
    pa = dispatch_tables.PlacementArrays(put(mesh, pa.phy2log, P()), put(mesh, pa.log2phy, P()))
    tables = dispatch_tables.Tables(put(mesh, tables.table, P()), put(mesh, tables.log2phy, P()))
    xg = put(mesh, x, layer_axes(config, mesh).token_spec)  # tokens over data × ep
    return params, pa, tables, xg


def run_and_gather(
    mesh: Mesh,
    config: MoEConfig,
    placement: Placement,
    params: dict,
    pa: PlacementArrays,
    tables: Tables | None,
    xg: jax.Array,
) -> dict:
    """Step 3: the layer once (jitted `moe_forward`; ``tables`` None: each batch's plan made in the step) and the
    output file's arrays, gathered onto every process (collectives: every process must call it): out [T, hidden],
    counts [D, E], counter (`host_counter`, what the refresher reads: equal to counts after one call), addressable
    (whether the counter was fully addressable), processes, devices, phy2log [P], gpu_tokens [devices] and the expert
    arrays [P, ...]."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from tempo_jax.layer import moe_forward
    from tempo_jax.layer.params import EXPERT_KEYS
    from tempo_jax.runtime.counters import host_counter

    f = jax.jit(lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config))
    res = f(params, xg)
    out, counts = res.out, res.counts
    out = multihost_utils.process_allgather(out, tiled=True)
    counts = multihost_utils.process_allgather(counts, tiled=True)
    gpu_tokens = np.asarray(multihost_utils.process_allgather(res.stats.gpu_tokens, tiled=True))  # a collective
    counter = host_counter(res.counter)  # what the refresher reads: a collective when spread over processes
    experts = {
        k: np.asarray(multihost_utils.process_allgather(params[k], tiled=True)) for k in EXPERT_KEYS if k in params
    }
    return dict(
        out=np.asarray(out),
        counts=np.asarray(counts),
        counter=counter,
        addressable=res.counter.is_fully_addressable,
        processes=jax.process_count(),
        devices=jax.device_count(),
        phy2log=placement.phy2log,
        gpu_tokens=gpu_tokens,
        **experts,
    )


def write_output(args: argparse.Namespace, arrays: dict, reads: set[int], ranks: int) -> None:
    """With ``--checkpoint``, every process I writes the experts it read to ``<out>.reads<I>.json`` (sorted); process 0
    writes ``arrays`` to ``--out`` (npz) and prints the process count, ``ranks`` (the ``ep`` axis's size) and the
    file."""
    import json

    import jax
    import numpy as np

    if args.checkpoint:
        Path(f"{args.out}.reads{jax.process_index()}.json").write_text(json.dumps(sorted(reads)))
    if jax.process_index() == 0:
        np.savez(args.out, **arrays)
        print(f"process 0 of {jax.process_count()}: {ranks} devices, wrote {args.out}")


def main(argv=None) -> int:
    """Parse, join the processes, set the layer up on the mesh, run it once and write what it gave."""
    args = parse_args(argv)
    init_distributed(args)

    # Step 1: the same problem on every process.
    mesh = build_mesh(args.mesh)
    placement, config, params, reads = set_up_layer(args, mesh)
    x, tables = make_inputs(config, placement)

    # Step 2: global arrays (each process supplies its addressable shards).
    params, pa, tables, xg = global_arrays(mesh, config, placement, params, x, tables)

    # Step 3: run and gather.
    tables = None if args.dispatch == "ingraph" else tables
    arrays = run_and_gather(mesh, config, placement, params, pa, tables, xg)
    write_output(args, arrays, reads, mesh.shape["ep"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
