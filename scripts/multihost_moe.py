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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--dispatch-mode", default="sample", choices=["sample", "quota"])
    ap.add_argument(
        "--dispatch",
        default="tables",
        choices=["tables", "ingraph"],
        help="ingraph: each batch's plan computed in the step (needs --dispatch-mode quota)",
    )
    ap.add_argument("--checkpoint", help="a Hugging Face checkpoint folder: load the first MoE layer from it")
    ap.add_argument("--mesh", help="data × ep × tensor mesh, e.g. 'data=2,ep=4' (default: ep over every device)")
    args = ap.parse_args(argv)

    import jax

    if args.coordinator:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives; GPUs use NCCL
        jax.distributed.initialize(args.coordinator, num_processes=args.num_processes, process_id=args.process_id)

    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from solvers import Placement
    from tempo_jax.layer import MoEConfig, init_params, layer_axes, make_mesh, moe_forward, param_shardings
    from tempo_jax.layer import tables as dispatch_tables
    from tempo_jax.layer.mesh import parse_mesh
    from tempo_jax.layer.params import EXPERT_KEYS
    from tempo_jax.runtime.counters import host_counter

    # Step 1: the same problem on every process.
    mesh = make_mesh(**parse_mesh(args.mesh)) if args.mesh else make_mesh()
    D, tensor = mesh.shape["ep"], "tensor" if mesh.shape["tensor"] > 1 else None
    E = 12
    S = max(2, -(-16 // D))  # 16 slots for the 12 experts (4 replicated) on 8 or 4 ranks
    placement = Placement.from_eplb(np.arange(E) + 1.0, S * D, D)
    config = MoEConfig(
        hidden=32, ffn=16, experts=E, top_k=2, slots_per_rank=S, dispatch_mode=args.dispatch_mode, tensor_axis=tensor
    )
    reads: set[int] = set()
    if args.checkpoint:
        import dataclasses
        import json
        import re

        from tempo_jax.layer.hf import load_moe_layers
        from tempo_jax.layer.hf.tensors import FileSource

        whole = FileSource.read  # record which experts this process reads

        def read(self, key, index=None):
            hit = re.match(r"experts\.(\d+)\.", key)
            if hit:
                reads.add(int(hit[1]))
            elif index is not None:
                reads.add(int(index))  # a row of a stacked expert tensor
            return whole(self, key, index)

        FileSource.read = read
        cfg0 = json.loads((Path(args.checkpoint) / "config.json").read_text())
        E = cfg0.get("num_experts", cfg0.get("n_routed_experts", cfg0.get("num_local_experts")))
        placement = Placement.from_eplb(np.arange(E) + 1.0, S * D, D)
        layers = load_moe_layers(
            args.checkpoint, mesh=mesh, placement=placement, dispatch_mode=args.dispatch_mode, tensor_axis=tensor
        )
        config, params, _ = layers[min(layers)]
        config = dataclasses.replace(config, dispatch_mode=args.dispatch_mode)
    if args.dispatch == "ingraph":
        import dataclasses

        from solvers import PRESETS

        config = dataclasses.replace(config, dispatch="ingraph", cost=PRESETS["dsv3_fp8_offline"])
    x = np.asarray(jax.random.normal(jax.random.key(2), (jax.device_count() * 16, config.hidden)))
    tables = dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=5)

    # Step 2: global arrays (each process supplies its addressable shards).
    def put(a, spec):
        a = np.asarray(a)
        return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda idx: a[idx])

    if not args.checkpoint:
        params = jax.tree.map(np.asarray, init_params(jax.random.key(1), config, placement))  # physical [P, ...]
        homes = param_shardings(params, mesh, config)  # each rank its slots (and its F / Tp share)
        params = {k: put(v, homes[k].spec) for k, v in params.items()}
    pa = dispatch_tables.placement_arrays(placement)
    pa = dispatch_tables.PlacementArrays(put(pa.phy2log, P()), put(pa.log2phy, P()))
    tables = dispatch_tables.Tables(put(tables.table, P()), put(tables.log2phy, P()))
    xg = put(x, layer_axes(config, mesh).token_spec)  # tokens over data × ep

    # Step 3: run and gather.
    tables = None if args.dispatch == "ingraph" else tables
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
    if args.checkpoint:
        Path(f"{args.out}.reads{jax.process_index()}.json").write_text(json.dumps(sorted(reads)))
    if jax.process_index() == 0:
        np.savez(
            args.out,
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
        print(f"process 0 of {jax.process_count()}: {D} devices, wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
