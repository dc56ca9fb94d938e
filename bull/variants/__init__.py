"""One ``Variant`` object per game, and the one registry of them.

The table, the CLI, the ledger's recompute and the auditor tools find a game
here by its id. Each variant's module holds its table settings, its deal, its
reveal plan and its settlement including who funds what (``bull/variants/base.py``
describes the protocol). Pure: nothing here does I/O, reads a clock or draws
randomness.
"""

from __future__ import annotations

from typing import Any

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

VARIANTS: dict[str, Variant[Any]] = {v.variant_id: v for v in (GOLDEN_BULL, BAI_BUU, BAIBIAN_BULL, RED_ENVELOPE_BULL)}
"""Every variant by its id.

A ``Variant[Any]``: the registry holds games of different configurations, and
which one a lookup returns is known only from the id at run time, so no one
type parameter is true of them all. Each variant's own module types it by its
configuration (``GOLDEN_BULL`` is a ``Variant[GoldenBullConfig]``) and mypy
checks every method against it there. What mypy cannot check across a lookup
is left to the caller: pass a variant only the configuration its own
``parse_config`` returned (the table keeps the two together per round).
"""


class UnknownVariant(ValueError):
    pass


def get(variant_id: str) -> Variant[Any]:
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
