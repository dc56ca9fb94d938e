"""Variant id -> adapter: the one place the CLI (and reports) find a variant.

To add a variant, implement ``VariantAdapter`` in the variant's own module (or a
private ``_<variant>_adapter.py`` beside it) and add one line to ``VARIANTS``.
Adapters translate between text (card codes, ``key=value`` settings) and the
pure rules functions; they return ``CommandResult`` values and never print,
exit, read the clock or draw randomness of their own (a seed comes in), so the
CLI stays a thin shell and every command is testable without a subprocess.

Input errors are raised as ``ValueError`` subclasses: ``cards.CardError`` for a
bad card or hand, ``ConfigError`` for a bad setting (its message names the key).
The CLI turns those into a message on stderr and exit code 2. Anything else is a
bug and is allowed to surface as a traceback.

Adapters import ``CommandResult`` and ``ProgressFn`` from ``_adapter`` and
``ConfigError`` plus the settings parsers from ``bull.rules.config`` (not from this
module, which imports the adapters).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bull.cards import CardError
from bull.rules.config import ConfigError, Settings
from tools.rules._adapter import CommandResult, ProgressFn
from tools.rules._bai_buu_adapter import BAI_BUU
from tools.rules._baibian_adapter import BAIBIAN_BULL
from tools.rules._golden_adapter import GOLDEN_BULL
from tools.rules._red_envelope_adapter import RED_ENVELOPE_BULL

__all__ = [
    "VARIANTS",
    "CardError",
    "CommandResult",
    "ConfigError",
    "ProgressFn",
    "Settings",
    "VariantAdapter",
    "get",
]


class VariantAdapter(Protocol):
    """The operations every variant offers to the CLI.

    ``settings`` is a flat mapping of dotted config keys to raw values (strings
    from ``--set``, or JSON/TOML values); the adapter validates it with its own
    config dataclass and raises ``ConfigError`` naming the bad key.
    """

    @property
    def variant_id(self) -> str:
        """The id used everywhere (``golden_bull``): CLI, config files, protos."""
        ...

    @property
    def title(self) -> str:
        """A human name for report headings."""
        ...

    def eval(self, cards: Sequence[str], settings: Settings) -> CommandResult:
        """Evaluate one hand. ``data`` has at least ``category``, ``points``, ``multiplier``."""
        ...

    def compare(self, hand_a: Sequence[str], hand_b: Sequence[str], settings: Settings) -> CommandResult:
        """Compare two hands. ``data`` has ``winner`` ("a", "b" or "tie") and ``reason``."""
        ...

    def census(self, settings: Settings) -> CommandResult:
        """Count every possible hand by category: ``data`` = ``{"counts": {...}, "total": N}``.

        The CLI adds ``"seconds"`` (wall time) itself.
        """
        ...

    def rtp(self, settings: Settings, *, rounds: int | None, seed: int, progress: ProgressFn | None) -> CommandResult:
        """Return to player of one area bet.

        ``rounds=None`` asks for the exact figure where the variant can enumerate
        it, otherwise a default-sized Monte Carlo; a number asks for a Monte
        Carlo of that many rounds from ``seed``. ``data`` has ``rtp`` (float),
        ``method`` ("exact" or "monte_carlo") and, for Monte Carlo,
        ``ci95`` = [low, high] and ``rounds``; exact results add ``rtp_fraction``.
        """
        ...

    def report(self) -> str:
        """The markdown math report (deterministic: fixed seeds, no timings)."""
        ...


VARIANTS: dict[str, VariantAdapter] = {
    "golden_bull": GOLDEN_BULL,
    "baibian_bull": BAIBIAN_BULL,
    "bai_buu": BAI_BUU,
    "red_envelope_bull": RED_ENVELOPE_BULL,
}


def get(variant_id: str) -> VariantAdapter:
    """The adapter for ``variant_id``; an unknown id is an input error (ValueError)."""
    adapter = VARIANTS.get(variant_id)
    if adapter is None:
        raise ValueError(f"unknown variant {variant_id!r} (known: {', '.join(sorted(VARIANTS))})")
    return adapter
