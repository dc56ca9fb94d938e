"""Reconciliation: compare two journals entry by entry, and ledger balances with the wallet's.

The comparisons are pure (they take entries and balances, not connections), so they
are tested without infrastructure; the wallet's balances come through a
``BalanceSource``, which the audit command fills from the wallet's gRPC
``ListBalances`` and a test fills by hand.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import grpc
from google.protobuf import message_factory

from backbone import tls
from backbone.auth import bearer
from services.ledger.accounts import PLAYER_PREFIX, is_account
from services.ledger.journal import Line
from services.ledger.queries import EntryRecord

WALLET_PROTO_MODULE = "niuniu.wallet.v1.wallet_pb2"
WALLET_PAGE_SIZE = 500
MAX_WALLET_PAGES = 100_000
WALLET_TIMEOUT_S = 10.0
COMPARED_FIELDS = tuple(f.name for f in fields(EntryRecord) if f.name not in ("entry_id", "lines"))


@dataclass(frozen=True, slots=True)
class Difference:
    """One finding: ``subject`` names the entry or account, ``live`` and ``other`` the two values."""

    check: str
    subject: str
    what: str
    live: str
    other: str
    other_label: str = "replay"

    def __str__(self) -> str:
        return f"[{self.check}] {self.subject}: {self.what}: live={self.live} {self.other_label}={self.other}"


@dataclass
class JournalComparison:
    compared: int = 0
    live_entries: int = 0
    replayed_entries: int = 0
    live_out_of_scope: int = 0
    replayed_out_of_scope: int = 0
    differences: list[Difference] = field(default_factory=list)


def _line_text(line: Line | None) -> str:
    if line is None:
        return "(none)"
    return f"{line.account}/{line.bucket} debit={line.debit_minor} credit={line.credit_minor}"


def compare_entries(live: EntryRecord, other: EntryRecord) -> list[Difference]:
    found: list[Difference] = []
    for name in COMPARED_FIELDS:
        a, b = getattr(live, name), getattr(other, name)
        if a != b:
            found.append(Difference("journal", f"entry {live.entry_id}", name, str(a), str(b)))
    for n in range(max(len(live.lines), len(other.lines))):
        a_line = live.lines[n] if n < len(live.lines) else None
        b_line = other.lines[n] if n < len(other.lines) else None
        if a_line != b_line:
            found.append(
                Difference("journal", f"entry {live.entry_id}", f"line {n}", _line_text(a_line), _line_text(b_line))
            )
    return found


async def _next(
    iterator: AsyncIterator[EntryRecord], keep: Callable[[EntryRecord], bool], counts: list[int]
) -> EntryRecord | None:
    async for entry in iterator:
        counts[0] += 1
        if keep(entry):
            return entry
        counts[1] += 1
    return None


async def compare_journals(
    live: AsyncIterable[EntryRecord],
    replayed: AsyncIterable[EntryRecord],
    *,
    live_in_scope: Callable[[EntryRecord], bool] = lambda e: True,
    replayed_in_scope: Callable[[EntryRecord], bool] = lambda e: True,
) -> JournalComparison:
    """Merge two journals ordered by entry id (code-point order) and report every difference.

    An entry outside a side's scope (the live consumer ran ahead of the replay, or lags
    behind it) is counted but not compared.
    """
    result = JournalComparison()
    live_it, replay_it = aiter(live), aiter(replayed)
    live_counts, replay_counts = [0, 0], [0, 0]
    # Side by side: each journal's first read sorts it whole (``queries.iter_entries``).
    a, b = await asyncio.gather(
        _next(live_it, live_in_scope, live_counts), _next(replay_it, replayed_in_scope, replay_counts)
    )
    while a is not None or b is not None:
        if b is None or (a is not None and a.entry_id < b.entry_id):
            assert a is not None
            result.differences.append(
                Difference("journal", f"entry {a.entry_id}", "only in the live journal", _summary(a), "(missing)")
            )
            a = await _next(live_it, live_in_scope, live_counts)
        elif a is None or b.entry_id < a.entry_id:
            result.differences.append(
                Difference("journal", f"entry {b.entry_id}", "missing from the live journal", "(missing)", _summary(b))
            )
            b = await _next(replay_it, replayed_in_scope, replay_counts)
        else:
            result.compared += 1
            result.differences.extend(compare_entries(a, b))
            a = await _next(live_it, live_in_scope, live_counts)
            b = await _next(replay_it, replayed_in_scope, replay_counts)
    result.live_entries, result.live_out_of_scope = live_counts
    result.replayed_entries, result.replayed_out_of_scope = replay_counts
    return result


def _summary(entry: EntryRecord) -> str:
    lines = "; ".join(_line_text(line) for line in entry.lines)
    return f"{entry.event_type} {entry.kind} [{lines}]"


def compare_balance_maps(
    check: str, live: Mapping[tuple[str, str], int], other: Mapping[tuple[str, str], int], other_label: str
) -> list[Difference]:
    """Per (account, bucket); a missing key counts as 0."""
    return [
        Difference(
            check, f"{account}/{bucket}", "balance_minor", str(live.get(key, 0)), str(other.get(key, 0)), other_label
        )
        for key in sorted(set(live) | set(other))
        for account, bucket in [key]
        if live.get(key, 0) != other.get(key, 0)
    ]


# --- the wallet's side -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WalletBalance:
    available_minor: int
    held_minor: int
    # The wallet event-store position this balance reflects (0: unknown, compare with the latest).
    as_of_position: int = 0


class BalanceSource(Protocol):
    async def balances(self) -> dict[str, WalletBalance]:
        """Every account the wallet knows, by ledger account name."""
        ...

    async def published_below(self) -> int:
        """Every wallet event with a smaller position is in Kafka now (0: the wallet does not say)."""
        ...


class WalletUnavailable(Exception):
    """The wallet's balances cannot be fetched (no generated stubs, or the service did not answer)."""


