"""Clients for end-to-end tests: players registered through the wallet, an admin, an auditor."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from niuniu.ledger.v1 import ledger_pb2_grpc
from niuniu.table.v1 import table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

from backbone.auth import Role, Tokens, bearer

TOKENS = Tokens.development()


@dataclass
class Player:
    name: str
    token: str
    account: str

    @property
    def auth(self) -> tuple[tuple[str, str]]:
        return bearer(self.token)


@dataclass
class Clients:
    wallet: wallet_pb2_grpc.WalletAsyncStub
    table: table_pb2_grpc.TableAsyncStub
    ledger: ledger_pb2_grpc.LedgerAsyncStub
    admin: tuple[tuple[str, str]]
    auditor: tuple[tuple[str, str]]


def clients(wallet: grpc.aio.Channel, table: grpc.aio.Channel, ledger: grpc.aio.Channel) -> Clients:
    # Staff tokens are minted with the deployment's secret, as an operator's tooling would.
    return Clients(
        wallet_pb2_grpc.WalletStub(wallet),
        table_pb2_grpc.TableStub(table),
        ledger_pb2_grpc.LedgerStub(ledger),
        bearer(TOKENS.issue("e2e-admin", Role.ADMIN)),
        bearer(TOKENS.issue("e2e-auditor", Role.AUDITOR)),
    )


async def register(c: Clients, name: str, deposit_minor: int) -> Player:
    password = f"{name}-secret-pw"
    await c.wallet.Register(
        wallet_pb2.RegisterRequest(
            request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password=password
        )
    )
    login = await c.wallet.Login(wallet_pb2.LoginRequest(username=name, password=password))
    if deposit_minor:
        await c.wallet.Deposit(
            wallet_pb2.DepositRequest(request_id=f"dep-{name}", account=login.account, amount_minor=deposit_minor),
            metadata=c.admin,
        )
    return Player(name, login.token, login.account)


async def all_balances(c: Clients) -> dict[str, tuple[int, int]]:
    balances: dict[str, tuple[int, int]] = {}
    token = ""
    while True:
        page = await c.wallet.ListBalances(
            wallet_pb2.ListBalancesRequest(page_size=500, page_token=token), metadata=c.auditor
        )
        for b in page.balances:
            balances[b.account] = (b.available_minor, b.held_minor)
        token = page.next_page_token
        if not token:
            return balances
