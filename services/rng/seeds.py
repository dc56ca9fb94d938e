"""The rng service's one source of randomness: fresh server seeds from the OS CSPRNG.

Everything derived from a seed (deck orders, envelope splits) is the pure,
published function in ``bull.fairness``; only the seed itself is random.
"""

from __future__ import annotations

import secrets

from bull.fairness import SEED_BYTES


def new_server_seed() -> bytes:
    """A fresh 32-byte server seed from the OS CSPRNG."""
    return secrets.token_bytes(SEED_BYTES)
