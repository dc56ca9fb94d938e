"""In-memory fakes of the table's ports (``services/table/ports.py``) and a clock that moves when told.

``FakeWallet`` keeps the wallet's rules that matter to a table: a hold is placed
only from available funds, is resolved once (voided, or posted by a settlement
that releases the rest), a transfer from a hold never takes more than it holds,
and a player pays without a hold only out of what the same settlement paid them
before (the wallet's ``PAYER_NOT_SYSTEM``). It applies a round's RoundSettled or
RoundVoided as the wallet's Kafka consumer does, once. System accounts may go
negative; the sum of every balance and hold never changes.

``FakeRng`` deals from the published derivation (``bull.fairness``) with a seed
per round, reveals a seed only once the wallet has seen the round end, and can be
told to fail, or to split a round's envelope a given way.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from niuniu.table.v1 import events_pb2 as ev

from backbone.errors import AlreadyExists, FailedPrecondition, NotFound, Unavailable
from bull import fairness as fair
from bull.money import SYSTEM_ACCOUNTS
from services.table.ports import RevealedSeed, WalletHold


class FakeClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class FakeHold:
    account: str
    amount_minor: int
    round_id: str
    status: str = "open"


class SettlementRefused(AssertionError):
    """The table published a settlement the wallet would reject: a bug the tests must see."""


class FakeWallet:
    def __init__(self, balances: dict[str, int]) -> None:
        self.available: defaultdict[str, int] = defaultdict(int, balances)
        self.holds: dict[str, FakeHold] = {}
        self.resizes: set[str] = set()
        self.applied: dict[str, str] = {}
        self.unavailable = 0  # the next calls to fail with UNAVAILABLE

    def _fail_if_down(self) -> None:
        if self.unavailable:
            self.unavailable -= 1
            raise Unavailable("WALLET_UNAVAILABLE", "the wallet service did not answer (fake)")

    def bet_holds(self, bet_id: str) -> list[FakeHold]:
        """The holds asked for a bet, one per attempt at placing it (``bet.<bet id>.<attempt>``)."""
        return [hold for hold_id, hold in self.holds.items() if hold_id.startswith(f"bet.{bet_id}.")]

    def total_minor(self) -> int:
        held = sum(h.amount_minor for h in self.holds.values() if h.status == "open")
        return sum(self.available.values()) + held

    def held_minor(self, account: str) -> int:
        return sum(h.amount_minor for h in self.holds.values() if h.status == "open" and h.account == account)

    async def place_hold(
        self, hold_id: str, account: str, amount_minor: int, reason: str, round_id: str, expires_at_unix_ms: int
    ) -> None:
        self._fail_if_down()
        existing = self.holds.get(hold_id)
        if existing is not None:
            if (existing.account, existing.amount_minor, existing.round_id) != (account, amount_minor, round_id):
                raise AlreadyExists("HOLD_ID_REUSED", f"hold {hold_id} exists with different fields")
            return
        if account not in self.available:
            raise NotFound("ACCOUNT_NOT_FOUND", f"no account {account}")
        if self.available[account] < amount_minor:
            raise FailedPrecondition("INSUFFICIENT_FUNDS", f"{account} has {self.available[account]}")
        self.available[account] -= amount_minor
        self.holds[hold_id] = FakeHold(account, amount_minor, round_id)

    async def void_hold(self, hold_id: str) -> None:
        self._fail_if_down()
        hold = self.holds.get(hold_id)
        if hold is not None and hold.status == "open":
            self.available[hold.account] += hold.amount_minor
            hold.status = "voided"

    async def resize_hold(self, resize_id: str, hold_id: str, amount_minor: int, expected_minor: int) -> None:
        self._fail_if_down()
        if resize_id in self.resizes:
            return
        hold = self.holds.get(hold_id)
        if hold is None or hold.status != "open":
            raise FailedPrecondition("HOLD_ALREADY_RESOLVED", f"hold {hold_id} is not open")
        if expected_minor and hold.amount_minor != expected_minor:
            raise FailedPrecondition("HOLD_CHANGED", f"hold {hold_id} holds {hold.amount_minor}, not {expected_minor}")
        delta = amount_minor - hold.amount_minor
        if delta > self.available[hold.account]:
            raise FailedPrecondition("INSUFFICIENT_FUNDS", f"{hold.account} cannot hold {delta} more")
        self.available[hold.account] -= delta
        hold.amount_minor = amount_minor
        self.resizes.add(resize_id)

    async def balance_minor(self, account: str) -> int:
        self._fail_if_down()
        return self.available[account]

    async def settlement_status(self, round_id: str) -> str | None:
        return self.applied.get(round_id)

    async def read_holds(self, hold_ids: Sequence[str]) -> dict[str, WalletHold]:
        self._fail_if_down()
        return {
            hold_id: WalletHold(hold_id, hold.account, hold.amount_minor, hold.round_id, hold.status == "open")
            for hold_id, hold in self.holds.items()
            if hold_id in hold_ids
        }

    # ------------------------------------------------------------------ the wallet's consumer

    def apply_settled(self, settled: ev.RoundSettled) -> None:
        if settled.round_id in self.applied:
            return  # a redelivery changes nothing
        taken: defaultdict[str, int] = defaultdict(int)
        credited: defaultdict[str, int] = defaultdict(int)
        moves: list[tuple[str, str, int, str]] = []
        for i, t in enumerate(settled.transfers):
            if t.amount_minor <= 0 or t.payer == t.payee:
                raise SettlementRefused(f"transfer {i} is malformed: {t}")
            if t.hold_id:
                hold = self.holds.get(t.hold_id)
                if hold is None or hold.status != "open" or hold.account != t.payer:
                    raise SettlementRefused(f"transfer {i}: hold {t.hold_id} is not {t.payer}'s open hold")
                if hold.round_id not in ("", settled.round_id):
                    raise SettlementRefused(f"transfer {i}: hold {t.hold_id} is another round's")
                taken[t.hold_id] += t.amount_minor
                if taken[t.hold_id] > hold.amount_minor:
                    raise SettlementRefused(f"transfer {i}: hold {t.hold_id} cannot cover {taken[t.hold_id]}")
            elif t.payer not in SYSTEM_ACCOUNTS:
                if t.amount_minor > credited[t.payer]:
                    raise SettlementRefused(f"transfer {i}: {t.payer} pays {t.amount_minor} without a hold")
                credited[t.payer] -= t.amount_minor
            credited[t.payee] += t.amount_minor
            moves.append((t.payer, t.payee, t.amount_minor, t.hold_id))
        for payer, payee, amount, hold_id in moves:
            if hold_id:
                self.holds[hold_id].amount_minor -= amount
            else:
                self.available[payer] -= amount
            self.available[payee] += amount
        self._release(settled.hold_ids, [t.hold_id for t in settled.transfers if t.hold_id])
        self.applied[settled.round_id] = "settled"

    def apply_voided(self, voided: ev.RoundVoided) -> None:
        if voided.round_id in self.applied:
            return
        self._release(voided.hold_ids, [])
        self.applied[voided.round_id] = "voided"

    def _release(self, *hold_lists: object) -> None:
        for hold_id in dict.fromkeys(h for holds in hold_lists for h in holds):  # type: ignore[attr-defined]
            hold = self.holds.get(hold_id)
            if hold is not None and hold.status == "open":
                self.available[hold.account] += hold.amount_minor
                hold.amount_minor = 0
                hold.status = "resolved"


class FakeRng:
    def __init__(self, wallet: FakeWallet, salt: str = "") -> None:
        self._wallet = wallet
        self._salt = salt
        self.failures = 0  # the next draws or splits to fail with UNAVAILABLE
        self.forced_splits: dict[str, tuple[list[int], list[int]]] = {}
        self.forced_decks: dict[str, list[str]] = {}
        self.commits: dict[str, str] = {}
        self.deck_client_seeds: dict[str, str] = {}  # what the rng's reveal answers: the deck's, never the envelope's

    def seed(self, round_id: str) -> bytes:
        return hashlib.sha256(f"{self._salt}:{round_id}".encode()).digest()

    async def commit(self, round_id: str, purpose: str = "deck") -> str:
        self.commits[round_id] = purpose
        return fair.commit(self.seed(round_id))

    def _maybe_fail(self) -> None:
        if self.failures:
            self.failures -= 1
            raise Unavailable("RNG_UNAVAILABLE", "the rng service did not answer (fake)")

    async def draw(
        self, round_id: str, deck_size: int, client_seed: str, *, client_seeds: Sequence[str] = ()
    ) -> list[str]:
        self._maybe_fail()
        self.deck_client_seeds[round_id] = client_seed
        if round_id in self.forced_decks:
            return list(self.forced_decks[round_id])
        return [card.code for card in fair.shuffle(self.seed(round_id), round_id, client_seed, deck_size)]

    async def split_envelope(
        self,
        round_id: str,
        total_minor: int,
        shares: int,
        min_minor: int,
        client_seed: str,
        *,
        client_seeds: Sequence[str] = (),
    ) -> tuple[list[int], list[int]]:
        self._maybe_fail()
        if round_id in self.forced_splits:
            amounts, order = self.forced_splits[round_id]
            return list(amounts), list(order)
        split = fair.split_envelope(self.seed(round_id), round_id, client_seed, total_minor, shares, min_minor)
        return list(split.amounts), list(split.grab_order)

    async def reveal(self, round_id: str) -> RevealedSeed:
        if await self._wallet.settlement_status(round_id) is None:
            raise FailedPrecondition("ROUND_NOT_CLOSED", f"round {round_id} has not ended")
        seed = self.seed(round_id)
        return RevealedSeed(seed.hex(), fair.commit(seed), self.deck_client_seeds.get(round_id, ""))
