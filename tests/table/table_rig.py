"""Drive a table in process: the real TableApp and its store (PostgreSQL), fake rng and wallet, a fake clock.

Nothing waits: ``advance`` calls the app's ``step`` and, when it answers "not
before N seconds", moves the clock N seconds. After every step the round
settlements the table published are delivered to the fake wallet (as the
wallet's consumer would from Kafka). ``crash`` throws the app object away and
builds a new one from the same database, as a restarted process would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Principal, Role
from backbone.db import run_ddl
from backbone.eventreads import FAMILY_SCHEMA
from backbone.eventstore import EventStore
from services.ledger.queries import RoundRecord
from services.ledger.recompute import recompute
from services.ledger.verify import Finding, RoundEvidence
from services.table.api import TableServicer
from services.table.app import TableApp
from services.table.common import Phase
from services.table.schema import DDL
from tests.table.table_fakes import FakeClock, FakeRng, FakeWallet

ADMIN = Principal("admin", Role.ADMIN)
MAX_STEPS = 500


def player(name: str) -> Principal:
    return Principal(name, Role.PLAYER)


async def no_sleep(seconds: float) -> None:
    return None


def event_store() -> EventStore:
    return EventStore("table", "test.table.events")


async def setup_schema(pool: AsyncConnectionPool) -> EventStore:
    events = event_store()
    async with pool.connection() as conn:
        await events.setup(conn)
        await run_ddl(conn, (*FAMILY_SCHEMA, *DDL))  # the table's database: the watch's index too
    return events


class Rig:
    def __init__(self, pool: AsyncConnectionPool, events: EventStore, balances: Mapping[str, int]) -> None:
        self.pool = pool
        self.events = events
        self.clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
        self.wallet = FakeWallet(dict(balances))
        self.rng = FakeRng(self.wallet)
        self.app = self.build()
        self.initial_total = self.wallet.total_minor()

    def build(self) -> TableApp:
        return TableApp(self.pool, self.events, self.wallet, self.rng, clock=self.clock, sleep=no_sleep)

    def crash(self) -> None:
        """A new process: nothing survives but the database (and the other services)."""
        self.app = self.build()

    async def create(self, table_id: str, variant: str, config: Mapping[str, str] | None = None, **limits: Any) -> None:
        defaults = {"betting_seconds": 10, "reveal_interval_ms": 500, "pause_between_rounds_ms": 1_000}
        await self.app.create_table(ADMIN, table_id, variant, dict(config or {}), ev.TableLimits(**(defaults | limits)))

    async def step(self, table_id: str) -> float:
        delay = await self.app.step(table_id)
        await self.deliver(table_id)
        return 0.0 if delay is None else delay  # None: the table is closed

    async def deliver(self, table_id: str) -> None:
        """The wallet's consumer: apply every ended round's settlement or void once."""
        for row in await self.app.recent_rounds(table_id, 100):
            if row["phase"] not in Phase.ENDED or row["round_id"] in self.wallet.applied:
                continue
            for event in await self.app.round_events(row["round_id"]):
                if event.event_type == "table.round_settled":
                    settled = ev.RoundSettled()
                    event.unpack(settled)
                    self.wallet.apply_settled(settled)
                elif event.event_type == "table.round_voided":
                    voided = ev.RoundVoided()
                    event.unpack(voided)
                    self.wallet.apply_voided(voided)

    async def current(self, table_id: str) -> dict[str, Any]:
        _, current = await self.app.get_table(table_id)
        assert current is not None
        return current

    async def advance(self, table_id: str, until: Callable[[dict[str, Any]], bool], *, wait: bool = True) -> None:
        """Step (moving the clock when the round waits) until ``until(current round)`` holds."""
        for _ in range(MAX_STEPS):
            _, current = await self.app.get_table(table_id)
            if current is not None and until(current):
                return
            delay = await self.step(table_id)
            if delay > 0 and wait:
                self.clock.advance(delay)
        raise AssertionError(f"table {table_id} did not get there in {MAX_STEPS} steps")

    async def to_phase(self, table_id: str, phase: str) -> dict[str, Any]:
        await self.advance(table_id, lambda r: r["phase"] == phase)
        return await self.current(table_id)

    async def next_round(self, table_id: str, phase: str = Phase.BETTING) -> dict[str, Any]:
        """Play on until a round after the current one is in ``phase``."""
        _, current = await self.app.get_table(table_id)
        seen = current["round_no"] if current else 0
        await self.advance(table_id, lambda r: r["round_no"] > seen and r["phase"] == phase)
        return await self.current(table_id)

    async def finish(self, table_id: str) -> dict[str, Any]:
        """Play the current round to its end and deliver it to the wallet; the ended round."""
        current = await self.current(table_id)
        await self.advance(table_id, lambda r: r["round_id"] != current["round_id"] or r["phase"] in Phase.ENDED)
        await self.deliver(table_id)
        return await self.app.round_row(current["round_id"])

    async def round_events(self, round_id: str) -> dict[str, list[Any]]:
        by_type: dict[str, list[Any]] = {}
        for event in await self.app.round_events(round_id):
            by_type.setdefault(event.event_type, []).append(event)
        return by_type

    async def settled(self, round_id: str) -> ev.RoundSettled:
        (event,) = (await self.round_events(round_id))["table.round_settled"]
        settled = ev.RoundSettled()
        event.unpack(settled)
        return settled

    async def voided(self, round_id: str) -> ev.RoundVoided:
        (event,) = (await self.round_events(round_id))["table.round_voided"]
        voided = ev.RoundVoided()
        event.unpack(voided)
        return voided

    async def audit(self, table_id: str, round_id: str) -> list[Finding]:
        """The ledger's recompute of an ended round from the table's public record (GetRound, as an auditor)."""
        row = await self.app.round_row(round_id)
        if row["server_seed"] is None:
            assert await self.app.reveal_seed(row), "the rng does not reveal the seed"
        servicer = TableServicer(self.app, self.events, AuditorTokens(), None)  # type: ignore[arg-type]
        view = await servicer.GetRound(table_pb2.GetRoundRequest(table_id=table_id, round_id=round_id), None)  # type: ignore[arg-type]
        event = (await self.settled(round_id)) if row["phase"] == Phase.SETTLED else await self.voided(round_id)
        record = RoundRecord(round_id, row["phase"], event.SerializeToString(), (), ())
        return recompute(view, RoundEvidence.of(record))

    def conserved(self) -> bool:
        return self.wallet.total_minor() == self.initial_total

    def open_holds(self) -> list[str]:
        return [hold_id for hold_id, hold in self.wallet.holds.items() if hold.status == "open"]


class AuditorTokens:
    """Stands in for ``Tokens`` in an in-process servicer: every caller is the auditor."""

    def authenticate(self, context: object) -> Principal:
        return Principal("audit", Role.AUDITOR)
