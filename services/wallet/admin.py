"""Operator commands for the wallet, run next to the service with its environment.

    python -m services.wallet.admin create --role admin --username root --email root@example.org
    python -m services.wallet.admin create --role cashier --username payments --email payments@example.org
    python -m services.wallet.admin set-password --username root
    python -m services.wallet.admin service-token --service table

``create`` writes a staff account (admin, auditor or cashier) through the application layer
into the wallet's database (its AccountOpened event is published by the running
service's relay); a cashier is the identity of an operator's payment integration: it
logs in like any staff account and may only Deposit to and Withdraw from player
accounts. ``set-password`` gives a staff account a new password. The password
comes from ``--password-file`` (one line), NIUNIU_ADMIN_PASSWORD or a prompt; there is
no default. ``service-token`` prints a token of that service, signed with the
service's own key (NIUNIU_<SERVICE>_KEY_FILE): this tool cannot mint a service's token
without holding that service's key, nor a player's or an admin's at all.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from backbone.auth import Tokens
from backbone.config import ConfigError, Settings
from backbone.db import open_pool
from backbone.errors import DomainError
from backbone.eventstore import EventStore
from backbone.migrations import check_version
from backbone.topics import Topics
from services.wallet import repo_users
from services.wallet.app import WalletApp
from services.wallet.domain import Role
from services.wallet.server import MIGRATIONS


async def create(role: Role, username: str, email: str, password: str) -> str:
    return await _with_app(lambda app: app.create_staff(role, username, email, password))


async def set_password(username: str, password: str) -> str:
    return await _with_app(lambda app: app.reset_staff_password(username, password))


async def _with_app(work: Callable[[WalletApp], Awaitable[repo_users.User]]) -> str:
    settings = Settings.from_env("wallet", grpc_port=0, metrics_port=0)
    # The same schema the service uses when one is configured (NIUNIU_DB_SCHEMA).
    pool = await open_pool(settings.dsn, min_size=1, max_size=2, schema=getattr(settings, "schema", None))
    try:
        store = EventStore("wallet", Topics.from_env().wallet_events)
        async with pool.connection() as conn:  # niuniu-migrate made the tables; this runs no DDL
            await check_version(conn, MIGRATIONS, "wallet")
        # Issues no tokens: staff log in through the running wallet.
        app = WalletApp(pool, store, Tokens(trusted=()))
        user = await work(app)
        return user.account_id
    finally:
        await pool.close()


def _password(path: str | None) -> str:
    if path:
        try:
            return Path(path).read_text().splitlines()[0]
        except (OSError, IndexError) as error:
            raise ConfigError(f"cannot read a password from {path}: {error}") from None
    return os.environ.get("NIUNIU_ADMIN_PASSWORD") or getpass.getpass("password: ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.wallet.admin")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("create", help="create an admin, auditor or cashier account")
    make.add_argument("--role", choices=[Role.ADMIN.value, Role.AUDITOR.value, Role.CASHIER.value], required=True)
    make.add_argument("--username", required=True)
    make.add_argument("--email", required=True)
    make.add_argument("--password-file", help="read the password from this file (first line)")
    reset = commands.add_parser("set-password", help="give an admin, auditor or cashier a new password")
    reset.add_argument("--username", required=True)
    reset.add_argument("--password-file", help="read the password from this file (first line)")
    token = commands.add_parser("service-token", help="print a token of a service, signed with its own key")
    token.add_argument("--service", required=True)
    token.add_argument("--ttl-s", type=int, default=15 * 60)
    args = parser.parse_args(argv)
    try:
        if args.command == "service-token":
            print(Tokens.from_env(args.service).service_token(args.service, ttl_s=args.ttl_s))
            return 0
        password = _password(args.password_file)
        if args.command == "set-password":
            account_id = asyncio.run(set_password(args.username, password))
        else:
            account_id = asyncio.run(create(Role(args.role), args.username, args.email, password))
    except ConfigError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 2
    except DomainError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 1
    print(account_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
