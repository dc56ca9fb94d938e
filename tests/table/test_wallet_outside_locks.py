"""No call to the wallet while the table's transaction holds a lock: every wait stays bounded.

A slow or stopped wallet must not keep a table's rows, the banker seat or the jackpot
claims locked. The wallet double here asks PostgreSQL, from a connection of its own, at
every call, which locks on the test's own schema are granted beyond ``AccessShareLock``
(every read takes that one; a row lock, a write or ``LOCK TABLE`` takes more). The rig
runs one command at a time, so any such lock at the moment of a call is held by the
transaction the call was made from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import psycopg
import pytest
from niuniu.table.v1 import events_pb2 as ev
from psycopg_pool import AsyncConnectionPool

from backbone.errors import FailedPrecondition
from bull import fairness as fair
from bull.money import JACKPOT_POOL
from services.table.common import Phase, scoped_id
from services.table.jackpot import JackpotPool, PoolReading, PoolReadingNeeded, PoolView
from tests.table.table_fakes import FakeRng, FakeWallet
from tests.table.table_rig import Rig, player, setup_schema
from tests.table.test_rounds import four_kings_for_player_01

LOCKS_HELD = """
SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.locktype = 'relation' AND l.granted AND l.mode <> 'AccessShareLock' AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND c.relnamespace = to_regnamespace(%s)
ORDER BY 1, 2
"""

BALANCES = {f"player:p{i}": 10_000_000 for i in range(6)} | {"house": 0, JACKPOT_POOL: 50_000}


class LockWatchingWallet(FakeWallet):
    """The fake wallet, which notes every call made while the test's schema has a lock granted."""

    def __init__(self, balances: Mapping[str, int], watcher: psycopg.AsyncConnection[Any], schema: str) -> None:
        super().__init__(dict(balances))
        self._watcher = watcher
        self._schema = schema
        self.calls: Counter[str] = Counter()
        self.under_lock: list[tuple[str, list[tuple[str, str]]]] = []
        self.after_hold: dict[str, Callable[[], Awaitable[Any]]] = {}  # bet.<bet id> -> what happens meanwhile

    async def _watch(self, call: str) -> None:
        self.calls[call] += 1
        cur = await self._watcher.execute(LOCKS_HELD, (self._schema,))
        locks = [(str(name), str(mode)) for name, mode in await cur.fetchall()]
        if locks:
            self.under_lock.append((call, locks))

    async def place_hold(
        self, hold_id: str, account: str, amount_minor: int, reason: str, round_id: str, expires_at_unix_ms: int
    ) -> None:
        await self._watch("place_hold")
        await super().place_hold(hold_id, account, amount_minor, reason, round_id, expires_at_unix_ms)
        meanwhile = self.after_hold.pop(hold_id.rsplit(".", 1)[0], None)
        if meanwhile is not None:
            await meanwhile()

    async def void_hold(self, hold_id: str) -> None:
        await self._watch("void_hold")
        await super().void_hold(hold_id)

    async def resize_hold(self, resize_id: str, hold_id: str, amount_minor: int, expected_minor: int) -> None:
        await self._watch("resize_hold")
        await super().resize_hold(resize_id, hold_id, amount_minor, expected_minor)

    async def balance_minor(self, account: str) -> int:
        await self._watch("balance_minor")
        return await super().balance_minor(account)

    async def settlement_status(self, round_id: str) -> str | None:
        await self._watch("settlement_status")
        return await super().settlement_status(round_id)


