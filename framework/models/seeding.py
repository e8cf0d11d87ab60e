"""Per-parameter seeds: a parameter's initial values depend only on (seed, its name), so any rank can
fill any shard of it alone, whatever the layout (every family's init_parameter draws from these)."""
from __future__ import annotations

import hashlib


def param_seed(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
