"""The wallet's users (``wallet_users``): players and staff, with their password hashes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg


@dataclass(frozen=True, slots=True)
class User:
    account_id: str
    username: str
    email: str
    password_hash: str
    role: str
    request_id: str | None
    created_at: datetime


_USER_COLUMNS = "account_id, username, email, password_hash, role, request_id, created_at"


def _user(r: Sequence[Any]) -> User:
    return User(str(r[0]), r[1], r[2], r[3], r[4], r[5], r[6])


async def user_by(conn: psycopg.AsyncConnection, column: str, value: str) -> User | None:
    assert column in ("account_id", "username", "request_id")
    cur = await conn.execute(f"SELECT {_USER_COLUMNS} FROM wallet_users WHERE {column} = %s", (value,))
    r = await cur.fetchone()
    return _user(r) if r else None


async def insert_user(conn: psycopg.AsyncConnection, u: User) -> None:
    await conn.execute(
        f"INSERT INTO wallet_users ({_USER_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (u.account_id, u.username, u.email, u.password_hash, u.role, u.request_id, u.created_at),
    )


async def update_password_hash(conn: psycopg.AsyncConnection, account_id: str, password_hash: str) -> None:
    await conn.execute("UPDATE wallet_users SET password_hash = %s WHERE account_id = %s", (password_hash, account_id))
