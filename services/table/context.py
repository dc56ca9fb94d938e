"""What every part of the table application is given: its stores, the ports, the clock, the wake-up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.table.banker_store import BankerStore
from services.table.envelope_store import EnvelopeStore
from services.table.ports import RngPort, WalletPort
from services.table.store import TableStore


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class TableContext:
    store: TableStore
    wallet: WalletPort
    rng: RngPort
    clock: Callable[[], datetime] = utc_now
    notify: Callable[[str, bool], Any] | None = None
    """``notify(table_id, stepped)``: announce a move of the table; ``stepped`` when its round runner made it."""
    # Pauses between retries of another service; tests pass one that does not wait.
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    envelopes: EnvelopeStore = field(init=False)
    bankers: BankerStore = field(init=False)

    def __post_init__(self) -> None:
        self.envelopes = EnvelopeStore(self.store)
        self.bankers = BankerStore(self.store)

    def now(self) -> datetime:
        return self.clock()

    def wake(self, table_id: str, *, stepped: bool = False) -> None:
        """Tell watchers the table moved, and its round runner unless the move is the runner's own step
        (``stepped``: it steps again when that step said, with no need to be woken)."""
        if self.notify is not None:
            self.notify(table_id, stepped)
