"""A Hypothesis state machine over one table of every variant sharing one wallet: random bets, cancels,
changes, bids, banker applications, rng and wallet outages and crashes (the app object rebuilt from the
store) between steps.

After every rule: the money in the fake wallet (balances plus holds) is what it
was, no player's balance is negative, and no hold of an ended round is still
open. At the end every round the tables opened has ended settled or voided, and
the ledger's recompute of each matches its settlement transfer by transfer.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg import sql

from backbone.db import open_pool
from backbone.errors import DomainError
from bull.money import JACKPOT_POOL
from bull.variants import VARIANTS
from services.table.common import Phase
from services.table.runner import ERROR_BACKOFF_S
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
GAMES = sorted(VARIANTS)
games = st.sampled_from(GAMES)
runs = itertools.count()


class TableMachine(RuleBasedStateMachine):
    dsn = ""
    schema = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.Runner()
        self.pool = self.loop.run(open_pool(self.dsn, schema=self.schema, max_size=4))
        self.rig = Rig(self.pool, event_store(), BALANCES)  # the schema is set up once per test
        run = next(runs)
        self.tables = {game: f"m{run}-{game.replace('_', '-')}" for game in GAMES}
        for game, table_id in self.tables.items():
            self.run(self.rig.create(table_id, game, CONFIGS[game]))
            self.run(self.rig.step(table_id))
        self.bets: dict[str, list[tuple[str, str]]] = {game: [] for game in GAMES}  # (player, bet id)
        self.ids = itertools.count()

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def attempt(self, game: str, command: str, coro: Any) -> None:
        """A command a player may send at any moment: refused with a domain error, or done."""
        try:
            self.run(coro)
        except DomainError as refused:
            event(f"{game} {command}: {refused.reason}")
        else:
            event(f"{game} {command}: done")

    # ------------------------------------------------------------------ the tables' own steps

    @rule(game=games, steps=st.integers(1, 4), wait=st.sampled_from([0.0, 0.3, 1.0]))
    def step(self, game: str, steps: int, wait: float) -> None:
        """A few of a table's steps, the clock moving ``wait`` of the time the round waits for."""
        for _ in range(steps):
            delay = self.table_step(game)
            if delay > 0:
                self.rig.clock.advance(delay * wait)

    def table_step(self, game: str) -> float:
        """One step as the round runner takes it: a refusal (another service down) is retried after a pause."""
        try:
            return float(self.run(self.rig.step(self.tables[game])))
        except DomainError as refused:
            event(f"{game} step: {refused.reason}")
            return ERROR_BACKOFF_S

    @rule(game=games, bidding=st.booleans())
    def until(self, game: str, bidding: bool) -> None:
        """Let a table run (the clock moving as it waits) until a round takes bets (or bids), for a while at most."""
        phase = Phase.BIDDING if bidding and game == "red_envelope_bull" else Phase.BETTING
        for _ in range(60):
            _, current = self.run(self.rig.app.get_table(self.tables[game]))
            if current is not None and current["phase"] == phase:
                return
            self.rig.clock.advance(max(self.table_step(game), 0))

    @rule()
    def crash(self) -> None:
        self.rig.crash()

    @rule(calls=st.integers(1, 30))
    def rng_outage(self, calls: int) -> None:
        self.rig.rng.failures = calls

    @rule(calls=st.integers(1, 3))
    def wallet_outage(self, calls: int) -> None:
        self.rig.wallet.unavailable = calls

    # ------------------------------------------------------------------ players

    @rule(
        game=games,
        bets=st.lists(st.tuples(st.integers(0, PLAYERS - 1), st.integers(0, 10), st.integers(1, 60)), max_size=4),
    )
    def bet(self, game: str, bets: list[tuple[int, int, int]]) -> None:
        """A few players bet at once (who, area, chips): accepted, or refused with a reason."""
        variant = VARIANTS[game]
        config = variant.parse_config(CONFIGS[game])
        for who, area, chips in bets:
            area_name = variant.areas[area % len(variant.areas)]
            amount = variant.fixed_stake_minor(area_name, config) or 100 * chips
            bet_id = f"{self.tables[game]}-b{next(self.ids)}"
            place = self.rig.app.place_bet(player(f"p{who}"), bet_id, self.tables[game], area_name, amount)
            self.attempt(game, "bet", place)
            self.bets[game].append((f"p{who}", bet_id))

    @rule(game=games, pick=st.integers(0, 1_000))
    def cancel(self, game: str, pick: int) -> None:
        if self.bets[game]:
            who, bet_id = self.bets[game][pick % len(self.bets[game])]
            self.attempt(game, "cancel", self.rig.app.cancel_bet(player(who), self.tables[game], bet_id))

    @rule(pick=st.integers(0, 1_000), chips=st.integers(0, 60))
    def change(self, pick: int, chips: int) -> None:
        game = "red_envelope_bull"
        if self.bets[game]:
            who, bet_id = self.bets[game][pick % len(self.bets[game])]
            change = self.rig.app.envelope.change_bet(
                player(who), f"{bet_id}-c{next(self.ids)}", self.tables[game], bet_id, 100 * chips
            )
            self.attempt(game, "change", change)

    @rule(who=st.integers(0, PLAYERS - 1), steps=st.integers(-1, 5))
    def bid(self, who: int, steps: int) -> None:
        """A bid ``steps`` increments above the highest (-1: one too low)."""
        table_id = self.tables["red_envelope_bull"]
        highest = self.run(self.highest_bid(table_id))
        amount = max(1_000, highest + 1_000 * (steps + 1)) if steps >= 0 else max(1, highest)
        bid_id = f"{table_id}-bid{next(self.ids)}"
        self.attempt(
            "red_envelope_bull", "bid", self.rig.app.envelope.place_bid(player(f"p{who}"), bid_id, table_id, amount)
        )

    async def highest_bid(self, table_id: str) -> int:
        _, current = await self.rig.app.get_table(table_id)
        if current is None or current["phase"] != Phase.BIDDING:
            return 0
        async with self.rig.app.store.read() as conn:
            return int((await self.rig.app.ctx.envelopes.row(conn, current["round_id"]))["highest_bid_minor"])

    @rule(who=st.integers(0, PLAYERS - 1), capital=st.sampled_from([0, 150_000, 1_000_000]))
    def apply_banker(self, who: int, capital: int) -> None:
        table_id = self.tables["baibian_bull"]
        self.attempt("baibian_bull", "apply banker", self.rig.app.banker.apply(player(f"p{who}"), table_id, capital))

    # ------------------------------------------------------------------ what must always hold

    @invariant()
    def money_is_conserved(self) -> None:
        ended = set()
        for table_id in self.tables.values():
            self.run(self.rig.deliver(table_id))
            rounds = self.run(self.rig.app.recent_rounds(table_id, 100))
            ended |= {r["round_id"] for r in rounds if r["phase"] in Phase.ENDED}
        wallet = self.rig.wallet
        assert wallet.total_minor() == self.rig.initial_total
        assert all(v >= 0 for k, v in wallet.available.items() if k.startswith("player:")), dict(wallet.available)
        still_held = [h for h, hold in wallet.holds.items() if hold.status == "open" and hold.round_id in ended]
        assert still_held == [], still_held

    def teardown(self) -> None:
        try:
            self.rig.rng.failures = 0
            self.rig.wallet.unavailable = 0
            for game, table_id in self.tables.items():
                self.run(self.rig.finish(table_id))
                rounds = self.run(self.rig.app.recent_rounds(table_id, 100))
                assert all(r["phase"] in Phase.ENDED for r in rounds), [(r["round_id"], r["phase"]) for r in rounds]
                for r in rounds:  # the ledger's recompute of every round the table ended, transfer by transfer
                    assert self.run(self.rig.audit(table_id, r["round_id"])) == [], r["round_id"]
                    event(f"{game} round {r['phase']}")
            assert self.rig.open_holds() == []
            assert self.rig.conserved()
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
