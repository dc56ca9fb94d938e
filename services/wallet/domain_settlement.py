"""The wallet's settlement rules: a round's outcome from the table checked against its holds and turned into
one plan of resolutions and transfers, or refused as a whole. No I/O, no clock."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from backbone.errors import FailedPrecondition, InvalidArgument
from bull.accounts import CASHIER as CASHIER
from bull.accounts import PLAYER_PREFIX as PLAYER_PREFIX
from bull.accounts import AccountKind as AccountKind
from services.wallet.domain import (
    MAX_AMOUNT_MINOR,
    MAX_KIND_CHARS,
    AccountState,
    Bucket,
    HoldStatus,
    Movement,
    account_kind,
    apply_movements,
    is_id,
    net_by_account,
    transfer,
)
from services.wallet.domain_holds import (
    Hold,
    release,
)


class SettlementRejected(Exception):
    """A table's settlement the wallet will not apply (nothing of it is applied)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class SettlementTransfer:
    payer: str
    payee: str
    amount_minor: int
    kind: str
    bet_id: str = ""
    hold_id: str = ""


@dataclass(frozen=True, slots=True)
class SettlementCommand:
    """A table's RoundSettled (``voided`` False) or RoundVoided (``voided`` True)."""

    round_id: str
    table_id: str
    transfers: tuple[SettlementTransfer, ...]
    hold_ids: tuple[str, ...]
    voided: bool = False

    def accounts(self) -> set[str]:
        return {a for t in self.transfers for a in (t.payer, t.payee)}

    def all_hold_ids(self) -> tuple[str, ...]:
        """Listed holds first, then any hold a transfer names that the list forgot, each once."""
        return tuple(dict.fromkeys([*self.hold_ids, *(t.hold_id for t in self.transfers if t.hold_id)]))


@dataclass(frozen=True, slots=True)
class SettlementPlan:
    movements: tuple[Movement, ...]
    holds: tuple[Hold, ...]  # resolved by this settlement
    holds_posted: tuple[str, ...]
    holds_voided: tuple[str, ...]
    holds_skipped: tuple[str, ...]
    accounts_after: Mapping[str, AccountState]
    player_net_minor: Mapping[str, int]  # each player's balance change (negative = a loss)


def _reject_unless(ok: bool, reason: str, detail: str) -> None:
    if not ok:
        raise SettlementRejected(reason, detail)


def _settlement_account(accounts: Mapping[str, AccountState], account: str) -> AccountState:
    try:
        kind = account_kind(account)
    except InvalidArgument:
        raise SettlementRejected("ACCOUNT_INVALID", f"{account!r:.80} is not an account name") from None
    _reject_unless(kind is not AccountKind.EXTERNAL, "ACCOUNT_NOT_ALLOWED", f"{account} cannot take part in a round")
    state = accounts.get(account)
    if state is None:
        raise SettlementRejected("ACCOUNT_NOT_FOUND", f"no account {account}")
    return state


def decide_settlement(
    command: SettlementCommand, accounts: Mapping[str, AccountState], holds: Mapping[str, Hold], now: datetime
) -> SettlementPlan:
    """The whole settlement, or SettlementRejected: every transfer funded, every hold resolved once."""
    round_id = command.round_id
    _reject_unless(is_id(round_id), "ROUND_ID_INVALID", f"round id {round_id!r:.80}")
    _reject_unless(not (command.voided and command.transfers), "PAYLOAD_INVALID", "a voided round moves no money")
    movements: list[Movement] = []
    taken: dict[str, int] = defaultdict(int)
    credited: dict[str, int] = defaultdict(int)
    for i, t in enumerate(command.transfers):
        movements.append(_settlement_transfer(command, i, t, accounts, holds, taken, credited))
    resolved: list[Hold] = []
    posted: list[str] = []
    voided: list[str] = []
    skipped: list[str] = []
    for hold_id in command.all_hold_ids():
        hold = holds.get(hold_id)
        amount = taken.get(hold_id, 0)
        if amount == 0 and (hold is None or hold.status is not HoldStatus.OPEN):
            skipped.append(hold_id)  # nothing owed from it and nothing left to release
            continue
        assert hold is not None
        _check_hold_round(hold, round_id)
        if amount < hold.amount_minor:
            movements.append(
                release(hold, "void", f"release:{round_id}:{hold_id}", hold.amount_minor - amount, round_id)
            )
        status = HoldStatus.POSTED if amount else HoldStatus.VOIDED
        resolved.append(hold.resolve(status, amount, now, f"settlement:{round_id}"))
        (posted if amount else voided).append(hold_id)
    try:
        after = apply_movements(accounts, movements)
    except FailedPrecondition as error:
        raise SettlementRejected(error.reason, error.message) from None
    nets = {
        account: d_available + d_held
        for account, (d_available, d_held) in net_by_account(movements).items()
        if accounts[account].kind is AccountKind.PLAYER
    }
    return SettlementPlan(tuple(movements), tuple(resolved), tuple(posted), tuple(voided), tuple(skipped), after, nets)


