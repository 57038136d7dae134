"""The solver worker (TEMPO §4.4): count windows in, table weights out, in a separate numpy-only process.

`solve_window` is the one solve path of the runtime: the controller runs it in-process (inline or on a thread)
or hands it to a `SolverWorker`, a child process that imports numpy, scipy, ortools and `solvers` only.

Why not ``multiprocessing.Process`` with the spawn start method: spawn re-imports the parent's ``__main__``
script in the child, so a serving script that imports jax at the top would drag jax (and its device runtime)
into the worker. `SolverWorker` therefore spawns a fresh interpreter on ``python -m solvers.worker`` and talks
to it over two inherited pipes wrapped as `multiprocessing.connection.Connection` objects (pickled messages).

Protocol (tuples):
  parent → child: ``("config", WorkerConfig)``, ``("solve", seq, counts [D, E])``, ``("fault", kind, seconds)``,
                  ``("probe",)``, ``("stop",)``, ``("reconfig", WorkerConfig)`` (a new placement: no reply)
  child → parent: ``("ready", probe | warm-up)`` (after `warm_up`),
                  ``("result", seq, weights [Gs, E, R] float32 | None, info)``, ``("probe", probe)``

``info`` holds ``solve_ms`` (the worker's own clock, counts in → weights out), ``policy_ms`` (the policy alone),
``makespan`` (µs, modelled, of the plan), ``pairs``, and ``error`` (``"Type: message"``) when the solve raised.

Faults for tests and demos (`FAULTS`), applied to the next solve only: ``"hang"`` (sleep ``seconds`` first),
``"raise"`` (raise instead of solving), ``"nan"`` (return NaN weights), ``"exit"`` (the process exits mid-solve).
Killing the process from outside is `SolverWorker.kill`.

numpy only."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

import numpy as np

from .checks import check_choice, check_real
from .cost import CostModel
from .placement import Placement
from .problem import DispatchProblem
from .tables import solve_weights

__all__ = ["FAULTS", "SolverWorker", "WorkerConfig", "WorkerLost", "probe", "run_worker", "solve_window", "warm_up"]

FAULTS = ("hang", "raise", "nan", "exit")


@dataclass(frozen=True)
class WorkerConfig:
    """What every solve needs: the placement (or one per MoE layer: a tuple, solved together every window), cost
    model, policy (+ options) and whether tables are per node."""

    placement: Placement | tuple[Placement, ...]
    cost: CostModel
    policy: str = "tempo"
    options: dict = field(default_factory=dict)
    per_node: bool = False
    processes: int = 1  # layered windows in the worker process: layers split over this many solver processes

    @property
    def placements(self) -> tuple[Placement, ...]:
        """Every layer's placement (one for a single layer)."""
        return self.placement if isinstance(self.placement, tuple) else (self.placement,)

    @property
    def layered(self) -> bool:
        """One placement per layer: windows are ``[L, D, E]`` and results one weight array per layer."""
        return isinstance(self.placement, tuple)

    @property
    def window_shape(self) -> tuple[int, ...]:
        p = self.placements[0]
        return ((len(self.placements),) if self.layered else ()) + (p.num_gpus, p.num_experts)


def probe() -> dict:
    """What this process has imported (the test that the worker never imports jax reads it)."""
    return {
        "pid": os.getpid(),
        "jax": "jax" in sys.modules,
        "jaxlib": "jaxlib" in sys.modules,
        "flax": "flax" in sys.modules,
        "tempo_jax": "tempo_jax" in sys.modules,
        "modules": len(sys.modules),
    }


