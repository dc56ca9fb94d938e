"""Helpers shared by the end-to-end tests of every variant: clients, a background
WatchTable collector, and the money checks every test ends with."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import grpc
import pytest
from google.protobuf import text_format
from niuniu.ledger.v1 import ledger_pb2
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from players import Clients, Player, all_balances, clients
from stack import BIN, Stack

from backbone import tls

EXTERNAL = "external:cashier"
TEST_DECKS_ENV = "NIUNIU_RNG_TEST_DECKS"  # the rng takes test decks and envelopes (docs/fairness.md §9)
WAIT_S = 120.0
FULL_LENGTH_ENV = "NIUNIU_E2E_FULL"


def game_length(ci: int, full: int) -> int:
    """How many rounds a long game plays: ``ci`` in the suite (sized for its 30-minute aim),
    ``full`` with NIUNIU_E2E_FULL=1 (``NIUNIU_E2E_FULL=1 scripts/test tests/e2e``), the length
    the game was first shown at. The checks are the same either way."""
    return full if os.environ.get(FULL_LENGTH_ENV) == "1" else ci


@contextlib.contextmanager
def env_var(name: str, value: str | None) -> Iterator[None]:
    """Set (or, with None, unset) an environment variable for the block: e.g. before a module's stack starts."""
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.asynccontextmanager
async def connect(stack: Stack) -> AsyncIterator[Clients]:
    """Channels to the stack's wallet, table and ledger: mutual TLS with the operator's certificate
    where the test process names a CA (NIUNIU_TLS_CA_FILE, backbone/tls.py), plaintext otherwise."""
    async with (
        tls.aio_channel(stack.addr("wallet"), None) as w,
        tls.aio_channel(stack.addr("table"), None) as t,
        tls.aio_channel(stack.addr("ledger"), None) as lg,
    ):
        yield clients(w, t, lg)


class Watcher:
    """Collects one player's WatchTable stream in the background, reconnecting after a restart."""

    def __init__(self, c: Clients, player: Player, table_id: str) -> None:
        self.c, self.player, self.table_id = c, player, table_id
        self.updates: list[table_pb2.TableUpdate] = []
        self.position = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                request = table_pb2.WatchTableRequest(table_id=self.table_id, after_position=self.position)
                async for update in self.c.table.WatchTable(request, metadata=self.player.auth):
                    self.updates.append(update)
                    self.position = update.position
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.OUT_OF_RANGE:
                    self.position = 0  # a position the table no longer keeps: from the current round again
                await asyncio.sleep(0.2)  # the table is restarting: resume from the last position

    async def wait_for(
        self, predicate: Callable[[table_pb2.TableUpdate], bool], timeout_s: float = WAIT_S
    ) -> table_pb2.TableUpdate:
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            for update in self.updates[seen:]:
                if predicate(update):
                    return update
            seen = len(self.updates)
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.player.name}: no matching update on {self.table_id} within {timeout_s}s")

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def kind(update: table_pb2.TableUpdate) -> str:
    return update.WhichOneof("update") or ""


def update_is(update_kind: str, round_id: str) -> Callable[[table_pb2.TableUpdate], bool]:
    """A ``Watcher.wait_for`` predicate: an update of this kind for this round."""
    return lambda u: kind(u) == update_kind and u.round_id == round_id


async def open_holds(c: Clients, players: Sequence[Player]) -> int:
    total = 0
    for p in players:
        page = await c.wallet.ListHolds(wallet_pb2.ListHoldsRequest(account=p.account), metadata=c.admin)
        total += len(page.holds)
    return total


async def settle_everything(c: Clients, players: Sequence[Player]) -> None:
    deadline = time.monotonic() + WAIT_S
    while await open_holds(c, players):
        assert time.monotonic() < deadline, "holds still open long after their rounds ended"
        await asyncio.sleep(0.2)


def total_money(balances: dict[str, tuple[int, int]]) -> int:
    return sum(available + held for account, (available, held) in balances.items() if account != EXTERNAL)


