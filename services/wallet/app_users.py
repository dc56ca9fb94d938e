"""The wallet application's users: registration, staff accounts, login and profiles."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import jwt
import psycopg
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from backbone.auth import Role as TokenRole
from backbone.auth import Tokens
from backbone.errors import AlreadyExists, NotFound, Unauthenticated
from services.wallet import domain, events, repo, repo_users
from services.wallet.app_base import AppBase
from services.wallet.domain import AccountKind, AccountState


@dataclass(frozen=True, slots=True)
class LoginResult:
    token: str
    user: repo_users.User
    expires_at_unix_ms: int


class Users(AppBase):
    """Registration, staff accounts, login and profiles."""

    tokens: Tokens
    _hasher: PasswordHasher
    _new_id: Callable[[], uuid.UUID]
    _dummy_hash: str | None

    async def register(self, request_id: str, username: str, email: str, password: str) -> repo_users.User:
        domain.check_id(request_id, "REQUEST_ID")
        domain.check_registration(username, email, password)
        password_hash = await asyncio.to_thread(self._hasher.hash, password)

        # Request ids are scoped by the username asked for: one anonymous caller reusing another's
        # id registers their own account instead of being refused (or blocked) because of it.
        scoped = f"{username}/{request_id}"

        async def work(conn: psycopg.AsyncConnection) -> repo_users.User:
            earlier = await repo_users.user_by(conn, "request_id", scoped)
            if earlier is None:  # registered before ids were scoped: its id was stored as sent
                legacy = await repo_users.user_by(conn, "request_id", request_id)
                earlier = legacy if legacy is not None and legacy.username == username else None
            if earlier is not None:
                same = earlier.username == username and earlier.email == email
                if same and await self._verify(earlier.password_hash, password):
                    return earlier
                raise AlreadyExists("REQUEST_ID_REUSED", f"request {request_id} registered a different account")
            return await self._create_user(conn, domain.Role.PLAYER, username, email, password_hash, scoped)

        return await self._transaction(work)

    async def create_staff(self, role: domain.Role, username: str, email: str, password: str) -> repo_users.User:
        """Admin, auditor and cashier accounts: only through the admin command (python -m services.wallet.admin)."""
        assert role in (domain.Role.ADMIN, domain.Role.AUDITOR, domain.Role.CASHIER)
        domain.check_registration(username, email, password)
        password_hash = await asyncio.to_thread(self._hasher.hash, password)
        return await self._transaction(lambda conn: self._create_user(conn, role, username, email, password_hash, None))

    async def reset_staff_password(self, username: str, password: str) -> repo_users.User:
        """A new password for an admin or auditor: only through the admin command, like create_staff."""
        async with self._pool.connection() as conn:
            user = await repo_users.user_by(conn, "username", username)
        if user is None or user.role == domain.Role.PLAYER.value:
            raise NotFound("STAFF_NOT_FOUND", f"no staff account named {username[:80]}")
        domain.check_registration(username, user.email, password)
        password_hash = await asyncio.to_thread(self._hasher.hash, password)
        async with self._pool.connection() as conn:
            await repo_users.update_password_hash(conn, user.account_id, password_hash)
        return user

    async def _create_user(
        self,
        conn: psycopg.AsyncConnection,
        role: domain.Role,
        username: str,
        email: str,
        password_hash: str,
        request_id: str | None,
    ) -> repo_users.User:
        if await repo_users.user_by(conn, "username", username) is not None:
            raise AlreadyExists("USERNAME_TAKEN", f"username {username} is taken")
        user = repo_users.User(
            str(self._new_id()), username, email, password_hash, role.value, request_id, self.clock()
        )
        await repo_users.insert_user(conn, user)
        if role is domain.Role.PLAYER:
            account = domain.player_account(user.account_id)
            await repo.insert_account(conn, account, AccountKind.PLAYER)
            await self._append_account(
                conn,
                repo.LockedAccount(AccountState(account, AccountKind.PLAYER), 0),
                [events.account_opened(account, username, role.value, request_id or user.account_id)],
            )
        else:  # staff hold no money: their stream only records that they exist
            staff = f"{role.value}:{user.account_id}"
            opened = events.account_opened(staff, username, role.value, user.account_id)
            await self._store.append(conn, events.account_stream(staff), 0, [opened])
        return user

    async def _verify(self, password_hash: str, password: str) -> bool:
        try:
            return await asyncio.to_thread(self._hasher.verify, password_hash, password)
        except (VerificationError, InvalidHashError):
            return False

    async def login(self, username: str, password: str) -> LoginResult:
        # A name no account can have is not looked up (a NUL would not even reach PostgreSQL).
        if not domain.is_username(username) or not password or len(password) > domain.MAX_PASSWORD_CHARS:
            raise Unauthenticated("INVALID_CREDENTIALS", "wrong username or password")
        async with self._pool.connection() as conn:
            user = await repo_users.user_by(conn, "username", username)
        if user is None:
            # Spend the same time as a real check, so a wrong name cannot be told from a wrong password.
            if self._dummy_hash is None:
                self._dummy_hash = await asyncio.to_thread(self._hasher.hash, "not-a-password")
            await self._verify(self._dummy_hash, password)
            raise Unauthenticated("INVALID_CREDENTIALS", "wrong username or password")
        if not await self._verify(user.password_hash, password):
            raise Unauthenticated("INVALID_CREDENTIALS", "wrong username or password")
        if self._hasher.check_needs_rehash(user.password_hash):
            fresh = await asyncio.to_thread(self._hasher.hash, password)
            async with self._pool.connection() as conn:
                await repo_users.update_password_hash(conn, user.account_id, fresh)
        role = TokenRole(user.role)
        token = self.tokens.issue(user.account_id, role)
        expires_s = int(jwt.decode(token, options={"verify_signature": False})["exp"])
        return LoginResult(token, user, expires_s * 1000)

    async def user(self, account_id: str) -> repo_users.User:
        domain.check_uuid(account_id, "ACCOUNT_ID")
        async with self._pool.connection() as conn:
            user = await repo_users.user_by(conn, "account_id", account_id)
        if user is None:
            raise NotFound("ACCOUNT_NOT_FOUND", f"no account {account_id}")
        return user
