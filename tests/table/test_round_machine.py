"""A Hypothesis state machine over whole tables: random bets, cancels, changes, bids, banker applications,
rng and wallet outages and crashes (the app object rebuilt from the store) between steps.

After every rule: the money in the fake wallet (balances plus holds) is what it
was, no balance is negative, and no hold of an ended round is still open. At the
end every round the table opened has ended settled or voided.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from psycopg import sql

from backbone.db import open_pool
from backbone.errors import DomainError
from bull.money import JACKPOT_POOL
from bull.variants import VARIANTS
from services.table.common import Phase
from tests.table.table_rig import Rig, event_store, player, setup_schema

pytestmark = pytest.mark.integration

PLAYERS = 5
BALANCES = {f"player:p{i}": 3_000_000 for i in range(PLAYERS)} | {"house": 0, JACKPOT_POOL: 20_000}
CONFIGS = {
    "golden_bull": {},
    "bai_buu": {"jackpot.stake_minor": "100"},
    "baibian_bull": {"banker.min_capital_minor": "100000", "banker.session_rounds": "2"},
    "red_envelope_bull": {"bidding.seconds": "3", "bidding.min_minor": "1000", "bidding.increment_minor": "1000"},
}
tables = itertools.count()


class TableMachine(RuleBasedStateMachine):
    dsn = ""
    schema = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.Runner()
        self.pool = self.loop.run(open_pool(self.dsn, schema=self.schema, max_size=4))
        self.rig: Rig | None = None
        self.table_id = f"m{next(tables)}"
        self.variant = ""
        self.bets: list[tuple[str, str]] = []  # (player, bet id)
        self.ids = itertools.count()

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def attempt(self, command: str, coro: Any) -> None:
        """A command a player may send at any moment: refused with a domain error, or done."""
        try:
            self.run(coro)
        except DomainError as refused:
            event(f"{self.variant} {command}: {refused.reason}")
        else:
            event(f"{self.variant} {command}: done")

    @property
    def table(self) -> Rig:
        assert self.rig is not None
        return self.rig

    @initialize(variant=st.sampled_from(sorted(VARIANTS)))
    def open_table(self, variant: str) -> None:
        self.variant = variant
        self.rig = Rig(self.pool, event_store(), BALANCES)  # the schema is set up once per test
        self.run(self.table.create(self.table_id, variant, CONFIGS[variant]))
        self.run(self.table.step(self.table_id))

    # ------------------------------------------------------------------ the table's own steps

    @rule(steps=st.integers(1, 4), wait=st.sampled_from([0.0, 0.3, 1.0]))
    def step(self, steps: int, wait: float) -> None:
        """A few of the table's steps, the clock moving ``wait`` of the time the round waits for."""
        for _ in range(steps):
            delay = self.run(self.table.step(self.table_id))
            if delay > 0:
                self.table.clock.advance(delay * wait)

    @rule(bidding=st.booleans())
    def until(self, bidding: bool) -> None:
        """Let the table run (the clock moving as it waits) until a round takes bets (or bids), for a while at most."""
        phase = Phase.BIDDING if bidding and self.variant == "red_envelope_bull" else Phase.BETTING
        for _ in range(60):
            _, current = self.run(self.table.app.get_table(self.table_id))
            if current is not None and current["phase"] == phase:
                return
            delay = self.run(self.table.step(self.table_id))
            self.table.clock.advance(max(delay, 0))

    @rule()
    def crash(self) -> None:
        self.table.crash()

    @rule(calls=st.integers(1, 30))
    def rng_outage(self, calls: int) -> None:
        self.table.rng.failures = calls

    @rule(calls=st.integers(1, 3))
    def wallet_outage(self, calls: int) -> None:
        self.table.wallet.unavailable = calls

    # ------------------------------------------------------------------ players

    @rule(bets=st.lists(st.tuples(st.integers(0, PLAYERS - 1), st.integers(0, 10), st.integers(1, 60)), max_size=4))
    def bet(self, bets: list[tuple[int, int, int]]) -> None:
        """A few players bet at once (who, area, chips): accepted, or refused with a reason."""
        variant = VARIANTS[self.variant]
        config = variant.parse_config(CONFIGS[self.variant])
        for who, area, chips in bets:
            area_name = variant.areas[area % len(variant.areas)]
            amount = variant.fixed_stake_minor(area_name, config) or 100 * chips
            bet_id = f"{self.table_id}-b{next(self.ids)}"
            self.attempt("bet", self.table.app.place_bet(player(f"p{who}"), bet_id, self.table_id, area_name, amount))
            self.bets.append((f"p{who}", bet_id))

    @rule(pick=st.integers(0, 1_000))
    def cancel(self, pick: int) -> None:
        if self.bets:
            who, bet_id = self.bets[pick % len(self.bets)]
            self.attempt("cancel", self.table.app.cancel_bet(player(who), self.table_id, bet_id))

    @rule(pick=st.integers(0, 1_000), chips=st.integers(0, 60))
    def change(self, pick: int, chips: int) -> None:
        if self.bets:
            who, bet_id = self.bets[pick % len(self.bets)]
            change = self.table.app.envelope.change_bet(
                player(who), f"{bet_id}-c{next(self.ids)}", self.table_id, bet_id, 100 * chips
            )
            self.attempt("change", change)

    @rule(who=st.integers(0, PLAYERS - 1), steps=st.integers(-1, 5))
    def bid(self, who: int, steps: int) -> None:
        """A bid ``steps`` increments above the highest (-1: one too low)."""
        highest = self.run(self.highest_bid())
        amount = max(1_000, highest + 1_000 * (steps + 1)) if steps >= 0 else max(1, highest)
        bid_id = f"{self.table_id}-bid{next(self.ids)}"
        self.attempt("bid", self.table.app.envelope.place_bid(player(f"p{who}"), bid_id, self.table_id, amount))

    async def highest_bid(self) -> int:
        _, current = await self.table.app.get_table(self.table_id)
        if current is None or current["phase"] != Phase.BIDDING:
            return 0
        async with self.table.app.store.read() as conn:
            return int((await self.table.app.ctx.envelopes.row(conn, current["round_id"]))["highest_bid_minor"])

    @rule(who=st.integers(0, PLAYERS - 1), capital=st.sampled_from([0, 150_000, 1_000_000]))
    def apply_banker(self, who: int, capital: int) -> None:
        self.attempt("apply banker", self.table.app.banker.apply(player(f"p{who}"), self.table_id, capital))

    # ------------------------------------------------------------------ what must always hold

    @invariant()
    def money_is_conserved(self) -> None:
        if self.rig is None:
            return
        self.run(self.table.deliver(self.table_id))
        wallet = self.table.wallet
        assert wallet.total_minor() == self.table.initial_total
        assert all(v >= 0 for k, v in wallet.available.items() if k.startswith("player:")), dict(wallet.available)
        ended = {r["round_id"] for r in self.run(self.table.app.recent_rounds(self.table_id, 100))
                 if r["phase"] in Phase.ENDED}  # fmt: skip
        still_held = [h for h, hold in wallet.holds.items() if hold.status == "open" and hold.round_id in ended]
        assert still_held == [], still_held

    def teardown(self) -> None:
        try:
            if self.rig is not None:
                self.table.rng.failures = 0
                self.table.wallet.unavailable = 0
                self.run(self.table.finish(self.table_id))
                rounds = self.run(self.table.app.recent_rounds(self.table_id, 100))
                assert all(r["phase"] in Phase.ENDED for r in rounds), [(r["round_id"], r["phase"]) for r in rounds]
                assert self.table.open_holds() == []
                assert self.table.conserved()
                for r in rounds:  # the ledger's recompute of every round the table ended, transfer by transfer
                    assert self.run(self.table.audit(self.table_id, r["round_id"])) == [], r["round_id"]
        finally:
            self.loop.run(self.pool.close())
            self.loop.close()


def test_tables_conserve_money_and_end_every_round(dsn: str, unique: str) -> None:
    name = f"t_{unique}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        with asyncio.Runner() as runner:
            pool = runner.run(open_pool(dsn, schema=name, max_size=2))
            runner.run(setup_schema(pool))
            runner.run(pool.close())
        TableMachine.dsn, TableMachine.schema = dsn, name
        run_state_machine_as_test(
            TableMachine,
            settings=settings(
                max_examples=10,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
