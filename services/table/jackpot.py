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
  stays "in flight" until the wallet reports the round applied. The statuses are
  refreshed *before* the balance is read, so a claim the wallet applies in
  between is subtracted twice (the pool pays less this time), never zero times.
  A settlement the wallet rejected stays counted: nothing can say it will not be
  applied later, and counting it only ever pays less.
* Contributions of other tables' rounds that the wallet has not applied yet are
  not in the balance read: a winner gets the pool as the wallet knows it at that
  moment, and those contributions stay in the pool for the next winner.

Hence the pool never goes negative through settlements. Operators can still
withdraw from ``jackpot_pool`` through the wallet (it allows that for system
accounts); ``GetJackpot`` shows what is payable before they do.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from bull.money import JACKPOT_POOL
from services.table.ports import WalletPort

APPLIED = "settled"
# A few in-flight claims at most: payouts need a four of a kind and the wallet applies within seconds.
MAX_CLAIMS_REFRESHED = 1_000


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

    async def lock_and_read(self, conn: psycopg.AsyncConnection) -> PoolView:
        """In the settling transaction: serialize pool claims, then read what the pool can pay."""
        await conn.execute("LOCK TABLE jackpot_claims IN SHARE ROW EXCLUSIVE MODE")
        return await self.read(conn)

    async def read(self, conn: psycopg.AsyncConnection) -> PoolView:
        in_flight = await self._refresh(conn)
        balance = await self._wallet.balance_minor(JACKPOT_POOL)  # after the refresh: see the module docstring
        return PoolView(balance, in_flight)

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

    async def _refresh(self, conn: psycopg.AsyncConnection) -> int:
        """Mark the claims the wallet has applied; return the sum of the payouts still in flight."""
        cur = await conn.execute(
            "SELECT round_id FROM jackpot_claims WHERE status = 'in_flight' ORDER BY claimed_at LIMIT %s",
            (MAX_CLAIMS_REFRESHED,),
        )
        for (round_id,) in await cur.fetchall():
            if await self._wallet.settlement_status(round_id) == APPLIED:
                await conn.execute("UPDATE jackpot_claims SET status = 'applied' WHERE round_id = %s", (round_id,))
        # Summed over every claim still in flight, refreshed or not, so the bound only ever errs low.
        cur = await conn.execute(
            "SELECT coalesce(sum(-pool_delta_minor), 0) FROM jackpot_claims WHERE status = 'in_flight'"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0
