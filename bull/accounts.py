"""The chart of accounts: every account name the system moves money between, what kind of
account it is, whether its balance may go below zero, and how the ledger books it.

One list for the rules (settlements name ``HOUSE``, ``JACKPOT_POOL``...), the wallet (which
accounts exist from the start, which may run negative) and the ledger (each account's type).
Plain data: the ledger maps ``AccountType`` onto its protobuf enum by name.

Balances keep the wallet's sign, credits minus debits: positive when the account holds
value for its owner. Only a player's money is bounded below by zero; the operator's own
accounts and the outside world run negative by construction (the house pays a win before
it collects a loss; every deposit is a debit of the cashier), which is what makes the sum
of every balance zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class AccountKind(StrEnum):
    """Who an account belongs to (the wallet stores these values)."""

    PLAYER = "player"
    SYSTEM = "system"
    EXTERNAL = "external"

    @property
    def may_go_below_zero(self) -> bool:
        """Whether the available balance may be negative (a held balance never may)."""
        return self is not AccountKind.PLAYER


class AccountType(StrEnum):
    """How the ledger books an account (``niuniu.ledger.v1.AccountType`` without its prefix)."""

    PLAYER_LIABILITY = "player_liability"  # what the operator owes a player
    HOUSE_EQUITY = "house_equity"  # the operator's own stake as banker
    REVENUE = "revenue"
    EXPENSE = "expense"
    JACKPOT_LIABILITY = "jackpot_liability"  # owed to future jackpot winners
    EXTERNAL_ASSET = "external_asset"  # money in and out of the system


PLAYER_PREFIX = "player:"
EXTERNAL_PREFIX = "external:"

# The operator's accounts (one name everywhere: rules, wallet, ledger, protos).
HOUSE = "house"
COMMISSION_REVENUE = "commission_revenue"
REBATE_EXPENSE = "rebate_expense"
JACKPOT_POOL = "jackpot_pool"
FEES = "fees"
# The other side of every deposit and withdrawal.
CASHIER = EXTERNAL_PREFIX + "cashier"

SYSTEM_ACCOUNT_TYPES: Mapping[str, AccountType] = MappingProxyType(
    {
        HOUSE: AccountType.HOUSE_EQUITY,
        COMMISSION_REVENUE: AccountType.REVENUE,
        REBATE_EXPENSE: AccountType.EXPENSE,
        JACKPOT_POOL: AccountType.JACKPOT_LIABILITY,
        FEES: AccountType.REVENUE,
    }
)
SYSTEM_ACCOUNTS: tuple[str, ...] = tuple(SYSTEM_ACCOUNT_TYPES)

OPENING_ACCOUNTS: Mapping[str, AccountKind] = MappingProxyType(
    {**dict.fromkeys(SYSTEM_ACCOUNTS, AccountKind.SYSTEM), CASHIER: AccountKind.EXTERNAL}
)
"""The accounts that exist before any player does, with their kinds."""

_TYPE_BY_PREFIX = ((PLAYER_PREFIX, AccountType.PLAYER_LIABILITY), (EXTERNAL_PREFIX, AccountType.EXTERNAL_ASSET))


def account_type(account: str) -> AccountType | None:
    """The type of a name in the chart (a system account, ``player:<id>``, ``external:<name>``);
    ``None`` for any other name. Services check their own id formats on top of this."""
    if account in SYSTEM_ACCOUNT_TYPES:
        return SYSTEM_ACCOUNT_TYPES[account]
    for prefix, kind in _TYPE_BY_PREFIX:
        if account.startswith(prefix) and len(account) > len(prefix):
            return kind
    return None


def player_account(player_id: str) -> str:
    """The account of a player id (an id that already names the account is kept as it is)."""
    return player_id if player_id.startswith(PLAYER_PREFIX) else PLAYER_PREFIX + player_id
