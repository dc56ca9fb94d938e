"""The rng service's one source of randomness: fresh server seeds from the OS CSPRNG.

Everything derived from a seed (deck orders, envelope splits, the keys of the
sealed audit records) is the pure, published function in ``bull.fairness``; only
the seed itself, and the nonce of each sealed record, are random.
"""

from __future__ import annotations

import secrets

from bull.fairness import SEAL_NONCE_BYTES, SEED_BYTES


def new_server_seed() -> bytes:
    """A fresh 32-byte server seed from the OS CSPRNG."""
    return secrets.token_bytes(SEED_BYTES)


def new_seal_nonce() -> bytes:
    """A fresh 12-byte AES-GCM nonce for one sealed audit record (docs/fairness.md, section 11)."""
    return secrets.token_bytes(SEAL_NONCE_BYTES)