def warm_up(config: WorkerConfig) -> dict:
    """Pay the worker's one-time costs before it reports ready: the OR-Tools modules the solvers import on first
    use, and one solve of a skewed synthetic window ``[D, E]`` (pairs ∝ (rank of e)^-1.2, every source alike) under
    ``config``. Returns ``{"warmup_ms", "warmup_error"}`` (the error as ``"Type: message"``, else None)."""
    t0 = time.perf_counter()
    try:
        from ortools.graph.python import max_flow  # noqa: F401  (first use costs ~0.1–1 s on a loaded machine)
        from ortools.sat.python import cp_model  # noqa: F401

        E = config.window_shape[-1]
        per_source = np.maximum(np.round(32.0 * np.arange(1, E + 1) ** -1.2), 1.0)
        solve_window(config, np.broadcast_to(per_source, config.window_shape))
        error = None
    except Exception as err:  # reported to the parent, which refuses to start on it (`SolverWorker.start`)
        error = f"{type(err).__name__}: {err}"
    return {"warmup_ms": 1e3 * (time.perf_counter() - t0), "warmup_error": error}


def solve_window(config: WorkerConfig, counts: np.ndarray, fault: tuple[str, float] | None = None):
    """Solve one window ``counts [D, E]`` (pairs per source rank and expert): ``(weights [Gs, E, R] float32, info)``.
    With one placement per layer, ``counts [L, D, E]`` → a list of L weight arrays, every layer solved in turn
    (``info``: ``solve_ms`` for all, ``layer_ms`` and ``makespans`` per layer).

    ``fault``: an injected fault ``(kind, seconds)`` (see the module). Exceptions of the solve propagate.
    """
    t0 = time.perf_counter()
    if fault is not None:
        kind, seconds = fault
        if kind == "hang":
            time.sleep(seconds)
        elif kind == "raise":
            raise RuntimeError("injected fault: the solver raised")
        elif kind == "exit":
            os._exit(3)
    counts = np.asarray(counts)
    windows = counts if config.layered else counts[None]
    if config.layered and config.processes > 1 and _IN_WORKER:
        results = _pool_solve(config, windows)
    else:
        results = _solve_layers(config, range(len(config.placements)), windows)
    out = [r[0] for r in results]
    if fault is not None and fault[0] == "nan":
        for w in out:
            w[...] = np.nan
    info = {
        "solve_ms": (time.perf_counter() - t0) * 1e3,
        "policy_ms": sum(r[2] for r in results),
        "makespan": max(r[1] for r in results),
        "pairs": sum(r[3] for r in results),
    }
    if not config.layered:
        return out[0], info
    return out, {**info, "layers": len(out), "layer_ms": [r[4] for r in results], "makespans": [r[1] for r in results]}


def _solve_layers(config: WorkerConfig, layers, windows) -> list[tuple]:
    """``(weights float32, makespan, policy ms, pairs, layer ms)`` of each of ``layers`` (their ``windows``)."""
    out = []
    for layer, window in zip(layers, windows, strict=True):
        t_layer = time.perf_counter()
        problem = DispatchProblem(window, config.placements[layer], config.cost)
        weights, d = solve_weights(problem, config.policy, per_node=config.per_node, options=config.options)
        out.append(
            (
                weights.astype(np.float32),
                d.makespan,
                d.info["solve_time_s"] * 1e3,
                float(problem.n.sum()),
                (time.perf_counter() - t_layer) * 1e3,
            )
        )
    return out


# ------------------------------------------------------------------------------------ layers over processes
_IN_WORKER = False  # set in the worker process: only there may solver processes be spawned (numpy-only __main__)
_POOL: tuple[WorkerConfig, object] | None = None  # (config, ProcessPoolExecutor) of the worker process
_POOL_CONFIG: WorkerConfig | None = None


def _pool_init(config: WorkerConfig) -> None:
    global _POOL_CONFIG
    _POOL_CONFIG = config


def _pool_task(layers: list[int], windows: np.ndarray) -> list[tuple]:
    return _solve_layers(_POOL_CONFIG, layers, windows)


