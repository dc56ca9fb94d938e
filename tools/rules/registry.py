"""The analysis adapter of each variant in ``bull.variants``, the one registry of games.

The CLI and the report generator resolve a variant id through ``bull.variants``
(its ids, its ``UnknownVariant`` error) and find that variant's adapter here.
``ADAPTERS`` must cover exactly ``bull.variants.VARIANTS``: importing this module
fails otherwise, so a game added to ``bull.variants`` without its analysis (or an
adapter left behind for a game that was removed) stops the CLI and its tests.

To add a variant's analysis, implement ``adapter.VariantAdapter`` in a module
beside this one and add its adapter to ``ADAPTERS``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from bull import variants
from tools.rules.adapter import VariantAdapter
from tools.rules.bai_buu_adapter import BAI_BUU
from tools.rules.baibian_adapter import BAIBIAN_BULL
from tools.rules.golden_adapter import GOLDEN_BULL
from tools.rules.red_envelope_adapter import RED_ENVELOPE_BULL

ADAPTERS: Mapping[str, VariantAdapter] = {
    adapter.variant_id: adapter for adapter in (GOLDEN_BULL, BAIBIAN_BULL, BAI_BUU, RED_ENVELOPE_BULL)
}


def check_coverage(adapter_ids: Collection[str], variant_ids: Collection[str]) -> None:
    """Raise ``LookupError`` unless every variant has exactly one adapter and every adapter a variant."""
    missing = sorted(set(variant_ids) - set(adapter_ids))
    extra = sorted(set(adapter_ids) - set(variant_ids))
    if missing or extra:
        raise LookupError(f"analysis adapters must match bull.variants: without one {missing}, unknown {extra}")


check_coverage(ADAPTERS, variants.VARIANTS)


def get(variant_id: str) -> VariantAdapter:
    """The adapter of ``bull.variants``' variant ``variant_id``; an unknown id raises its ``UnknownVariant``."""
    return ADAPTERS[variants.get(variant_id).variant_id]
