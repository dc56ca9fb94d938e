"""Wallet- and table-shaped events for tests and the replay benchmark.

A seeded, deterministic stream in the wallet's contract (niuniu.wallet.v1): deposits,
holds for bets (some resized before the round settles), round settlements (loss, win
with commission, push, rebate, jackpot contribution), a partly posted hold, voided holds
and withdrawals. Each round settlement also yields the table's RoundSettled. ``expected``
holds the balances the stream must leave, in the wallet's sign.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from niuniu.table.v1 import events_pb2 as table_pb2
from niuniu.wallet.v1 import events_pb2 as wallet_pb2

from backbone.eventstore import NewEvent
from bull.accounts import CASHIER, COMMISSION_REVENUE, HOUSE, JACKPOT_POOL, REBATE_EXPENSE
from services.ledger.journal import find_movements

AVAILABLE = wallet_pb2.BUCKET_AVAILABLE
HELD = wallet_pb2.BUCKET_HELD
COMMISSION_BP = 500
BP = 10_000


@dataclass(frozen=True, slots=True)
class Synthetic:
    """One event: ``target`` is "wallet" or "table" (which service's stream and topic)."""

    target: str
    stream_id: str
    event: NewEvent


def leg(account: str, bucket: wallet_pb2.Bucket.ValueType, amount_minor: int) -> wallet_pb2.Leg:
    return wallet_pb2.Leg(account=account, bucket=bucket, amount_minor=amount_minor)


def movement(
    movement_id: str, kind: str, *legs: wallet_pb2.Leg, round_id: str = "", hold_id: str = "", bet_id: str = ""
) -> wallet_pb2.Movement:
    return wallet_pb2.Movement(
        movement_id=movement_id, kind=kind, legs=legs, round_id=round_id, hold_id=hold_id, bet_id=bet_id
    )


def deposited(account: str, amount_minor: int, movement_id: str) -> NewEvent:
    m = movement(movement_id, "deposit", leg(CASHIER, AVAILABLE, -amount_minor), leg(account, AVAILABLE, amount_minor))
    return NewEvent("wallet.deposited", wallet_pb2.Deposited(movement=m, actor="cashier"))


def withdrawn(account: str, amount_minor: int, movement_id: str) -> NewEvent:
    m = movement(
        movement_id, "withdrawal", leg(account, AVAILABLE, -amount_minor), leg(CASHIER, AVAILABLE, amount_minor)
    )
    return NewEvent("wallet.withdrawn", wallet_pb2.Withdrawn(movement=m, actor="cashier"))


def hold_placed(account: str, amount_minor: int, hold_id: str, round_id: str) -> NewEvent:
    m = movement(
        f"{hold_id}:hold",
        "hold",
        leg(account, AVAILABLE, -amount_minor),
        leg(account, HELD, amount_minor),
        round_id=round_id,
        hold_id=hold_id,
    )
    payload = wallet_pb2.HoldPlaced(
        hold_id=hold_id, account=account, amount_minor=amount_minor, reason="bet", round_id=round_id, movement=m
    )
    return NewEvent("wallet.hold_placed", payload, correlation_id=round_id)


def hold_resized(
    account: str, previous_minor: int, amount_minor: int, hold_id: str, resize_id: str, round_id: str
) -> NewEvent:
    change = amount_minor - previous_minor
    assert change != 0
    available, held = leg(account, AVAILABLE, -change), leg(account, HELD, change)
    m = movement(
        f"{resize_id}:resize",
        "hold_resize",
        *((available, held) if change > 0 else (held, available)),
        round_id=round_id,
        hold_id=hold_id,
    )
    payload = wallet_pb2.HoldResized(
        hold_id=hold_id, resize_id=resize_id, previous_minor=previous_minor, amount_minor=amount_minor, movement=m
    )
    return NewEvent("wallet.hold_resized", payload, correlation_id=round_id)


def hold_voided(account: str, amount_minor: int, hold_id: str, cause: str, round_id: str = "") -> NewEvent:
    m = movement(
        f"{hold_id}:void",
        "void" if cause != "expire" else "expire",
        leg(account, HELD, -amount_minor),
        leg(account, AVAILABLE, amount_minor),
        round_id=round_id,
        hold_id=hold_id,
    )
    return NewEvent(
        "wallet.hold_voided", wallet_pb2.HoldVoided(hold_id=hold_id, cause=cause, movement=m), correlation_id=round_id
    )


@dataclass
class _Round:
    round_id: str
    table_id: str
    bets: list[table_pb2.BetOutcome] = field(default_factory=list)
    transfers: list[table_pb2.SettlementTransfer] = field(default_factory=list)
    movements: list[wallet_pb2.Movement] = field(default_factory=list)
    holds: list[str] = field(default_factory=list)


class SyntheticStream:
    """Builds the stream and tracks the balances it must leave (``expected``)."""

    def __init__(self, seed: int = 7, players: int = 6) -> None:
        self._rng = random.Random(seed)
        self.players = [f"player:p{i}" for i in range(players)]
        self.expected: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._available: defaultdict[str, int] = defaultdict(int)
        self._counter = 0
        self.rounds: list[str] = []

    def _id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}-{self._counter}"

    def _track(self, event: NewEvent) -> None:
        for m in find_movements(event.payload):
            for lg in m.legs:
                bucket = "available" if lg.bucket == AVAILABLE else "held"
                self.expected[(lg.account, bucket)] += lg.amount_minor
                if bucket == "available":
                    self._available[lg.account] += lg.amount_minor

    def _emit(self, target: str, stream_id: str, event: NewEvent) -> Synthetic:
        if target == "wallet":
            self._track(event)
        return Synthetic(target, stream_id, event)

    def events(self, count: int) -> Iterator[Synthetic]:
        """At least ``count`` events (a round is never cut in half)."""
        emitted = 0
        for account in self.players:
            yield self._emit("wallet", f"account-{account}", deposited(account, 100_000, self._id("dep")))
            emitted += 1
        while emitted < count:
            for item in self._step():
                emitted += 1
                yield item

    def _step(self) -> Iterator[Synthetic]:
        roll = self._rng.random()
        if roll < 0.75:
            yield from self._round()
        elif roll < 0.85:
            account = self._rng.choice(self.players)
            yield self._emit("wallet", f"account-{account}", deposited(account, 5_000, self._id("dep")))
        elif roll < 0.93:
            yield from self._voided_hold()
        else:
            account = self._rng.choice(self.players)
            amount = min(2_000, self._available[account])
            if amount > 0:
                yield self._emit("wallet", f"account-{account}", withdrawn(account, amount, self._id("wd")))

    def _voided_hold(self) -> Iterator[Synthetic]:
        account = self._rng.choice(self.players)
        if self._available[account] < 100:
            return
        hold_id = self._id("hold")
        yield self._emit("wallet", f"account-{account}", hold_placed(account, 100, hold_id, ""))
        cause = self._rng.choice(["void", "expire"])
        yield self._emit("wallet", f"account-{account}", hold_voided(account, 100, hold_id, cause))

    def _round(self) -> Iterator[Synthetic]:
        rnd = _Round(self._id("round"), f"table-{self._rng.randrange(3)}")
        self.rounds.append(rnd.round_id)
        for account in self._rng.sample(self.players, k=min(3, len(self.players))):
            stake = 100 * self._rng.randint(1, 5)
            if self._available[account] < stake:
                continue
            hold_id, bet_id = self._id("hold"), self._id("bet")
            rnd.holds.append(hold_id)
            yield self._emit("wallet", f"account-{account}", hold_placed(account, stake, hold_id, rnd.round_id))
            if len(rnd.holds) == 2:  # the round's second bet changes before betting closes
                resized = stake + 100 if self._available[account] >= 100 else stake - 100
                if resized > 0:
                    event = hold_resized(account, stake, resized, hold_id, self._id("resize"), rnd.round_id)
                    yield self._emit("wallet", f"account-{account}", event)
                    stake = resized
            self._settle_bet(rnd, account, stake, hold_id, bet_id)
        settled = table_pb2.RoundSettled(
            table_id=rnd.table_id,
            round_id=rnd.round_id,
            variant="golden_bull",
            bets=rnd.bets,
            transfers=rnd.transfers,
            hold_ids=rnd.holds,
        )
        yield self._emit("table", rnd.table_id, NewEvent("table.round_settled", settled, correlation_id=rnd.round_id))
        applied = wallet_pb2.RoundSettlementApplied(
            round_id=rnd.round_id, table_id=rnd.table_id, movements=rnd.movements, holds_posted=rnd.holds
        )
        yield self._emit(
            "wallet",
            f"settlement-{rnd.round_id}",
            NewEvent("wallet.round_settlement_applied", applied, correlation_id=rnd.round_id),
        )

    def _transfer(self, rnd: _Round, kind: str, payer: str, payee: str, amount: int, bet_id: str, hold_id: str) -> None:
        rnd.transfers.append(
            table_pb2.SettlementTransfer(
                payer=payer, payee=payee, amount_minor=amount, kind=kind, bet_id=bet_id, hold_id=hold_id
            )
        )
        rnd.movements.append(
            movement(
                f"{rnd.round_id}:{bet_id}:{kind}",
                kind,
                leg(payer, HELD if hold_id else AVAILABLE, -amount),
                leg(payee, AVAILABLE, amount),
                round_id=rnd.round_id,
                hold_id=hold_id,
                bet_id=bet_id,
            )
        )

    def _release(self, rnd: _Round, account: str, amount: int, hold_id: str, bet_id: str) -> None:
        if amount > 0:
            rnd.movements.append(
                movement(
                    f"{rnd.round_id}:{bet_id}:release",
                    "post",
                    leg(account, HELD, -amount),
                    leg(account, AVAILABLE, amount),
                    round_id=rnd.round_id,
                    hold_id=hold_id,
                    bet_id=bet_id,
                )
            )

    def _settle_bet(self, rnd: _Round, account: str, stake: int, hold_id: str, bet_id: str) -> None:
        outcome = self._rng.choice(["win", "loss", "push", "loss_jackpot", "win_rebate"])
        net = 0
        if outcome.startswith("win"):
            win = stake * self._rng.randint(1, 3)
            commission = win * COMMISSION_BP // BP
            self._transfer(rnd, "win", HOUSE, account, win, bet_id, "")
            self._transfer(rnd, "commission", account, COMMISSION_REVENUE, commission, bet_id, hold_id)
            self._release(rnd, account, stake - commission, hold_id, bet_id)
            net = win - commission
            if outcome == "win_rebate":
                self._transfer(rnd, "rebate", REBATE_EXPENSE, account, 10, bet_id, "")
                net += 10
        elif outcome.startswith("loss"):
            jackpot = 10 if outcome == "loss_jackpot" else 0
            self._transfer(rnd, "loss", account, HOUSE, stake - jackpot, bet_id, hold_id)
            if jackpot:
                self._transfer(rnd, "jackpot_contribution", account, JACKPOT_POOL, jackpot, bet_id, hold_id)
            net = -stake
        else:
            self._release(rnd, account, stake, hold_id, bet_id)
        rnd.bets.append(
            table_pb2.BetOutcome(
                bet_id=bet_id,
                player=account,
                area="banker",
                stake_minor=stake,
                outcome=outcome.split("_")[0],
                net_minor=net,
                hold_id=hold_id,
            )
        )
