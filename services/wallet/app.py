"""The wallet application: load -> decide (domain) -> save state, entries and events in one transaction.

Each command runs in its own transaction (retried a bounded number of times when a
concurrent writer wins a race); the settlement runs inside the consumer's
transaction, so its effects commit together with the consumer's tracking row.
``WalletApp`` is made of parts: users (app_users), holds (app_holds) and settlements
(app_settlement) on the shared ground of app_base; cash, balances and responsible play are here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

import psycopg
from argon2 import PasswordHasher
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Tokens
from backbone.errors import AlreadyExists, InvalidArgument, NotFound
from backbone.eventstore import EventStore, utc_now
from services.wallet import domain, domain_play, events, repo, repo_holds, repo_play
from services.wallet.app_base import Clock
from services.wallet.app_settlement import Settlement
from services.wallet.app_users import Users
from services.wallet.domain import CASHIER, AccountKind, AccountState
from services.wallet.domain_holds import Hold
from services.wallet.domain_play import LimitKind, ResponsiblePlay

T = TypeVar("T")

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class MovementResult:
    movement_id: str
    balance: AccountState
    replayed: bool


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str


def page_size(requested: int) -> int:
    if requested < 0 or requested > MAX_PAGE_SIZE:
        raise InvalidArgument("PAGE_SIZE_INVALID", f"page_size must be 0..{MAX_PAGE_SIZE}")
    return requested or DEFAULT_PAGE_SIZE


_INT_TOKEN = re.compile(r"[0-9]{1,19}")


def int_page_token(token: str) -> int:
    """Keyset paging newest first: the token is the last id seen (exclusive)."""
    if not token:
        return 2**63 - 1
    # ASCII digits only: str.isdigit() also takes '²' or '①', which int() then refuses.
    if not _INT_TOKEN.fullmatch(token) or int(token) > 2**63 - 1:
        raise InvalidArgument("PAGE_TOKEN_INVALID", "page_token must come from a previous page")
    return int(token)


class WalletApp(Users, Settlement):
    """The wallet's commands and queries: users (app_users), holds (app_holds), settlements
    (app_settlement), and here cash movements, balances, movements and responsible play."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        store: EventStore,
        tokens: Tokens,
        *,
        clock: Clock = utc_now,
        hasher: PasswordHasher | None = None,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        self._pool = pool
        self._store = store
        self.tokens = tokens
        self.clock = clock
        self._hasher = hasher or PasswordHasher()
        self._new_id = new_id
        self._dummy_hash = None
        self._hold_groups = self._group_holds()

    # ----------------------------------------------------------------------- cash

    async def deposit(self, actor: str, request_id: str, account: str, amount_minor: int) -> MovementResult:
        return await self._cash("deposit", actor, request_id, account, amount_minor)

    async def withdraw(self, actor: str, request_id: str, account: str, amount_minor: int) -> MovementResult:
        return await self._cash("withdrawal", actor, request_id, account, amount_minor)

    async def _cash(self, kind: str, actor: str, request_id: str, account: str, amount_minor: int) -> MovementResult:
        domain.check_id(request_id, "REQUEST_ID")
        domain.account_kind(account)
        domain.check_amount(amount_minor)
        # Request ids are scoped by the caller (the staff member's account id), so two admins
        # choosing the same id make two movements instead of one refusing the other.
        scoped = f"{actor}:{request_id}"
        key, fingerprint = f"{kind}:{scoped}", f"{account}|{amount_minor}"

        async def work(conn: psycopg.AsyncConnection) -> MovementResult:
            earlier = await repo.request(conn, key)
            if earlier is None:  # made before ids were scoped: a retry of it is still a replay
                legacy = await repo.request(conn, f"{kind}:{request_id}")
                earlier = legacy if legacy is not None and legacy.fingerprint == fingerprint else None
            if earlier is not None:
                if earlier.fingerprint != fingerprint:
                    raise AlreadyExists("REQUEST_ID_REUSED", f"{kind} {request_id} was made with other fields")
                return MovementResult(earlier.movement_id, earlier.balance, replayed=True)
            now = self.clock()
            locked = await self._lock(conn, [account, CASHIER])
            target = locked[account]
            if kind == "deposit":
                movement = domain.deposit(scoped, target.state, amount_minor)
                if target.state.kind is AccountKind.PLAYER:
                    domain_play.check_may_deposit(await self._play(conn, account, now), amount_minor, now)
                event = events.deposited(movement, actor, request_id)
            else:
                movement = domain.withdrawal(scoped, target.state, amount_minor)
                event = events.withdrawn(movement, actor, request_id)
            after = domain.apply_movements({n: a.state for n, a in locked.items()}, [movement])
            await repo.save_movements(conn, [movement], kind, now)
            await self._append_account(conn, target, [event])
            await repo.insert_request(conn, key, repo.StoredRequest(fingerprint, movement.movement_id, after[account]))
            return MovementResult(movement.movement_id, after[account], replayed=False)

        return await self._transaction(work)

    # ----------------------------------------------------------------------- queries

    async def balance(self, account: str) -> AccountState:
        domain.account_kind(account)
        async with self._pool.connection() as conn:
            found = await repo.account(conn, account)
        if found is None:
            raise NotFound("ACCOUNT_NOT_FOUND", f"no account {account}")
        return found

    async def balances(self, page_token: str, size: int) -> tuple[Page[AccountState], int, int]:
        """One page of every account's balance, with the event-store position it reflects and the position
        below which every event was in Kafka when it was read."""
        limit = page_size(size)
        after = _decode_name_token(page_token)
        async with self._pool.connection() as conn, conn.transaction():
            await repo.hold_appends(conn)  # no append in flight: the page is exactly as of the position
            rows = await repo.balances_page(conn, after, limit)
            position = await repo.store_position(conn)
            published_below = await repo.published_below(conn)
        token = _encode_name_token(rows[-1].account) if len(rows) == limit else ""
        return Page(rows, token), position, published_below

    async def movements(self, account: str, page_token: str, size: int) -> Page[repo.Entry]:
        await self.balance(account)
        limit, before = page_size(size), int_page_token(page_token)
        async with self._pool.connection() as conn:
            rows = await repo.entries_page(conn, account, before, limit)
        return Page(rows, str(rows[-1].entry_id) if len(rows) == limit else "")

    async def holds(self, account: str, include_resolved: bool, page_token: str, size: int) -> Page[Hold]:
        await self.balance(account)
        limit, before = page_size(size), int_page_token(page_token)
        async with self._pool.connection() as conn:
            rows = await repo_holds.holds_page(conn, account, include_resolved, before, limit)
        return Page([h for _, h in rows], str(rows[-1][0]) if len(rows) == limit else "")

    # ----------------------------------------------------------------------- responsible play

    async def responsible_play(self, account: str) -> tuple[ResponsiblePlay, datetime]:
        self._check_player(account)
        await self.balance(account)
        now = self.clock()
        async with self._pool.connection() as conn:
            return await self._play(conn, account, now), now

    @staticmethod
    def _check_player(account: str) -> None:
        if domain.account_kind(account) is not AccountKind.PLAYER:
            raise InvalidArgument("ACCOUNT_NOT_PLAYER", "responsible-play settings belong to player accounts")

    async def set_limit(self, account: str, kind: LimitKind, value: int) -> tuple[ResponsiblePlay, datetime]:
        self._check_player(account)

        async def work(conn: psycopg.AsyncConnection) -> None:
            locked = await self._lock(conn, [account])
            now = self.clock()
            current = (await repo_play.limits(conn, account)).get(kind) or domain_play.LimitSetting(kind)
            changed = domain_play.decide_limit_change(current, value, now)
            await repo_play.save_limit(conn, account, changed)
            effective = changed.pending_effective_at if changed.pending_value is not None else now
            assert effective is not None
            event = events.limits_changed(account, changed, value, domain.to_ms(effective))
            await self._append_account(conn, locked[account], [event])

        await self._transaction(work)
        return await self.responsible_play(account)

    async def self_exclude(self, account: str, days: int, permanent: bool) -> tuple[ResponsiblePlay, datetime]:
        self._check_player(account)

        async def work(conn: psycopg.AsyncConnection) -> None:
            locked = await self._lock(conn, [account])
            now = self.clock()
            excluded = domain_play.decide_self_exclusion(await repo_play.exclusion(conn, account), days, permanent, now)
            await repo_play.save_exclusion(conn, account, excluded)
            until = 0 if excluded.until is None else domain.to_ms(excluded.until)
            await self._append_account(conn, locked[account], [events.self_excluded(account, until)])

        await self._transaction(work)
        return await self.responsible_play(account)


def _encode_name_token(name: str) -> str:
    return name.encode().hex()


def _decode_name_token(token: str) -> str:
    if not token:
        return ""
    try:
        name = bytes.fromhex(token).decode()
    except ValueError:
        raise InvalidArgument("PAGE_TOKEN_INVALID", "page_token must come from a previous page") from None
    if "\x00" in name:  # PostgreSQL text cannot hold it: refused here, not an INTERNAL from the query
        raise InvalidArgument("PAGE_TOKEN_INVALID", "page_token must come from a previous page")
    return name
