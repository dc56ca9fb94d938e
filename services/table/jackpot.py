"""The progressive jackpot pool as the table sees it: the wallet's ``jackpot_pool`` account.

The pool is one wallet system account shared by every table with jackpot side
bets. Contributions (a share of every jackpot stake) and payouts (a four of a
kind wins the pool) are transfers in the round settlements the wallet applies
from Kafka, so the wallet's balance always lags the settlements the table has
already published. Two consequences, and what this module does about them:

* A round that pays from the pool must not pay what another round already
  claimed. If table A publishes a payout of the whole pool and table B settles
  before the wallet has applied A's settlement, B would read the same balance
  and pay it again: the pool, which the wallet lets go negative like every
  system account, would end below zero. So every settlement that pays from the
  pool runs under one lock (``LOCK TABLE jackpot_claims``, held until its
  transaction commits, shared by every table process of the deployment since
  they share the table database) and pays at most

      payable = max(0, wallet balance - payouts published but not yet applied)

  plus its own round's contributions. The claim (the settlement's net change of
  the pool) is recorded in the same transaction as the RoundSettled event and
  stays "in flight" until the wallet reports the round applied.
* The wallet is never called under that lock (nor in any transaction): a slow
  wallet must not hold up every other table's settlement. So the pool is read
  first (``observe``), outside any transaction: the in-flight claims, then the
  wallet's status of each, then the balance (statuses *before* the balance: a
  claim the wallet applies in between is subtracted twice, the pool pays less
  this time, never zero times). Under the lock (``lock_and_read``) the claims
  observed applied are marked so, and every claim still in flight in the
  database is subtracted: claims published since the observation are counted
  whether the wallet has applied them or not (errs low). One case would err
  high: a claim another process marked applied after this observation, whose
  payout the balance read may not include. It is detected by counting the
  applied claims (they are never unmarked nor deleted, and every write to the
  table waits for the lock): if more are applied than before the observation
  plus the ones it observed, the reading is stale and the settlement is tried
  again with a new one (``with_reading``). A settlement the wallet rejected
  stays counted: nothing can say it will not be applied later, and counting it
  only ever pays less.
* Contributions of other tables' rounds that the wallet has not applied yet are
  not in the balance read: a winner gets the pool as the wallet knows it at that
  moment, and those contributions stay in the pool for the next winner.

Hence the pool never goes negative through settlements: every bound errs only
low. Operators can still withdraw from ``jackpot_pool`` through the wallet (it
allows that for system accounts); ``GetJackpot`` shows what is payable before
they do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from backbone.errors import Unavailable
from bull.money import JACKPOT_POOL
from services.table.ports import WalletPort

APPLIED = "settled"
# A few in-flight claims at most: payouts need a four of a kind and the wallet applies within seconds.
MAX_CLAIMS_REFRESHED = 1_000
# Readings a settlement may go through before it gives up for this step (each one is stale only if
# another settlement marked a claim applied in the few milliseconds between reading and locking).
MAX_READINGS = 5

T = TypeVar("T")


class PoolReadingNeeded(Exception):
    """The settlement pays from the pool and has no (fresh) reading: roll back, observe, try again."""


@dataclass(frozen=True, slots=True)
class PoolReading:
    """What ``observe`` saw outside any transaction, in this order: the database, the wallet's statuses, the balance."""

    applied_before: int  # claims marked applied in the database when it was read
    observed_applied: tuple[str, ...]  # in-flight claims the wallet then reported applied
    balance_minor: int  # the pool's balance, read after the statuses


@dataclass(frozen=True, slots=True)
class PoolView:
    balance_minor: int
    in_flight_minor: int

    @property
    def payable_minor(self) -> int:
        return max(0, self.balance_minor - self.in_flight_minor)


