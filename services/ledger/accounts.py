"""The ledger's view of the chart of accounts (``bull.accounts``): an account's type follows
from its name, as the protobuf enum the ledger's API and tables speak.

Names are the wallet's (niuniu.wallet.v1.Leg.account). Balances keep the wallet's
sign, credits minus debits: positive when the account holds value for its owner.
Debit-normal accounts (the cashier, an expense) therefore run negative, which is
what makes the sum of every balance zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from niuniu.ledger.v1 import ledger_pb2
from niuniu.wallet.v1 import events_pb2 as wallet_pb2

from bull import accounts as chart
from bull.accounts import CASHIER as CASHIER
from bull.accounts import EXTERNAL_PREFIX as EXTERNAL_PREFIX
from bull.accounts import PLAYER_PREFIX as PLAYER_PREFIX
from bull.accounts import player_account as player_account

MAX_ACCOUNT_CHARS = 200

# ACCOUNT_TYPE_<NAME> for every type in the chart: a type added to bull.accounts without its
# enum value in ledger.proto fails here, at import.
PROTO_TYPES: Mapping[chart.AccountType, ledger_pb2.AccountType.ValueType] = MappingProxyType(
    {t: ledger_pb2.AccountType.Value(f"ACCOUNT_TYPE_{t.name}") for t in chart.AccountType}
)
SYSTEM_ACCOUNTS: Mapping[str, ledger_pb2.AccountType.ValueType] = MappingProxyType(
    {name: PROTO_TYPES[t] for name, t in chart.SYSTEM_ACCOUNT_TYPES.items()}
)

BUCKET_NAMES: dict[int, str] = {wallet_pb2.BUCKET_AVAILABLE: "available", wallet_pb2.BUCKET_HELD: "held"}
BUCKETS_BY_NAME: dict[str, wallet_pb2.Bucket.ValueType] = {
    "available": wallet_pb2.BUCKET_AVAILABLE,
    "held": wallet_pb2.BUCKET_HELD,
}


class AccountError(ValueError):
    """A name outside the chart of accounts."""


def account_type(account: str) -> ledger_pb2.AccountType.ValueType:
    """The account's type; ``AccountError`` when the name is not in the chart."""
    if not account or len(account) > MAX_ACCOUNT_CHARS or account != account.strip():
        raise AccountError(f"{account!r} is not an account name")
    kind = chart.account_type(account)
    if kind is None:
        if account in (PLAYER_PREFIX, EXTERNAL_PREFIX):
            raise AccountError(f"{account!r} names no {account[:-1]}")
        raise AccountError(f"{account!r} is not in the chart of accounts")
    return PROTO_TYPES[kind]


def is_account(account: str) -> bool:
    try:
        account_type(account)
    except AccountError:
        return False
    return True


def bucket_name(bucket: int) -> str:
    """``available`` or ``held``; ``AccountError`` for anything else (e.g. BUCKET_UNSPECIFIED)."""
    try:
        return BUCKET_NAMES[bucket]
    except KeyError:
        raise AccountError(f"bucket {bucket} is neither AVAILABLE nor HELD") from None
