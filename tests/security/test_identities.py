"""Who may do what, against the four real service processes (trusting the development keys).

Forgeries: a token signed by any key other than the issuer's; a service's own key
vouching for an admin or a player; the old shared HS256 secret; ``alg: none``; the
issuer's public key used as an HMAC secret. A service's own credentials cannot act as
an admin or a player, nobody but the table draws from the rng, and a player can neither
read nor touch another player's accounts, holds, movements, limits, bets or statement.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import jwt
import pytest
from niuniu.ledger.v1 import ledger_pb2
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import Watcher, connect, kind
from players import TOKENS, Clients, register
from stack import Stack

from backbone.auth import ISSUER, Role, SigningKey, Tokens, bearer, service_owner

pytestmark = pytest.mark.integration

OLD_DEV_SECRET = "niuniu-dev-secret-not-for-production-use"  # the shared HS256 secret of old
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
CARD_CODES = {rank + suit for rank in "A23456789TJQK" for suit in "SHDC"}
Metadata = tuple[tuple[str, str]]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_by(key: SigningKey, subject: str, role: str, *, kid: str | None = None, iss: str | None = None) -> str:
    now = int(time.time())
    claims = {"sub": subject, "role": role, "iss": iss or key.owner, "iat": now, "exp": now + 600}
    return jwt.encode(claims, key.private, algorithm="EdDSA", headers={"kid": kid or key.trusted.kid})


def forgeries(subject: str, role: str) -> dict[str, str]:
    """Tokens for (subject, role) that no verifier of the stack may accept."""
    issuer = SigningKey.development(ISSUER)  # what the stack trusts for user tokens
    now = int(time.time())
    claims = {"sub": subject, "role": role, "iss": ISSUER, "iat": now, "exp": now + 600}
    public_raw = issuer.trusted.jwk()["x"].encode()
    none_header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": issuer.trusted.kid}).encode())
    return {
        "a fresh key": Tokens.ephemeral().issue(subject, Role(role)) if role != "service" else "",
        "a fresh key under the issuer's kid": signed_by(
            SigningKey.generate(ISSUER), subject, role, kid=issuer.trusted.kid
        ),
        "the table's key as issuer": signed_by(
            SigningKey.development(service_owner("table")), subject, role, iss=ISSUER
        ),
        "the table's key under the issuer's kid": signed_by(
            SigningKey.development(service_owner("table")), subject, role, kid=issuer.trusted.kid, iss=ISSUER
        ),
        "the old shared HS256 secret": jwt.encode({**claims, "iss": "niuniu"}, OLD_DEV_SECRET, algorithm="HS256"),
        "the issuer's public key as HMAC secret": jwt.encode(
            claims, public_raw.decode() * 2, algorithm="HS256", headers={"kid": issuer.trusted.kid}
        ),
        "alg none": f"{none_header}.{_b64(json.dumps(claims).encode())}.",
    }


async def refused(call: Awaitable[Any], *codes: grpc.StatusCode) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() in codes, info.value
    return info.value


@pytest.fixture
async def c(stack: Stack) -> AsyncIterator[Clients]:
    async with connect(stack) as clients:
        yield clients


@pytest.fixture
async def rng(stack: Stack) -> AsyncIterator[rng_pb2_grpc.RngAsyncStub]:
    async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
        yield rng_pb2_grpc.RngStub(channel)


async def test_a_token_signed_by_any_key_other_than_the_issuers_is_refused(stack: Stack, c: Clients) -> None:
    victim = await register(c, f"victim{uuid.uuid4().hex[:8]}", 1_000)
    for how, token in forgeries("forged-admin", "admin").items():
        if not token:
            continue
        auth = bearer(token)
        deposit = wallet_pb2.DepositRequest(
            request_id=f"f-{uuid.uuid4().hex}", account=victim.account, amount_minor=10**6
        )
        error = await refused(c.wallet.Deposit(deposit, metadata=auth), UNAUTHENTICATED)
        assert "TOKEN_INVALID" in (error.details() or ""), how
        limits = ev.TableLimits(min_bet_minor=100, max_bet_minor=500, chips_minor=[100], betting_seconds=5)
        create = table_pb2.CreateTableRequest(
            table_id=f"forged-{uuid.uuid4().hex[:6]}", variant="golden_bull", limits=limits
        )
        await refused(c.table.CreateTable(create, metadata=auth), UNAUTHENTICATED)
        await refused(c.ledger.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=auth), UNAUTHENTICATED)
        await refused(c.wallet.ListBalances(wallet_pb2.ListBalancesRequest(), metadata=auth), UNAUTHENTICATED)
    for token in forgeries("forged-auditor", "auditor").values():
        if token:
            await refused(
                c.ledger.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=bearer(token)), UNAUTHENTICATED
            )
    balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=victim.auth)
    assert (balance.available_minor, balance.held_minor) == (1_000, 0)
    # The control: the issuer's own token is accepted.
    await c.wallet.Deposit(
        wallet_pb2.DepositRequest(request_id=f"ok-{uuid.uuid4().hex}", account=victim.account, amount_minor=1),
        metadata=c.admin,
    )


async def test_a_services_credentials_cannot_act_as_admin_or_player(stack: Stack, c: Clients) -> None:
    alice = await register(c, f"alice{uuid.uuid4().hex[:8]}", 10_000)
    bob = await register(c, f"bob{uuid.uuid4().hex[:8]}", 10_000)
    account_id = jwt.decode(alice.token, options={"verify_signature": False})["sub"]
    for service in ("table", "rng", "wallet", "ledger"):
        own = bearer(TOKENS.service_token(service))  # signed with that service's own key
        deposit = wallet_pb2.DepositRequest(request_id=f"s-{uuid.uuid4().hex}", account=bob.account, amount_minor=10**6)
        await refused(c.wallet.Deposit(deposit, metadata=own), DENIED)
        withdraw = wallet_pb2.WithdrawRequest(request_id=f"s-{uuid.uuid4().hex}", account=alice.account, amount_minor=1)
        await refused(c.wallet.Withdraw(withdraw, metadata=own), DENIED)
        create = table_pb2.CreateTableRequest(table_id=f"svc-{service}", variant="golden_bull")
        await refused(c.table.CreateTable(create, metadata=own), DENIED)
        await refused(c.ledger.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=own), DENIED)
        if service != "ledger":  # the ledger reconciles with every balance; no other service reads them
            await refused(c.wallet.ListBalances(wallet_pb2.ListBalancesRequest(), metadata=own), DENIED)
        await refused(c.wallet.GetProfile(wallet_pb2.GetProfileRequest(account_id=account_id), metadata=own), DENIED)
        # The service's key vouching for alice (player) or for an admin: not a valid token at all.
        service_key = SigningKey.development(service_owner(service))
        for subject, role in ((account_id, "player"), ("root", "admin"), ("audit", "auditor")):
            for iss in (service_owner(service), ISSUER):
                token = bearer(signed_by(service_key, subject, role, iss=iss))
                await refused(c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=token), UNAUTHENTICATED)
        # ...nor for another service (e.g. the rng's key claiming to be the table, which may hold money).
        for other in ("table", "wallet"):
            if other != service:
                token = bearer(signed_by(service_key, f"service:{other}", "service"))
                hold = wallet_pb2.PlaceHoldRequest(
                    hold_id=f"h-{uuid.uuid4().hex}", account=alice.account, amount_minor=1, reason="bet",
                    round_id="r1", expires_at_unix_ms=int(time.time() * 1000) + 60_000,
                )  # fmt: skip
                await refused(c.wallet.PlaceHold(hold, metadata=token), UNAUTHENTICATED)
    for who in (alice, bob):
        balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=who.auth)
        assert (balance.available_minor, balance.held_minor) == (10_000, 0)


async def test_a_forged_or_wrong_role_caller_gets_nothing_from_rng_draw(
    c: Clients, rng: rng_pb2_grpc.RngAsyncStub
) -> None:
    player = await register(c, f"drawer{uuid.uuid4().hex[:8]}", 0)
    table = bearer(TOKENS.service_token("table"))
    round_id = f"draw-{uuid.uuid4().hex[:10]}"
    await rng.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="deck"), metadata=table)
    callers: dict[str, Metadata | tuple[()]] = {
        "nobody": (),
        "a player": player.auth,
        "an admin": c.admin,
        "an auditor": c.auditor,
        **{f"service:{s}": bearer(TOKENS.service_token(s)) for s in ("wallet", "ledger", "rng")},
        **{f"table forged with {how}": bearer(t) for how, t in forgeries("service:table", "service").items() if t},
        "table token from a fresh key": bearer(Tokens.ephemeral(service_owner("table")).service_token("table")),
    }
    request = rng_pb2.DrawRequest(round_id=round_id, deck_size=52, client_seed="")
    for who, metadata in callers.items():
        error = await refused(rng.Draw(request, metadata=metadata), UNAUTHENTICATED, DENIED)
        details = error.details() or ""
        assert not any(code in details.split() for code in CARD_CODES), (who, details)
        trailers = " ".join(str(v) for _, v in error.trailing_metadata() or ())
        assert not any(f" {code} " in f" {trailers} " for code in CARD_CODES), (who, trailers)
        await refused(
            rng.Reveal(rng_pb2.RevealRequest(round_id=round_id), metadata=metadata),
            UNAUTHENTICATED,
            DENIED,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
    drawn = await rng.Draw(request, metadata=table)  # the table, and only the table, gets the deck
    assert len(drawn.cards) == 52


async def test_a_player_cannot_read_or_touch_another_players_anything(stack: Stack, c: Clients) -> None:
    alice = await register(c, f"alice{uuid.uuid4().hex[:8]}", 50_000)
    bob = await register(c, f"bob{uuid.uuid4().hex[:8]}", 50_000)
    alice_id = jwt.decode(alice.token, options={"verify_signature": False})["sub"]
    table_id = f"iso-{uuid.uuid4().hex[:6]}"
    limits = ev.TableLimits(
        min_bet_minor=100, max_bet_minor=5_000, chips_minor=[100], betting_seconds=30,
        reveal_interval_ms=10, pause_between_rounds_ms=100,
    )  # fmt: skip
    await c.table.CreateTable(
        table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=limits), metadata=c.admin
    )
    alice_watch, bob_watch = Watcher(c, alice, table_id), Watcher(c, bob, table_id)
    try:
        opened = await alice_watch.wait_for(lambda u: kind(u) == "round_opened")
        bet_id = f"{opened.round_id}.alice"
        receipt = await c.table.PlaceBet(
            table_pb2.PlaceBetRequest(
                command_id=bet_id, table_id=table_id, round_id=opened.round_id, area="area_1", amount_minor=500
            ),
            metadata=alice.auth,
        )
        assert receipt.hold_minor >= 500
        await alice_watch.wait_for(lambda u: kind(u) == "my_bet_placed")
        a = alice.account
        wallet_reads: list[Awaitable[object]] = [
            c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(account=a), metadata=bob.auth),
            c.wallet.ListHolds(wallet_pb2.ListHoldsRequest(account=a), metadata=bob.auth),
            c.wallet.ListMovements(wallet_pb2.ListMovementsRequest(account=a), metadata=bob.auth),
            c.wallet.GetProfile(wallet_pb2.GetProfileRequest(account_id=alice_id), metadata=bob.auth),
            c.wallet.GetResponsiblePlay(wallet_pb2.GetResponsiblePlayRequest(account=a), metadata=bob.auth),
            c.wallet.ListBalances(wallet_pb2.ListBalancesRequest(), metadata=bob.auth),
            c.ledger.Statement(ledger_pb2.StatementRequest(account=a), metadata=bob.auth),
        ]
        wallet_writes: list[Awaitable[object]] = [
            c.wallet.SetLimit(
                wallet_pb2.SetLimitRequest(account=a, kind=wallet_pb2.LIMIT_KIND_DAILY_DEPOSIT, value=100),
                metadata=bob.auth,
            ),
            c.wallet.SelfExclude(wallet_pb2.SelfExcludeRequest(account=a, days=30), metadata=bob.auth),
            c.wallet.Withdraw(
                wallet_pb2.WithdrawRequest(request_id=f"w-{uuid.uuid4().hex}", account=a, amount_minor=100),
                metadata=bob.auth,
            ),
            c.wallet.PlaceHold(
                wallet_pb2.PlaceHoldRequest(
                    hold_id=f"h-{uuid.uuid4().hex}",
                    account=a,
                    amount_minor=100,
                    reason="bet",
                    round_id="r",
                    expires_at_unix_ms=int(time.time() * 1000) + 60_000,
                ),
                metadata=bob.auth,
            ),
        ]
        for call in [*wallet_reads, *wallet_writes]:
            await refused(call, DENIED)
        table_writes: list[Awaitable[object]] = [
            c.table.CancelBet(
                table_pb2.CancelBetRequest(command_id=f"x-{uuid.uuid4().hex}", table_id=table_id, bet_id=bet_id),
                metadata=bob.auth,
            ),
            c.table.ChangeBet(
                table_pb2.ChangeBetRequest(
                    command_id=f"x-{uuid.uuid4().hex}", table_id=table_id, bet_id=bet_id, amount_minor=0
                ),
                metadata=bob.auth,
            ),
        ]
        for call in table_writes:
            await refused(call, DENIED, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
        seen_by_bob = await c.table.GetRound(
            table_pb2.GetRoundRequest(table_id=table_id, round_id=opened.round_id), metadata=bob.auth
        )
        assert list(seen_by_bob.my_bets) == []
        seen_by_alice = await c.table.GetRound(
            table_pb2.GetRoundRequest(table_id=table_id, round_id=opened.round_id), metadata=alice.auth
        )
        assert [b.bet_id for b in seen_by_alice.my_bets] == [receipt.bet_id]  # stored per player (scoped_id)
        assert not [u for u in bob_watch.updates if kind(u) == "my_bet_placed"]
        # Nothing of alice's changed: her bet's hold is still there, her money, limits and exclusion as before.
        balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=alice.auth)
        assert (balance.available_minor, balance.held_minor) == (50_000 - receipt.hold_minor, receipt.hold_minor)
        play = await c.wallet.GetResponsiblePlay(wallet_pb2.GetResponsiblePlayRequest(), metadata=alice.auth)
        assert not play.self_excluded and all(limit.value == 0 for limit in play.limits)
        assert (await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=bob.auth)).available_minor == 50_000
    finally:
        await alice_watch.stop()
        await bob_watch.stop()


async def test_reflection_never_lists_the_test_only_rpcs(stack: Stack) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
        # What reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo is, typed
        # (its stubs leave the method untyped and accept only a synchronous channel).
        info: grpc.aio.StreamStreamMultiCallable[
            reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
        ] = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )

        async def ask(request: reflection_pb2.ServerReflectionRequest) -> reflection_pb2.ServerReflectionResponse:
            responses = info(iter([request]))
            async for response in responses:
                return response
            raise AssertionError("no reflection answer")

        services = await ask(reflection_pb2.ServerReflectionRequest(list_services=""))
        assert "niuniu.rng.v1.Rng" in [s.name for s in services.list_services_response.service]
        described = await ask(reflection_pb2.ServerReflectionRequest(file_containing_symbol="niuniu.rng.v1.Rng"))
        from google.protobuf import descriptor_pb2

        methods = set()
        for raw in described.file_descriptor_response.file_descriptor_proto:
            proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
            methods |= {m.name for s in proto.service for m in s.method}
        assert {"Commit", "Draw", "Reveal"} <= methods
        assert not methods & {"SetTestDeck", "SetTestEnvelope"}
        missing = await ask(
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="niuniu.rng.v1.Rng.SetTestDeck")
        )
        assert missing.HasField("error_response")


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


async def test_services_listen_on_loopback_only(stack: Stack) -> None:
    # 127.0.0.1, ::1, and 127.0.0.1 as an IPv4-mapped IPv6 address (::ffff:127.0.0.1)
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    for service in ("wallet", "table", "rng", "ledger"):
        for port in (stack.ports[service], stack.metrics_ports[service]):
            addresses = listening_addresses(port)
            assert addresses, f"{service}: nothing listens on {port}"
            assert addresses <= loopback, f"{service} listens on {addresses} (port {port})"