def _pool_solve(config: WorkerConfig, windows: np.ndarray) -> list[tuple]:
    """Layers split into ``config.processes`` contiguous chunks, solved in that many solver processes (spawned
    once per config from this numpy-only worker; a broken pool is dropped and rebuilt at the next window)."""
    global _POOL
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if _POOL is None or _POOL[0] is not config:
        if _POOL is not None:
            _POOL[1].shutdown(cancel_futures=True)
        ctx = multiprocessing.get_context("spawn")
        _POOL = (
            config,
            ProcessPoolExecutor(config.processes, mp_context=ctx, initializer=_pool_init, initargs=(config,)),
        )
    chunks = [c for c in np.array_split(np.arange(len(config.placements)), config.processes) if c.size]
    try:
        futures = [_POOL[1].submit(_pool_task, c.tolist(), windows[c]) for c in chunks]
        return [r for f in futures for r in f.result()]
    except Exception:
        _POOL[1].shutdown(cancel_futures=True)
        _POOL = None
        raise


# ---------------------------------------------------------------------------------------------- child side
def run_worker(conn_in: Connection, conn_out: Connection) -> None:
    """The worker loop: wait for a config, then answer solve / fault / probe messages until ``stop`` or EOF. A
    parent that went away (closed pipes: the controller closed, perhaps while this worker warmed up) ends the loop
    quietly."""
    try:
        _serve_messages(conn_in, conn_out)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return


def _serve_messages(conn_in: Connection, conn_out: Connection) -> None:
    config: WorkerConfig | None = None
    fault = None
    while True:
        try:
            msg = conn_in.recv()
        except (EOFError, OSError):
            return
        op = msg[0]
        if op == "stop":
            return
        if op == "config":
            config = msg[1]
            conn_out.send(("ready", probe() | warm_up(config)))
        elif op == "reconfig":  # a new placement: the next solves use it (no reply; warm already)
            config = msg[1]
        elif op == "probe":
            conn_out.send(("probe", probe()))
        elif op == "fault":
            fault = (msg[1], msg[2])
        elif op == "solve":
            seq, counts = msg[1], msg[2]
            t0 = time.perf_counter()
            try:
                if config is None:
                    raise RuntimeError("solve before config")
                f, fault = fault, None
                weights, info = solve_window(config, counts, f)
            except Exception as err:  # every failure is answered, never fatal to the worker
                weights = None
                info = {"error": f"{type(err).__name__}: {err}", "solve_ms": (time.perf_counter() - t0) * 1e3}
            conn_out.send(("result", seq, weights, info))


def _main(argv: list[str]) -> int:
    global _IN_WORKER
    usage = (
        "usage: python -m solvers.worker FD_IN FD_OUT — the solver worker is started by SolverWorker (the "
        "DispatchController's process mode) with two inherited pipe descriptors; it is not run by hand"
    )
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        print(usage, file=sys.stderr)
        return 2
    fd_in, fd_out = int(argv[0]), int(argv[1])
    try:
        os.fstat(fd_in), os.fstat(fd_out)
    except OSError:
        print(f"solvers.worker: file descriptors {fd_in}, {fd_out} are not open here; {usage}", file=sys.stderr)
        return 2
    _IN_WORKER = True
    run_worker(Connection(fd_in, writable=False), Connection(fd_out, readable=False))
    return 0


# --------------------------------------------------------------------------------------------- parent side
class WorkerLost(RuntimeError):
    """The worker process exited or its pipe broke."""


