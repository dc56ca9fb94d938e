"""One ``Variant`` object per game, and the one registry of them.

The table, the CLI, the ledger's recompute and the auditor tools find a game
here by its id. Each variant's module holds its table settings, its deal, its
reveal plan and its settlement including who funds what (``bull/variants/base.py``
describes the protocol). Pure: nothing here does I/O, reads a clock or draws
randomness.
"""

from __future__ import annotations

from bull.rules.config import ConfigError
from bull.variants.bai_buu import BAI_BUU
from bull.variants.baibian_bull import BAIBIAN_BULL
from bull.variants.base import (
    WHOLE_HAND,
    DealInput,
    EnvelopeSplit,
    Funding,
    RoundShape,
    SeatHand,
    TableBet,
    Variant,
    decimal_text,
)
from bull.variants.golden_bull import GOLDEN_BULL
from bull.variants.red_envelope_bull import RED_ENVELOPE_BULL

VARIANTS: dict[str, Variant] = {v.variant_id: v for v in (GOLDEN_BULL, BAI_BUU, BAIBIAN_BULL, RED_ENVELOPE_BULL)}


class UnknownVariant(ValueError):
    pass


def get(variant_id: str) -> Variant:
    """The variant of ``variant_id``; UnknownVariant (a ValueError) names the known ones."""
    variant = VARIANTS.get(variant_id)
    if variant is None:
        raise UnknownVariant(f"variant must be one of {', '.join(sorted(VARIANTS))}")
    return variant


__all__ = [
    "VARIANTS",
    "WHOLE_HAND",
    "ConfigError",
    "DealInput",
    "EnvelopeSplit",
    "Funding",
    "RoundShape",
    "SeatHand",
    "TableBet",
    "UnknownVariant",
    "Variant",
    "decimal_text",
    "get",
]
