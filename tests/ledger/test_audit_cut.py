"""The audit's cut: it replays a wallet snapshot only once the wallet says every event up to the snapshot's
position is in Kafka. Pure: a wallet that reports its watermark, no infrastructure."""

from __future__ import annotations

import pytest

from backbone.topics import Topics
from services.ledger import audit_replay
from services.ledger.audit_config import AuditConfig, AuditError
from services.ledger.reconcile import WalletBalance


class Watermarks:
    """A wallet whose relays publish one more event each time it is asked (up to ``stops_at``)."""

    def __init__(self, start: int, stops_at: int) -> None:
        self.below = start
        self.stops_at = stops_at
        self.asked = 0

    async def balances(self) -> dict[str, WalletBalance]:
        return {}

    async def published_below(self) -> int:
        self.asked += 1
        below, self.below = self.below, min(self.below + 1, self.stops_at)
        return below


def config(timeout_s: float) -> AuditConfig:
    # An unreachable Kafka: the wallet's watermark alone must decide.
    return AuditConfig("", "127.0.0.1:1", Topics("cut."), "ledger", "replay", cut_timeout_s=timeout_s)


async def test_the_audit_waits_until_the_wallet_has_published_past_its_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_replay, "CUT_POLL_S", 0.0)
    wallet = Watermarks(start=16, stops_at=100)
    await audit_replay._wait_for_cut(config(30), 18, None, wallet)
    assert wallet.asked == 4  # 16, 17 and 18 are not past position 18; 19 is: every event up to 18 is in Kafka


async def test_a_wallet_that_stops_publishing_before_the_snapshot_fails_the_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_replay, "CUT_POLL_S", 0.01)
    with pytest.raises(AuditError, match="published its events below position 18 only"):
        await audit_replay._wait_for_cut(config(0.2), 18, None, Watermarks(start=17, stops_at=18))
