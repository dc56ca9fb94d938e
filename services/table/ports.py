"""The table's view of the services it calls, and their gRPC adapters.

Errors from the other side come back as the same domain error with the same
reason (INSUFFICIENT_FUNDS, SELF_EXCLUDED ...), so a player sees why the wallet
refused their bet; an unreachable service is UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

from backbone.auth import Tokens
from backbone.errors import (
    REASON_METADATA_KEY,
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from backbone.grouping import Grouped

HOLDS_PER_CALL = 64
"""Bound on the holds of one PlaceHolds call (the wallet's own bound)."""
HOLD_CALLS_IN_FLIGHT = 2
"""PlaceHolds calls under way at once; the holds asked meanwhile go together in the next one."""
MAX_HOLDS_WAITING = 1024
"""Bound on holds waiting for a call; one more is refused UNAVAILABLE TABLE_BUSY."""
HOLD_IDS_PER_READ = 1000
"""Bound on the hold ids of one GetHolds call (the wallet's own bound)."""
HOLD_READS_IN_FLIGHT = 16
"""GetHold calls under way at once when a wallet without GetHolds is read hold by hold."""
CALL_TIMEOUT_S = 3.0
"""The deadline of every call to the wallet and the rng. A round step makes at most one try of a
call (``core.decide.RNG_PATIENCE_MS``), so a step ends well inside the table's 5 s lease
(``runner.LEASE_TTL_MS``, renewed every 1.5 s in the background)."""


@dataclass(frozen=True, slots=True)
class RevealedSeed:
    server_seed: str
    commitment: str
    client_seed: str


@dataclass(frozen=True, slots=True)
class WalletHold:
    """A hold as the wallet has it now: what the table checks before it settles a round."""

    hold_id: str
    account: str
    amount_minor: int
    round_id: str
    is_open: bool


class WalletPort(Protocol):
    async def place_hold(
        self, hold_id: str, account: str, amount_minor: int, reason: str, round_id: str, expires_at_unix_ms: int
    ) -> None: ...

    async def void_hold(self, hold_id: str) -> None: ...

    async def resize_hold(self, resize_id: str, hold_id: str, amount_minor: int, expected_minor: int) -> None:
        """Change an open hold that holds ``expected_minor`` to ``amount_minor`` (idempotent by ``resize_id``);
        one that holds anything else is refused ``HOLD_CHANGED`` and stays as it is."""

    async def balance_minor(self, account: str) -> int:
        """The account's available balance now (system accounts hold nothing)."""

    async def settlement_status(self, round_id: str) -> str | None:
        """What the wallet did with the round's settlement ("settled", "voided", "rejected"), None if unseen."""

    async def read_holds(self, hold_ids: Sequence[str]) -> dict[str, WalletHold]:
        """The holds the wallet has of ``hold_ids``, by id; an unknown hold is left out. Raises Unavailable."""


class RngPort(Protocol):
    async def commit(self, round_id: str, purpose: str = "deck") -> str: ...

    async def draw(
        self, round_id: str, deck_size: int, client_seed: str, *, client_seeds: Sequence[str] = ()
    ) -> list[str]:
        """``client_seed`` is the combination of the players' ``client_seeds`` (docs/fairness.md, section 10)."""

    async def split_envelope(
        self,
        round_id: str,
        total_minor: int,
        shares: int,
        min_minor: int,
        client_seed: str,
        *,
        client_seeds: Sequence[str] = (),
    ) -> tuple[list[int], list[int]]:
        """(amounts in draw order, the participant position each goes to)."""

    async def reveal(self, round_id: str) -> RevealedSeed: ...


_CODES: dict[grpc.StatusCode, type[DomainError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


def translate(error: grpc.aio.AioRpcError, service: str) -> DomainError:
    reason = dict(error.trailing_metadata() or ()).get(REASON_METADATA_KEY, f"{service.upper()}_ERROR")
    kind = _CODES.get(error.code(), Unavailable)
    if kind is Unavailable:
        return Unavailable(
            f"{service.upper()}_UNAVAILABLE", f"the {service} service did not answer: {error.code().name}"
        )
    message = (error.details() or "").partition(": ")[2] or (error.details() or "")
    return kind(str(reason), f"{service}: {message}")


_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def refused(refusal: wallet_pb2.Refusal, service: str) -> DomainError:
    """One item's error of a call made of several, as ``translate`` turns a whole call's."""
    kind = _CODES.get(_STATUS_BY_NUMBER.get(refusal.code, grpc.StatusCode.UNKNOWN), Unavailable)
    if kind is Unavailable:
        return Unavailable(f"{service.upper()}_UNAVAILABLE", f"the {service} service did not answer: {refusal.reason}")
    return kind(refusal.reason, f"{service}: {refusal.message}")


class GrpcWallet:
    """The wallet over gRPC. Holds asked at the same moment (bets placed together) go in one PlaceHolds
    call, each with its own outcome: one trip to the wallet and one transaction there for many bets."""

    def __init__(self, channel: grpc.aio.Channel, tokens: Tokens) -> None:
        self._stub = wallet_pb2_grpc.WalletStub(channel)
        self._credentials = tokens.service_credentials("table")  # renewed before it expires
        self._holds: Grouped[wallet_pb2.PlaceHoldRequest, None] = Grouped(
            self._place_holds,
            keys=lambda request: (),  # the wallet keeps one account's holds apart itself
            busy=lambda: Unavailable("TABLE_BUSY", "too many holds waiting for the wallet; retry shortly"),
            max_group=HOLDS_PER_CALL,
            max_in_flight=HOLD_CALLS_IN_FLIGHT,
            max_waiting=MAX_HOLDS_WAITING,
        )

    @property
    def _metadata(self) -> tuple[tuple[str, str]]:
        return self._credentials.metadata()

    async def place_hold(
        self, hold_id: str, account: str, amount_minor: int, reason: str, round_id: str, expires_at_unix_ms: int
    ) -> None:
        request = wallet_pb2.PlaceHoldRequest(
            hold_id=hold_id,
            account=account,
            amount_minor=amount_minor,
            reason=reason,
            round_id=round_id,
            expires_at_unix_ms=expires_at_unix_ms,
        )
        await self._holds(request)

    async def _place_holds(self, requests: list[wallet_pb2.PlaceHoldRequest]) -> list[DomainError | None]:
        """One PlaceHolds call for a group. A failed call is every hold's outcome (not raised: the group
        must not be asked again hold by hold, each waiting out the deadline)."""
        try:
            reply = await self._stub.PlaceHolds(
                wallet_pb2.PlaceHoldsRequest(holds=requests), metadata=self._metadata, timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            failed = translate(error, "wallet")
            return [failed] * len(requests)
        if len(reply.outcomes) != len(requests):
            unanswered = Unavailable("WALLET_UNAVAILABLE", "the wallet answered another number of holds")
            return [unanswered] * len(requests)
        return [refused(o.refused, "wallet") if o.HasField("refused") else None for o in reply.outcomes]

    async def void_hold(self, hold_id: str) -> None:
        try:
            await self._stub.VoidHold(
                wallet_pb2.VoidHoldRequest(hold_id=hold_id), metadata=self._metadata, timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise translate(error, "wallet") from None

    async def resize_hold(self, resize_id: str, hold_id: str, amount_minor: int, expected_minor: int) -> None:
        request = wallet_pb2.ResizeHoldRequest(
            resize_id=resize_id, hold_id=hold_id, amount_minor=amount_minor, expected_minor=expected_minor
        )
        try:
            await self._stub.ResizeHold(request, metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise translate(error, "wallet") from None

    async def balance_minor(self, account: str) -> int:
        try:
            reply = await self._stub.GetBalance(
                wallet_pb2.GetBalanceRequest(account=account), metadata=self._metadata, timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise translate(error, "wallet") from None
        return int(reply.available_minor)

    async def settlement_status(self, round_id: str) -> str | None:
        try:
            reply = await self._stub.GetRoundSettlement(
                wallet_pb2.GetRoundSettlementRequest(round_id=round_id), metadata=self._metadata, timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise translate(error, "wallet") from None
        return str(reply.status)

    async def read_holds(self, hold_ids: Sequence[str]) -> dict[str, WalletHold]:
        """GetHolds in chunks of ``HOLD_IDS_PER_READ`` ids, one after another (a round has far fewer
        holds: one call); the first failure is raised."""
        ids = list(dict.fromkeys(hold_ids))
        found: dict[str, WalletHold] = {}
        for start in range(0, len(ids), HOLD_IDS_PER_READ):
            chunk = ids[start : start + HOLD_IDS_PER_READ]
            try:
                reply = await self._stub.GetHolds(
                    wallet_pb2.GetHoldsRequest(hold_ids=chunk), metadata=self._metadata, timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise translate(error, "wallet") from None
                holds = await self._read_one_by_one(chunk)
            else:
                holds = list(reply.holds)
            for h in holds:
                is_open = h.status == wallet_pb2.HOLD_STATUS_OPEN
                found[h.hold_id] = WalletHold(h.hold_id, h.account, h.amount_minor, h.round_id, is_open)
        return found

    async def _read_one_by_one(self, hold_ids: Sequence[str]) -> list[wallet_pb2.Hold]:
        """One GetHold per hold, ``HOLD_READS_IN_FLIGHT`` at a time, from a wallet of the release before
        GetHolds (UNIMPLEMENTED: releases mixed in a rolling update or a rollback); NOT_FOUND leaves a
        hold out, any other failure is raised."""
        gate = asyncio.Semaphore(HOLD_READS_IN_FLIGHT)

        async def read(hold_id: str) -> wallet_pb2.Hold | None:
            async with gate:
                try:
                    hold: wallet_pb2.Hold = await self._stub.GetHold(
                        wallet_pb2.GetHoldRequest(hold_id=hold_id), metadata=self._metadata, timeout=CALL_TIMEOUT_S
                    )
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.NOT_FOUND:
                        return None
                    raise translate(error, "wallet") from None
            return hold

        return [h for h in await asyncio.gather(*(read(h) for h in hold_ids)) if h is not None]


class GrpcRng:
    def __init__(self, channel: grpc.aio.Channel, tokens: Tokens) -> None:
        self._stub = rng_pb2_grpc.RngStub(channel)
        self._credentials = tokens.service_credentials("table")  # renewed before it expires

    @property
    def _metadata(self) -> tuple[tuple[str, str]]:
        return self._credentials.metadata()

    async def commit(self, round_id: str, purpose: str = "deck") -> str:
        try:
            reply = await self._stub.Commit(
                rng_pb2.CommitRequest(round_id=round_id, purpose=purpose),
                metadata=self._metadata,
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            raise translate(error, "rng") from None
        return reply.commitment

    async def draw(
        self, round_id: str, deck_size: int, client_seed: str, *, client_seeds: Sequence[str] = ()
    ) -> list[str]:
        request = rng_pb2.DrawRequest(
            round_id=round_id, deck_size=deck_size, client_seed=client_seed, client_seeds=client_seeds
        )
        try:
            reply = await self._stub.Draw(request, metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise translate(error, "rng") from None
        return list(reply.cards)

    async def split_envelope(
        self,
        round_id: str,
        total_minor: int,
        shares: int,
        min_minor: int,
        client_seed: str,
        *,
        client_seeds: Sequence[str] = (),
    ) -> tuple[list[int], list[int]]:
        request = rng_pb2.SplitEnvelopeRequest(
            round_id=round_id,
            total_minor=total_minor,
            shares=shares,
            min_minor=min_minor,
            client_seed=client_seed,
            client_seeds=client_seeds,
        )
        try:
            reply = await self._stub.SplitEnvelope(request, metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise translate(error, "rng") from None
        return list(reply.amounts), list(reply.grab_order)

    async def reveal(self, round_id: str) -> RevealedSeed:
        try:
            reply = await self._stub.Reveal(
                rng_pb2.RevealRequest(round_id=round_id), metadata=self._metadata, timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise translate(error, "rng") from None
        return RevealedSeed(reply.server_seed, reply.commitment, reply.client_seed)