class JackpotPool:
    def __init__(self, wallet: WalletPort) -> None:
        self._wallet = wallet

    async def observe(self, pool: AsyncConnectionPool) -> PoolReading:
        """Outside any transaction: the in-flight claims, which of them the wallet has applied, then the balance."""
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM jackpot_claims WHERE status = 'applied'), array(SELECT round_id"
                " FROM jackpot_claims WHERE status = 'in_flight' ORDER BY claimed_at LIMIT %s)",
                (MAX_CLAIMS_REFRESHED,),
            )
            row = await cur.fetchone()
            await conn.rollback()  # nothing was written; no snapshot or lock is kept over the wallet's calls
        assert row is not None
        applied_before, in_flight = int(row[0]), list(row[1])
        observed = tuple([r for r in in_flight if await self._wallet.settlement_status(r) == APPLIED])
        balance = await self._wallet.balance_minor(JACKPOT_POOL)  # after the statuses: see the module docstring
        return PoolReading(applied_before, observed, balance)

    async def with_reading(self, pool: AsyncConnectionPool, attempt: Callable[[PoolReading | None], Awaitable[T]]) -> T:
        """Run ``attempt`` (a transaction) without a reading; if it needs one (``PoolReadingNeeded``), observe
        the pool outside it and run it again, at most ``MAX_READINGS`` times."""
        reading: PoolReading | None = None
        for _ in range(MAX_READINGS + 1):
            try:
                return await attempt(reading)
            except PoolReadingNeeded:
                reading = await self.observe(pool)
        raise Unavailable("JACKPOT_POOL_BUSY", "the jackpot pool kept changing while it was read; try again")

    async def lock_and_read(self, conn: psycopg.AsyncConnection, reading: PoolReading | None) -> PoolView:
        """In the settling transaction: serialize pool claims, then what the pool can pay (``PoolReadingNeeded``
        when ``reading`` is None or stale: the caller rolls back and tries again with a new one)."""
        if reading is None:
            raise PoolReadingNeeded()
        await conn.execute("LOCK TABLE jackpot_claims IN SHARE ROW EXCLUSIVE MODE")
        return await self.apply(conn, reading)

    async def read(self, pool: AsyncConnectionPool) -> PoolView:
        """What the pool can pay now (GetJackpot): observed outside any transaction, then recorded in a short one."""

        async def attempt(reading: PoolReading | None) -> PoolView:
            if reading is None:
                raise PoolReadingNeeded()
            async with pool.connection() as conn, conn.transaction():
                return await self.apply(conn, reading)

        return await self.with_reading(pool, attempt)

    async def apply(self, conn: psycopg.AsyncConnection, reading: PoolReading) -> PoolView:
        """Mark the claims observed applied; the view of the pool, or ``PoolReadingNeeded`` if the reading is stale."""
        if reading.observed_applied:
            observed = list(reading.observed_applied)
            await conn.execute("UPDATE jackpot_claims SET status = 'applied' WHERE round_id = ANY(%s)", (observed,))
        # Summed over every claim still in flight, observed or not, so the bound only ever errs low.
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'applied'),"
            " coalesce(sum(-pool_delta_minor) FILTER (WHERE status = 'in_flight'), 0) FROM jackpot_claims"
        )
        row = await cur.fetchone()
        assert row is not None
        applied, in_flight = int(row[0]), int(row[1])
        if applied != reading.applied_before + len(reading.observed_applied):
            raise PoolReadingNeeded()  # another process marked a claim applied since: the balance may predate it
        return PoolView(reading.balance_minor, in_flight)

    async def record_claim(
        self, conn: psycopg.AsyncConnection, table_id: str, round_id: str, pool_delta_minor: int, view: PoolView
    ) -> None:
        """Record a settlement that takes money out of the pool (in the transaction that publishes it)."""
        if pool_delta_minor >= 0:
            return  # the round's contributions covered its payouts: nothing to keep other rounds from paying
        assert -pool_delta_minor <= view.payable_minor, "a settlement pays more than the pool can"
        await conn.execute(
            "INSERT INTO jackpot_claims (round_id, table_id, pool_delta_minor, payable_minor) VALUES (%s, %s, %s, %s)",
            (round_id, table_id, pool_delta_minor, view.payable_minor),
        )