class SolverWorker:
    """Handle on one worker process (parent side). Not thread-safe by itself: the controller serialises use.

    Args:
      config: the `WorkerConfig` sent at start (and at every restart).
      start_timeout_s: how long `start` waits for the worker's ``ready``.
    """

    def __init__(self, config: WorkerConfig, *, start_timeout_s: float = 120.0):
        if not isinstance(config, WorkerConfig):
            raise ValueError(f"SolverWorker: config must be a solvers.worker.WorkerConfig, got {type(config).__name__}")
        self.config = config
        self.start_timeout_s = check_real(
            "start_timeout_s", start_timeout_s, minimum=0, strict=True, where="SolverWorker"
        )
        self.proc = None
        self.starts = 0
        self.start_s: list[float] = []  # wall time of every start, spawn → ready
        self.ready_probe: dict | None = None
        self._to: Connection | None = None
        self._from: Connection | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> SolverWorker:
        """Spawn a fresh interpreter on ``-m solvers.worker``, send the config and wait for ``ready``."""
        import subprocess

        self.close()
        r_cmd, w_cmd = os.pipe()  # parent → child
        r_res, w_res = os.pipe()  # child → parent
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])  # the folder holding the solvers package
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "solvers.worker", str(r_cmd), str(w_res)],
                pass_fds=(r_cmd, w_res),
                env=env,
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            os.close(r_cmd)
            os.close(w_res)
        self._to = Connection(w_cmd, readable=False)
        self._from = Connection(r_res, writable=False)
        self.starts += 1
        self._to.send(("config", self.config))
        msg = self.recv(self.start_timeout_s)
        if msg is None or msg[0] != "ready":
            self.kill()
            raise WorkerLost(f"the solver worker did not start within {self.start_timeout_s:g} s (got {msg!r})")
        self.ready_probe = msg[1]
        if self.ready_probe.get("warmup_error"):
            self.kill()
            raise WorkerLost(f"the solver worker cannot solve with this config: {self.ready_probe['warmup_error']}")
        self.start_s.append(time.perf_counter() - t0)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def kill(self) -> None:
        """SIGKILL the process (a crash, as far as the worker can tell) and drop the pipes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._drop_pipes()

    def close(self) -> None:
        """Ask the worker to stop; kill it if it does not within a second."""
        if self.proc is None:
            return
        try:
            if self._to is not None and self.proc.poll() is None:
                self._to.send(("stop",))
            self.proc.wait(timeout=1.0)
        except Exception:  # a broken pipe or a worker stuck in a solve: kill it
            pass
        self.kill()
        self.proc = None

    def _drop_pipes(self) -> None:
        for c in (self._to, self._from):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        self._to = self._from = None

    # ------------------------------------------------------------------ messages
    def send(self, msg: tuple) -> None:
        if self._to is None or not self.alive:
            raise WorkerLost("the solver worker is not running")
        try:
            self._to.send(msg)
        except (OSError, EOFError) as err:
            raise WorkerLost(f"the solver worker's pipe broke: {err}") from None

    def submit(self, seq: int, counts: np.ndarray) -> None:
        self.send(("solve", int(seq), np.asarray(counts, dtype=np.float64)))

    def inject(self, kind: str, seconds: float = 0.0) -> None:
        """Make the worker's next solve fail as ``kind`` (`FAULTS`)."""
        check_choice("fault", kind, FAULTS, where="SolverWorker.inject")
        self.send(("fault", kind, float(seconds)))

    def recv(self, timeout: float | None) -> tuple | None:
        """The next message, or None after ``timeout`` seconds. Raises `WorkerLost` when the worker is gone."""
        conn = self._from
        if conn is None:
            raise WorkerLost("the solver worker is not running")
        try:
            if not wait([conn], timeout):
                if not self.alive:
                    raise WorkerLost(f"the solver worker exited (code {self.proc.returncode})")
                return None
            return conn.recv()
        except (EOFError, OSError):
            code = None
            if self.proc is not None:
                try:
                    code = self.proc.wait(timeout=1.0)
                except Exception:  # still running with a broken pipe: the caller kills it
                    code = self.proc.poll()
            raise WorkerLost(f"the solver worker exited (code {code})") from None

    def probe(self, timeout: float = 10.0) -> dict:
        """Ask an idle worker what it has imported (see `probe`)."""
        self.send(("probe",))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self.recv(left)
            if msg is not None and msg[0] == "probe":
                return msg[1]
        raise WorkerLost("the solver worker did not answer the probe")


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