async def ledger_matches_wallet(c: Clients) -> None:
    """Wait for the ledger to journal everything, then its trial balance must be zero."""
    deadline = time.monotonic() + WAIT_S
    while True:
        wallet = await all_balances(c)
        trial = await c.ledger.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=c.auditor)
        ledger: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for row in trial.rows:
            ledger[row.account][0 if row.bucket == 1 else 1] += row.balance_minor
        assert trial.imbalance_minor == 0
        if {a: tuple(v) for a, v in ledger.items() if any(v)} == {a: v for a, v in wallet.items() if any(v)}:
            return
        assert time.monotonic() < deadline, f"ledger never caught up with the wallet: {dict(ledger)} vs {wallet}"
        await asyncio.sleep(0.5)


def card_updates_are_reveals(updates: Sequence[table_pb2.TableUpdate]) -> None:
    """No update but a hand's own reveal carries a card, and no hand is revealed before the reveal phase."""
    revealing: set[str] = set()
    for update in updates:
        text = text_format.MessageToString(update)
        if kind(update) == "phase_changed" and update.phase_changed.phase == "revealing":
            revealing.add(update.round_id)
        if kind(update) == "hand_revealed":
            assert update.round_id in revealing, f"hand of {update.round_id} shown before its reveal phase"
        else:
            assert "cards:" not in text, f"an update other than a reveal carried cards: {text}"


async def expect_refused(call: Awaitable[object], code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == code, refused.value
    assert reason in (refused.value.details() or ""), refused.value.details()


async def audit_replay_is_clean(stack: Stack) -> None:
    """``niuniu-audit replay``: the journal rebuilt from Kafka equals the live one and the wallet."""
    argv = ["replay", "--schema", stack.schema_of("ledger"), "--topic-prefix", stack.prefix]
    argv += ["--wallet", stack.addr("wallet"), "--dsn", stack.infra["DATABASE_URL"], "--no-progress"]
    audit = await asyncio.create_subprocess_exec(
        str(BIN / "niuniu-audit"), *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    report, _ = await audit.communicate()
    text = report.decode()
    assert audit.returncode == 0, text
    assert "differences: 0" in text and "RESULT: OK" in text, text


async def verify_round_in_journal(stack: Stack, round_id: str, *, recompute: bool = True) -> str:
    """``niuniu-audit verify-round``: the round's journal against its settlement (and, with
    ``recompute``, the deal and settlement recomputed from the revealed seed). Returns the report."""
    argv = ["verify-round", round_id, "--schema", stack.schema_of("ledger"), "--topic-prefix", stack.prefix]
    argv += ["--dsn", stack.infra["DATABASE_URL"], "--table", stack.addr("table")]
    if not recompute:  # e.g. a round dealt from a test deck or envelope: it cannot verify from its seed
        argv.append("--no-recompute")
    checker = await asyncio.create_subprocess_exec(
        str(BIN / "niuniu-audit"), *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await checker.communicate()
    text = out.decode()
    assert checker.returncode == 0 and "RESULT: OK" in text, text
    if recompute:
        assert "recompute: done" in text, text
    return text


async def outcome(call: Awaitable[object], accepted: str) -> str:
    """``accepted``, or the refusal's reason code (refusals of a well-formed call are FAILED_PRECONDITION)."""
    try:
        await call
        return accepted
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
        return (error.details() or "").split(":")[0]


async def revealed_round(
    c: Clients, table_id: str, round_id: str, auth: tuple[tuple[str, str]] | None = None
) -> table_pb2.RoundView:
    """The round once it has ended and its seed is revealed, as ``auth`` sees it (the admin by default)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        view: table_pb2.RoundView = await c.table.GetRound(
            table_pb2.GetRoundRequest(table_id=table_id, round_id=round_id), metadata=auth or c.admin
        )
        if view.server_seed:
            return view
        assert time.monotonic() < deadline, f"seed of {round_id} never revealed"
        await asyncio.sleep(0.1)
