"""The wallet's Prometheus metrics (niuniu_wallet_*)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

HOLDS_OPEN = Gauge("niuniu_wallet_holds_open", "Holds placed and not yet posted, voided or expired.")
OLDEST_OPEN_HOLD_SECONDS = Gauge(
    "niuniu_wallet_oldest_open_hold_age_seconds", "Age of the oldest open hold (0 when none), by the sweeper."
)
HOLD_AGE_SECONDS = Histogram(
    "niuniu_wallet_hold_age_seconds",
    "Time from placing a hold to its resolution (post, void, expiry or settlement).",
    buckets=(0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 900, 3600, 4 * 3600, 24 * 3600),
)
HOLDS_PLACED = Counter("niuniu_wallet_holds_placed_total", "Holds placed.")
HOLDS_REFUSED = Counter(
    "niuniu_wallet_holds_refused_total",
    "Holds refused, by reason (INSUFFICIENT_FUNDS ...), asked alone or in a PlaceHolds call, where a"
    " refusal is an outcome of the call and not its gRPC status.",
    ["reason"],
)
HOLD_GROUP_SIZE = Histogram(
    "niuniu_wallet_hold_group_size",
    "PlaceHold calls decided and saved together in one transaction (group commit).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
HOLDS_RESIZED = Counter(
    "niuniu_wallet_holds_resized_total",
    "Open holds resized by ResizeHold, by direction (up, down, same); repeats are not counted.",
    ["direction"],
)
HOLDS_POSTED = Counter("niuniu_wallet_holds_posted_total", "Holds posted (all or part), by PostHold or a settlement.")
HOLDS_VOIDED = Counter("niuniu_wallet_holds_voided_total", "Holds released whole, by VoidHold or a settlement.")
HOLDS_EXPIRED = Counter("niuniu_wallet_holds_expired_total", "Holds released by the sweeper at their expiry.")
SETTLEMENTS_APPLIED = Counter(
    "niuniu_wallet_settlements_applied_total", "Round settlements applied, by outcome (settled, voided).", ["outcome"]
)
SETTLEMENTS_REJECTED = Counter(
    "niuniu_wallet_settlements_rejected_total",
    "Round settlements refused (nothing applied), by reason. Any increase needs an operator.",
    ["reason"],
)
ROUNDS_REJECTED = Gauge(
    "niuniu_wallet_rounds_rejected",
    "Rounds whose settlement was refused and that no operator has resolved yet (from the database, by the "
    "sweeper): a latch, across restarts and replicas, that only a repair (void-round) or a re-sent settlement clears.",
)
SETTLEMENTS_DUPLICATE = Counter(
    "niuniu_wallet_settlements_duplicate_total", "Re-emitted settlements of an already applied round (ignored)."
)
SWEEPER_FAILURES = Counter("niuniu_wallet_sweeper_failures_total", "Hold sweeps that failed (retried).")

SETTLEMENT_LAG_SECONDS = Histogram(
    "niuniu_wallet_settlement_lag_seconds",
    "From a round's settlement event (right after its last reveal) to the wallet applying its movements.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