@pytest.fixture
async def watched(pool: AsyncConnectionPool, dsn: str, schema: str) -> AsyncIterator[tuple[Rig, LockWatchingWallet]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher:
        rig = Rig(pool, await setup_schema(pool), BALANCES)
        wallet = LockWatchingWallet(BALANCES, watcher, schema)
        rig.wallet, rig.rng = wallet, FakeRng(wallet)
        rig.app = rig.build()
        rig.initial_total = wallet.total_minor()
        yield rig, wallet


def bet_hold(who: str, command_id: str) -> str:
    """A bet's hold id without its attempt (``bet.<bet id>``)."""
    return f"bet.{scoped_id(f'player:{who}', command_id)}"


async def test_the_watcher_sees_a_lock_held_by_an_open_transaction(
    watched: tuple[Rig, LockWatchingWallet], pool: AsyncConnectionPool
) -> None:
    """The check itself can fail: a wallet call from inside a transaction that locked a row is noted."""
    rig, wallet = watched
    await rig.create("w", "golden_bull")
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM tables WHERE table_id = 'w' FOR UPDATE")
        await wallet.balance_minor("player:p0")
    ((call, locks),) = wallet.under_lock
    assert call == "balance_minor" and ("tables", "RowShareLock") in locks


async def test_a_banked_table_calls_the_wallet_outside_its_transactions(
    watched: tuple[Rig, LockWatchingWallet],
) -> None:
    """Applying to bank, seating through a queue of players who cannot bank any more, a bet the
    table cap refuses after the wallet held it, settling and the next opening: no call under a lock."""
    rig, wallet = watched
    await rig.create("bn", "baibian_bull", {"banker.min_capital_minor": "100000", "banker.session_rounds": "1"})
    for who in ("p5", "p4", "p2", "p1", "p3"):  # p5 banks first; the others queue in this order
        await rig.app.banker.apply(player(who), "bn", 1_000_000)
    first = await rig.to_phase("bn", Phase.BETTING)
    await rig.app.place_bet(player("p0"), "b0", "bn", "heaven", 50_000)
    # While the wallet holds p3's bet, p0's second bet takes the room under the cap (capital / 10 = 100 000).
    wallet.after_hold[bet_hold("p3", "b3")] = lambda: rig.app.place_bet(player("p0"), "b0b", "bn", "earth", 30_000)
    with pytest.raises(FailedPrecondition, match="TABLE_CAP_REACHED"):
        await rig.app.place_bet(player("p3"), "b3", "bn", "yellow", 40_000)
    assert [h.status for h in wallet.bet_holds(scoped_id("player:p3", "b3"))] == ["voided"]  # the bet rolled back
    assert {b["bet_id"] for b in await rig.app.round_bets(first["round_id"])} == {
        scoped_id("player:p0", "b0"),
        scoped_id("player:p0", "b0b"),
    }
    for broke in ("player:p4", "player:p2", "player:p1"):  # they spent their balance since they applied
        wallet.available["house"] += wallet.available[broke] - 10
        wallet.available[broke] = 10
    assert (await rig.finish("bn"))["phase"] == Phase.SETTLED
    second = await rig.next_round("bn")
    assert second["round_id"] != first["round_id"]
    events = await rig.round_events(second["round_id"])
    withdrew = [e.unpack(ev.BankerWithdrew()) for e in events["table.banker_withdrew"]]
    assert [(w.player, w.cause) for w in withdrew] == [
        (f"player:{who}", "capital_below_minimum") for who in ("p4", "p2", "p1")
    ]
    assert [e.unpack(ev.BankerSeated()).player for e in events["table.banker_seated"]] == ["player:p3"]
    queue = await rig.app.banker.queue("bn")
    assert (queue.banker, list(queue.queue)) == ("player:p3", [])
    assert (await rig.finish("bn"))["phase"] == Phase.SETTLED
    assert wallet.calls["balance_minor"] >= 6 and wallet.calls["void_hold"] >= 1
    assert wallet.calls["settlement_status"] >= 1 and wallet.calls["place_hold"] >= 4
    assert wallet.under_lock == []
    assert rig.conserved() and rig.open_holds() == []


async def test_a_jackpot_payout_reads_the_pool_outside_its_transaction(watched: tuple[Rig, LockWatchingWallet]) -> None:
    """A bai buu four of a kind pays from the pool what it can, another table's claim in flight
    subtracted; the statuses and the balance are read before the claims are locked."""
    rig, wallet = watched
    async with rig.pool.connection() as conn, conn.transaction():  # another table's payout, not yet applied
        await JackpotPool(wallet).record_claim(conn, "other", "other-r1", -10_000, PoolView(50_000, 0))
    await rig.create("bb", "bai_buu", {"jackpot.stake_minor": "100"})
    current = await rig.to_phase("bb", Phase.BETTING)
    deck = fair.shuffle(b"x" * 32, "any", "", 52)
    kings = [c.code for c in deck if c.rank == 13]
    rest = [c.code for c in deck if c.rank != 13]
    rig.rng.forced_decks[current["round_id"]] = await four_kings_for_player_01(kings, rest)
    await rig.app.place_bet(player("p0"), "j1", "bb", "jackpot_player_01", 100)
    assert (await rig.finish("bb"))["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    assert any(t.payer == JACKPOT_POOL and t.payee == "player:p0" for t in settled.transfers)
    async with rig.pool.connection() as conn:
        cur = await conn.execute("SELECT payable_minor FROM jackpot_claims WHERE round_id = %s", (current["round_id"],))
        row = await cur.fetchone()
    assert row is not None and row[0] == 40_000  # 50 000 in the pool, 10 000 of it claimed by the other table
    assert wallet.calls["settlement_status"] >= 1 and wallet.calls["balance_minor"] >= 1
    view = await rig.app.jackpot.read(rig.pool)  # GetJackpot: the round applied, the other claim still in flight
    assert view.in_flight_minor == 10_000 and view.balance_minor == wallet.available[JACKPOT_POOL]
    assert wallet.under_lock == []
    assert rig.conserved() and rig.open_holds() == []


async def locked_read(pool: AsyncConnectionPool, jackpot: JackpotPool, reading: PoolReading | None) -> PoolView:
    async with pool.connection() as conn, conn.transaction():
        return await jackpot.lock_and_read(conn, reading)


async def test_a_reading_older_than_a_claim_marked_applied_elsewhere_is_read_again(pool: AsyncConnectionPool) -> None:
    """The pool errs only low: a reading whose balance predates a payout another process has since
    marked applied would pay that payout again; it is refused and the settlement reads anew."""
    await setup_schema(pool)
    wallet = FakeWallet({JACKPOT_POOL: 50_000})
    jackpot = JackpotPool(wallet)
    async with pool.connection() as conn, conn.transaction():
        await jackpot.record_claim(conn, "t", "t-r1", -20_000, PoolView(50_000, 0))
    old = await jackpot.observe(pool)
    assert (old.observed_applied, old.balance_minor) == ((), 50_000)
    wallet.applied["t-r1"] = "settled"  # the wallet applies the payout ...
    wallet.available[JACKPOT_POOL] -= 20_000
    assert (await jackpot.read(pool)).in_flight_minor == 0  # ... and another process marks it applied
    with pytest.raises(PoolReadingNeeded):
        await locked_read(pool, jackpot, old)  # 50 000 payable would pay t-r1's 20 000 twice
    assert (await jackpot.with_reading(pool, lambda r: locked_read(pool, jackpot, r))).payable_minor == 30_000
    # A claim published after the reading counts as in flight, applied or not: 30 000 - 5 000.
    fresh = await jackpot.observe(pool)
    async with pool.connection() as conn, conn.transaction():
        await jackpot.record_claim(conn, "t", "t-r2", -5_000, PoolView(30_000, 0))
    assert (await locked_read(pool, jackpot, fresh)).payable_minor == 25_000
    with pytest.raises(PoolReadingNeeded):
        await locked_read(pool, jackpot, None)  # a settlement without a reading never reads the wallet itself
