"""The audit's credentials: an auditor token from the wallet's Login, else from the environment, else (in
development only) minted from the local issuer key."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path
from typing import TextIO

import grpc

from backbone import tls
from backbone.auth import DEVELOPMENT, ENV_MODE, Role, operator_token
from services.ledger.audit_config import AuditError

LOGIN_TIMEOUT_S = 10.0


async def login(address: str, username: str, password: str) -> str:
    """An auditor token from the wallet's Login (the role in the token is checked)."""
    from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

    async with tls.aio_channel(address, None) as channel:
        try:
            reply = await wallet_pb2_grpc.WalletStub(channel).Login(
                wallet_pb2.LoginRequest(username=username, password=password), timeout=LOGIN_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise AuditError(f"login as {username} at {address}: {error.code().name}: {error.details()}") from None
    if reply.role != Role.AUDITOR.value:
        raise AuditError(f"{username} is a {reply.role or 'unknown role'} account, not an auditor")
    return str(reply.token)


async def auditor_token(args: argparse.Namespace, err: TextIO) -> str:
    """Login with the auditor's name and password; else NIUNIU_AUDITOR_TOKEN; else, in development only, minted."""
    if args.username:
        return await login(args.wallet, args.username, _password(args.password_file, args.username))
    token = os.environ.get("NIUNIU_AUDITOR_TOKEN", "")
    if token:
        return token
    if os.environ.get(ENV_MODE) == DEVELOPMENT:
        print("niuniu-audit: development mode: auditor token minted from the local issuer key", file=err)
        return operator_token(Role.AUDITOR, "audit")
    raise AuditError(
        "no auditor credentials: log in with --username (or NIUNIU_AUDITOR_USERNAME) and a password"
        " (--password-file, NIUNIU_AUDITOR_PASSWORD or the prompt), or set NIUNIU_AUDITOR_TOKEN; --no-wallet skips"
        " the wallet"
    )


def _password(path: str | None, username: str) -> str:
    if path:
        try:
            return Path(path).read_text().splitlines()[0]
        except (OSError, IndexError) as error:
            raise AuditError(f"cannot read a password from {path}: {error}") from None
    password = os.environ.get("NIUNIU_AUDITOR_PASSWORD", "")
    if password:
        return password
    if not sys.stdin.isatty():
        raise AuditError(f"no password for {username}: --password-file or NIUNIU_AUDITOR_PASSWORD")
    return getpass.getpass(f"password of {username}: ")
