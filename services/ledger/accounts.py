"""The chart of accounts: an account's type follows from its name.

Names are the wallet's (niuniu.wallet.v1.Leg.account). Balances keep the wallet's
sign, credits minus debits: positive when the account holds value for its owner.
Debit-normal accounts (the cashier, an expense) therefore run negative, which is
what makes the sum of every balance zero.
"""

from __future__ import annotations

from niuniu.ledger.v1 import ledger_pb2
from niuniu.wallet.v1 import events_pb2 as wallet_pb2

PLAYER_PREFIX = "player:"
EXTERNAL_PREFIX = "external:"
CASHIER = "external:cashier"
MAX_ACCOUNT_CHARS = 200

SYSTEM_ACCOUNTS: dict[str, ledger_pb2.AccountType.ValueType] = {
    "house": ledger_pb2.ACCOUNT_TYPE_HOUSE_EQUITY,
    "commission_revenue": ledger_pb2.ACCOUNT_TYPE_REVENUE,
    "fees": ledger_pb2.ACCOUNT_TYPE_REVENUE,
    "rebate_expense": ledger_pb2.ACCOUNT_TYPE_EXPENSE,
    "jackpot_pool": ledger_pb2.ACCOUNT_TYPE_JACKPOT_LIABILITY,
}

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
    if account in SYSTEM_ACCOUNTS:
        return SYSTEM_ACCOUNTS[account]
    for prefix, kind in (
        (PLAYER_PREFIX, ledger_pb2.ACCOUNT_TYPE_PLAYER_LIABILITY),
        (EXTERNAL_PREFIX, ledger_pb2.ACCOUNT_TYPE_EXTERNAL_ASSET),
    ):
        if account.startswith(prefix):
            if not account.removeprefix(prefix):
                raise AccountError(f"{account!r} names no {prefix[:-1]}")
            return kind
    raise AccountError(f"{account!r} is not in the chart of accounts")


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


def player_account(subject: str) -> str:
    """The ledger account of a player token's subject (the subject may already be prefixed)."""
    return subject if subject.startswith(PLAYER_PREFIX) else PLAYER_PREFIX + subject
