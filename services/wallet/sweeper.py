"""The hold sweeper: releases holds past their expiry and keeps the hold gauges current.

Runs on every replica; each expiry locks its account and hold and re-checks the hold
is still open, so two sweepers (or a sweep racing a post) resolve a hold once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from services.wallet import metrics
from services.wallet.app import WalletApp

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0


async def sweep_forever(app: WalletApp, stop: asyncio.Event, interval_s: float = SWEEP_INTERVAL_S) -> None:
    while not stop.is_set():
        try:
            expired = await app.expire_due()
            if expired:
                log.info("holds expired", extra={"count": expired})
            await app.refresh_hold_gauges()
        except Exception:
            metrics.SWEEPER_FAILURES.inc()
            log.exception("hold sweep failed; retrying")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