def _check_hold_round(hold: Hold, round_id: str) -> None:
    _reject_unless(
        hold.request.round_id in ("", round_id),
        "HOLD_ROUND_MISMATCH",
        f"hold {hold.hold_id} belongs to round {hold.request.round_id}",
    )


def _settlement_transfer(
    command: SettlementCommand,
    index: int,
    t: SettlementTransfer,
    accounts: Mapping[str, AccountState],
    holds: Mapping[str, Hold],
    taken: dict[str, int],
    credited: dict[str, int],
) -> Movement:
    """One transfer's movement. ``taken``: what earlier transfers drew from each hold;
    ``credited``: what earlier transfers paid each account, less what it paid on without a hold."""
    where = f"transfer {index}"
    _reject_unless(0 < t.amount_minor <= MAX_AMOUNT_MINOR, "AMOUNT_INVALID", f"{where}: amount {t.amount_minor}")
    _reject_unless(0 < len(t.kind) <= MAX_KIND_CHARS, "KIND_INVALID", f"{where}: kind {t.kind!r:.80}")
    _reject_unless(t.payer != t.payee, "TRANSFER_TO_SELF", f"{where}: {t.payer} pays itself")
    payer = _settlement_account(accounts, t.payer)
    _settlement_account(accounts, t.payee)
    if not t.hold_id:
        # A player pays without a hold only out of what this settlement paid it before (a
        # red-envelope dealer paying winners past its pool from the losers' payments), so a
        # settlement never spends a player's own free balance.
        if payer.kind is not AccountKind.SYSTEM:
            _reject_unless(
                t.amount_minor <= credited[t.payer],
                "PAYER_NOT_SYSTEM",
                f"{where}: {t.payer} must pay from a hold or from what this settlement paid it before"
                f" ({credited[t.payer]} of that left, {t.amount_minor} to pay)",
            )
            credited[t.payer] -= t.amount_minor
        source = (t.payer, Bucket.AVAILABLE)
    else:
        hold = holds.get(t.hold_id)
        _reject_unless(hold is not None, "HOLD_NOT_FOUND", f"{where}: no hold {t.hold_id}")
        assert hold is not None
        _reject_unless(
            hold.status is HoldStatus.OPEN, "HOLD_NOT_OPEN", f"{where}: hold {t.hold_id} is {hold.status.value}"
        )
        _reject_unless(hold.account == t.payer, "HOLD_WRONG_ACCOUNT", f"{where}: hold {t.hold_id} is not {t.payer}'s")
        _check_hold_round(hold, command.round_id)
        taken[t.hold_id] += t.amount_minor
        _reject_unless(
            taken[t.hold_id] <= hold.amount_minor,
            "HOLD_INSUFFICIENT",
            f"{where}: hold {t.hold_id} of {hold.amount_minor} cannot cover {taken[t.hold_id]}",
        )
        source = (t.payer, Bucket.HELD)
    credited[t.payee] += t.amount_minor
    return transfer(
        f"settle:{command.round_id}:{index}",
        t.kind,
        source,
        (t.payee, Bucket.AVAILABLE),
        t.amount_minor,
        round_id=command.round_id,
        hold_id=t.hold_id,
        bet_id=t.bet_id,
    )
