"""Cache keys for simulator results (``results/cache/``).

A key hashes the experiment's configuration together with a fingerprint of the code that produces the numbers
(the `solvers` package and the synthetic routing), so a changed solver never re-plots stale results.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

__all__ = ["code_fingerprint", "cache_key"]

_ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 of the sources whose behaviour the cached numbers depend on."""
    h = hashlib.sha256()
    files = sorted((_ROOT / "solvers").glob("*.py")) + sorted((_ROOT / "tempo_jax" / "workloads").glob("*.py"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(kind: str, payload: dict) -> str:
    """16-hex key of ``payload`` (JSON-able) for result kind ``kind``, tied to `code_fingerprint`."""
    blob = json.dumps({"kind": kind, "code": code_fingerprint(), **payload}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
