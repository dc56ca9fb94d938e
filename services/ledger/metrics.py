"""The ledger's Prometheus series."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

IMBALANCE_MINOR = Gauge(
    "niuniu_ledger_imbalance_minor",
    "Total debits minus total credits over every journal balance; anything but 0 is a bug.",
)
JOURNAL_REJECTS = Gauge(
    "niuniu_ledger_journal_rejects",
    "Movements refused by the journal and kept in journal_rejects (append-only, by the imbalance watch): a latch, "
    "across restarts and replicas, that only rebuilding the journal from corrected events clears.",
)
ENTRIES_JOURNALED = Counter("niuniu_ledger_entries_journaled_total", "Balanced journal entries written.")
REJECTS = Counter(
    "niuniu_ledger_rejects_total", "Movements refused by the journal (unbalanced or malformed).", ["reason"]
)
