"""Counting XLA compilations (jax's own monitoring event of every backend compile)."""

import contextlib

import jax

_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compiles():
    """``with count_compiles() as n: ...``; ``n[0]`` is the number of backend compilations inside the block."""
    n = [0]

    def listener(event, duration, **kwargs):
        if event == _EVENT:
            n[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield n
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
