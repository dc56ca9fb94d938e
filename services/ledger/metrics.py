"""The ledger's Prometheus series."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

IMBALANCE_MINOR = Gauge(
    "niuniu_ledger_imbalance_minor",
    "Total debits minus total credits over every journal balance; anything but 0 is a bug.",
)
ENTRIES_JOURNALED = Counter("niuniu_ledger_entries_journaled_total", "Balanced journal entries written.")
REJECTS = Counter(
    "niuniu_ledger_rejects_total", "Movements refused by the journal (unbalanced or malformed).", ["reason"]
)
