"""``niuniu-audit``'s calls where the services serve mutual TLS (pure: in-process servers).

A wallet and a table that require a client certificate of their CA (as deployed with
``NIUNIU_TLS_CA_FILE``): the audit's Login, its ListBalances pages and verify-round's
GetRound all go through, presenting the operator's certificate; with TLS off in the
audit's environment the same calls are refused, so the calls above really used it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc
from played_rounds import played_round

from backbone import keys, tls
from backbone.auth import Role
from services.ledger import audit_login
from services.ledger.audit_config import AuditError
from services.ledger.recompute import recompute_via_table
from services.ledger.reconcile import GrpcWalletBalances, WalletUnavailable

TOKEN = "auditor-token"


class Wallet(wallet_pb2_grpc.WalletServicer):
    async def Login(self, request: Any, context: Any) -> wallet_pb2.LoginResponse:
        assert (request.username, request.password) == ("aud", "secret")
        return wallet_pb2.LoginResponse(token=TOKEN, role=Role.AUDITOR.value)

    async def ListBalances(self, request: Any, context: Any) -> wallet_pb2.ListBalancesResponse:
        assert dict(context.invocation_metadata())["authorization"] == f"Bearer {TOKEN}"
        item = wallet_pb2.AccountBalance(account="player:a", available_minor=700, held_minor=300)
        return wallet_pb2.ListBalancesResponse(balances=[item])


class Table(table_pb2_grpc.TableServicer):
    def __init__(self, view: table_pb2.RoundView) -> None:
        self.view = view

    async def GetRound(self, request: Any, context: Any) -> table_pb2.RoundView:
        assert dict(context.invocation_metadata())["authorization"] == f"Bearer {TOKEN}"
        return self.view


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A wallet and a table on one TLS server requiring client certificates; the audit's TLS env set."""
    keys.generate(tmp_path, tls=True)
    lines = (tmp_path / "env").read_text().splitlines()
    material = {k: v for k, v in (line.removeprefix("export ").split("=", 1) for line in lines) if "TLS" in k}
    server = grpc.aio.server()
    wallet_pb2_grpc.add_WalletServicer_to_server(Wallet(), server)  # type: ignore[abstract]  # two methods of many
    table_pb2_grpc.add_TableServicer_to_server(Table(played_round()[0]), server)  # type: ignore[abstract]
    credentials = tls.server_credentials("wallet", material)
    assert credentials is not None
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    for name in ("NIUNIU_TLS_CA_FILE", "NIUNIU_TLS_CLIENT_CERT_FILE", "NIUNIU_TLS_CLIENT_KEY_FILE"):
        monkeypatch.setenv(name, material[name])
    try:
        yield f"localhost:{port}", material
    finally:
        await server.stop(None)


async def test_login_balances_and_get_round_go_over_tls(served: tuple[str, dict[str, str]]) -> None:
    address, _ = served
    assert await audit_login.login(address, "aud", "secret") == TOKEN
    balances = await GrpcWalletBalances(address, TOKEN).balances()
    assert [(b.available_minor, b.held_minor) for b in balances.values()] == [(700, 300)]
    _, evidence = played_round()
    assert await recompute_via_table(address, TOKEN)(evidence) == []  # the round re-dealt, nothing found


async def test_without_the_tls_settings_the_same_calls_are_refused(
    served: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, _ = served
    monkeypatch.delenv("NIUNIU_TLS_CA_FILE")
    with pytest.raises(AuditError, match="UNAVAILABLE"):
        await audit_login.login(address, "aud", "secret")
    with pytest.raises(WalletUnavailable, match="UNAVAILABLE"):
        await GrpcWalletBalances(address, TOKEN).balances()
    _, evidence = played_round()
    [finding] = await recompute_via_table(address, TOKEN)(evidence)
    assert "did not answer: UNAVAILABLE" in str(finding)