def ledger_account(wallet_account: str) -> str:
    """The ledger's name of a wallet account: the wallet may list players by bare id."""
    return wallet_account if is_account(wallet_account) else PLAYER_PREFIX + wallet_account


@dataclass
class WalletComparison:
    accounts_compared: int = 0
    not_listed_by_wallet: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)


def compare_with_wallet(
    ledger: Mapping[tuple[str, str], int],
    wallet: Mapping[str, WalletBalance],
    ledger_as_of: Mapping[int, Mapping[tuple[str, str], int]] | None = None,
) -> WalletComparison:
    """Each account the wallet lists must have the ledger's balances in both buckets.

    A ledger player account the wallet does not list is a difference unless it is
    empty; a system account the wallet does not list is noted, not compared (the
    wallet may keep system accounts out of its listing). A wallet balance taken at a
    known position is compared with ``ledger_as_of[position]`` when given.
    """
    result = WalletComparison()
    for account in sorted(wallet):
        result.accounts_compared += 1
        balance = wallet[account]
        mine_at = (ledger_as_of or {}).get(balance.as_of_position, ledger)
        for bucket, value in (("available", balance.available_minor), ("held", balance.held_minor)):
            mine = mine_at.get((account, bucket), 0)
            if mine != value:
                result.differences.append(
                    Difference("wallet", f"{account}/{bucket}", "balance_minor", str(mine), str(value), "wallet")
                )
    for account in sorted({account for account, _ in ledger} - set(wallet)):
        amounts = {bucket: ledger.get((account, bucket), 0) for bucket in ("available", "held")}
        if not account.startswith(PLAYER_PREFIX):
            result.not_listed_by_wallet.append(account)
        elif any(amounts.values()):
            result.differences.append(
                Difference("wallet", account, "not listed by the wallet", str(amounts), "(absent)", "wallet")
            )
    return result


class GrpcWalletBalances:
    """``ListBalances`` of the wallet service, every page, with an auditor token.

    Coded against the contract ``ListBalances(page_token, page_size) -> repeated
    AccountBalance{account, available_minor, held_minor}, next_page_token,
    store_position`` (the wallet event position the page reflects; optional). The
    method is found by name in the generated module, so the wallet may name its
    service and messages as it likes.
    """

    def __init__(self, address: str, token: str, *, page_size: int = WALLET_PAGE_SIZE) -> None:
        self._address = address
        self._token = token
        self._page_size = page_size

    @staticmethod
    def _method() -> tuple[str, Any, Any]:
        try:
            module = importlib.import_module(WALLET_PROTO_MODULE)
        except ImportError as error:
            raise WalletUnavailable(f"{WALLET_PROTO_MODULE} is not generated yet ({error})") from None
        for service in module.DESCRIPTOR.services_by_name.values():
            method = service.methods_by_name.get("ListBalances")
            if method is not None:
                return (
                    f"/{service.full_name}/ListBalances",
                    message_factory.GetMessageClass(method.input_type),
                    message_factory.GetMessageClass(method.output_type),
                )
        raise WalletUnavailable(f"no ListBalances method in {WALLET_PROTO_MODULE}")

    async def balances(self) -> dict[str, WalletBalance]:
        path, request_type, response_type = self._method()
        found: dict[str, WalletBalance] = {}
        async with tls.aio_channel(self._address, None) as channel:
            call = channel.unary_unary(
                path, request_serializer=request_type.SerializeToString, response_deserializer=response_type.FromString
            )
            page_token = ""
            for _ in range(MAX_WALLET_PAGES):
                request = request_type(page_token=page_token, page_size=self._page_size)
                try:
                    response = await call(request, metadata=bearer(self._token), timeout=WALLET_TIMEOUT_S)
                except grpc.aio.AioRpcError as error:
                    raise self._unavailable(error) from None
                position = int(getattr(response, "store_position", 0))
                for item in _balance_items(response):
                    found[ledger_account(item.account)] = WalletBalance(
                        int(item.available_minor), int(item.held_minor), position
                    )
                page_token = str(getattr(response, "next_page_token", ""))
                if not page_token:
                    return found
        raise WalletUnavailable(f"ListBalances returned more than {MAX_WALLET_PAGES} pages")

    async def published_below(self) -> int:
        """The wallet's ``published_below`` of a one-account page (0 from a wallet without the field)."""
        path, request_type, response_type = self._method()
        async with tls.aio_channel(self._address, None) as channel:
            call = channel.unary_unary(
                path, request_serializer=request_type.SerializeToString, response_deserializer=response_type.FromString
            )
            try:
                response = await call(request_type(page_size=1), metadata=bearer(self._token), timeout=WALLET_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                raise self._unavailable(error) from None
        return int(getattr(response, "published_below", 0))

    def _unavailable(self, error: grpc.aio.AioRpcError) -> WalletUnavailable:
        return WalletUnavailable(f"ListBalances at {self._address}: {error.code().name}: {error.details()}")


def _balance_items(response: Any) -> list[Any]:
    """The response's repeated balances, whatever the field is called."""
    for descriptor, value in response.ListFields():
        message_type = descriptor.message_type
        if descriptor.is_repeated and message_type is not None and "account" in message_type.fields_by_name:
            return list(value)
    return []
