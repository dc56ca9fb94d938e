"""Operator commands for the wallet, run next to the service with its environment.

    python -m services.wallet.admin create --role admin --username root --email root@example.org
    python -m services.wallet.admin service-token --service table

``create`` writes a staff account (admin or auditor) through the application layer
into the wallet's database (its AccountOpened event is published by the running
service's relay). The password comes from NIUNIU_ADMIN_PASSWORD or a prompt.
``service-token`` prints a service identity token signed with NIUNIU_JWT_SECRET.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys

from backbone.auth import Role as TokenRole
from backbone.auth import Tokens, secret_from_env
from backbone.config import Settings
from backbone.db import open_pool
from backbone.errors import DomainError
from backbone.eventstore import EventStore
from backbone.topics import Topics
from services.wallet import repo
from services.wallet.app import WalletApp
from services.wallet.domain import Role


async def create(role: Role, username: str, email: str, password: str) -> str:
    settings = Settings.from_env("wallet", grpc_port=0, metrics_port=0)
    # The same schema the service uses when one is configured (NIUNIU_DB_SCHEMA).
    pool = await open_pool(settings.dsn, min_size=1, max_size=2, schema=getattr(settings, "schema", None))
    try:
        store = EventStore("wallet", Topics.from_env().wallet_events)
        async with pool.connection() as conn:
            await store.setup(conn)
            await repo.setup(conn)
        app = WalletApp(pool, store, Tokens(secret_from_env()))
        user = await app.create_staff(role, username, email, password)
        return user.account_id
    finally:
        await pool.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.wallet.admin")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("create", help="create an admin or auditor account")
    make.add_argument("--role", choices=[Role.ADMIN.value, Role.AUDITOR.value], required=True)
    make.add_argument("--username", required=True)
    make.add_argument("--email", required=True)
    token = commands.add_parser("service-token", help="print a service identity token")
    token.add_argument("--service", required=True)
    token.add_argument("--ttl-s", type=int, default=12 * 3600)
    args = parser.parse_args(argv)
    if args.command == "service-token":
        tokens = Tokens(secret_from_env())
        print(tokens.issue(f"service:{args.service}", TokenRole.SERVICE, ttl_s=args.ttl_s))
        return 0
    password = os.environ.get("NIUNIU_ADMIN_PASSWORD") or getpass.getpass("password: ")
    try:
        account_id = asyncio.run(create(Role(args.role), args.username, args.email, password))
    except DomainError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 1
    print(account_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
