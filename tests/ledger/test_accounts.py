"""One chart of accounts (bull.accounts) read the same way by the rules, the wallet and the ledger."""

from __future__ import annotations

import uuid

import pytest
from niuniu.ledger.v1 import ledger_pb2

from backbone.errors import FailedPrecondition
from bull import accounts as chart
from bull import money
from services.ledger import accounts as ledger_accounts
from services.wallet import domain as wallet


def test_every_account_type_is_one_ledger_enum_value_and_back() -> None:
    proto_values = set(ledger_pb2.AccountType.values()) - {ledger_pb2.ACCOUNT_TYPE_UNSPECIFIED}
    mapped = [ledger_accounts.PROTO_TYPES[t] for t in chart.AccountType]
    assert len(set(mapped)) == len(mapped) == len(proto_values)
    assert set(mapped) == proto_values


def test_the_system_accounts_keep_their_names_and_ledger_types() -> None:
    # The names are stored in the wallet's and the ledger's tables and in every settlement
    # event: renaming one is a data migration, not a refactoring.
    assert dict(ledger_accounts.SYSTEM_ACCOUNTS) == {
        "house": ledger_pb2.ACCOUNT_TYPE_HOUSE_EQUITY,
        "commission_revenue": ledger_pb2.ACCOUNT_TYPE_REVENUE,
        "fees": ledger_pb2.ACCOUNT_TYPE_REVENUE,
        "rebate_expense": ledger_pb2.ACCOUNT_TYPE_EXPENSE,
        "jackpot_pool": ledger_pb2.ACCOUNT_TYPE_JACKPOT_LIABILITY,
    }
    assert chart.CASHIER == ledger_accounts.CASHIER == wallet.CASHIER == "external:cashier"
    assert money.SYSTEM_ACCOUNTS == chart.SYSTEM_ACCOUNTS
    assert (money.HOUSE, money.JACKPOT_POOL, money.FEES) == (chart.HOUSE, chart.JACKPOT_POOL, chart.FEES)


def test_the_wallet_opens_every_account_of_the_chart_with_the_kind_it_reads_back() -> None:
    for account, kind in chart.OPENING_ACCOUNTS.items():
        assert wallet.account_kind(account) is kind
        assert ledger_accounts.is_account(account)
    player = chart.player_account(str(uuid.uuid4()))
    assert wallet.account_kind(player) is chart.AccountKind.PLAYER
    assert ledger_accounts.account_type(player) == ledger_pb2.ACCOUNT_TYPE_PLAYER_LIABILITY


def test_only_a_players_available_balance_is_bounded_below_by_zero() -> None:
    assert [k for k in chart.AccountKind if not k.may_go_below_zero] == [chart.AccountKind.PLAYER]


def test_the_wallet_refuses_a_player_below_zero_and_lets_the_house_run_negative() -> None:
    alice = chart.player_account(str(uuid.uuid4()))
    states = {
        alice: wallet.AccountState(alice, chart.AccountKind.PLAYER, 100),
        chart.HOUSE: wallet.AccountState(chart.HOUSE, chart.AccountKind.SYSTEM),
    }
    pays_house = wallet.transfer(
        "m1", "win", (chart.HOUSE, wallet.Bucket.AVAILABLE), (alice, wallet.Bucket.AVAILABLE), 250
    )
    after = wallet.apply_movements(states, [pays_house])
    assert (after[chart.HOUSE].available_minor, after[alice].available_minor) == (-250, 350)
    overdraws = wallet.transfer(
        "m2", "loss", (alice, wallet.Bucket.AVAILABLE), (chart.HOUSE, wallet.Bucket.AVAILABLE), 101
    )
    with pytest.raises(FailedPrecondition) as refused:
        wallet.apply_movements(states, [overdraws])
    assert refused.value.reason == "INSUFFICIENT_FUNDS"


@pytest.mark.parametrize(
    ("account", "problem"),
    [
        ("player:", "names no player"),
        ("external:", "names no external"),
        ("houses", "not in the chart"),
        ("", "not an account name"),
        (" house", "not an account name"),
    ],
)
def test_names_outside_the_chart_are_refused_by_the_ledger(account: str, problem: str) -> None:
    assert chart.account_type(account) is None or account != account.strip()
    with pytest.raises(ledger_accounts.AccountError, match=problem):
        ledger_accounts.account_type(account)
