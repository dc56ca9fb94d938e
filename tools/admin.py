"""niuniu-admin: an operator's table commands, over gRPC to the table service.

    niuniu-admin table create TABLE_ID --variant golden_bull [--config KEY=VALUE]... [--limit FIELD=VALUE]...
    niuniu-admin table configure TABLE_ID [--config KEY=VALUE]... [--limit FIELD=VALUE]...
    niuniu-admin table close TABLE_ID [--wait-s 60]
    niuniu-admin table show TABLE_ID
    niuniu-admin table list
    niuniu-admin staff ...      the wallet's staff accounts (python -m services.wallet.admin, next to the wallet)

The table service is ``--table-addr`` (default NIUNIU_TABLE_ADDR): through ``kubectl
port-forward svc/table 50052`` or from a Job in the namespace. The caller is an admin:
NIUNIU_ADMIN_TOKEN (a token from the wallet's Login of an admin account), else a token
signed here with the issuer key (NIUNIU_ISSUER_KEY_FILE; run next to the wallet).
Limits are the fields of TableLimits (``chips_minor=100,500`` for a list); ``configure``
changes only the limits it names and keeps the others. Each command prints the table as
JSON; a refusal prints its status and reason and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import grpc
from google.protobuf import json_format
from niuniu.table.v1 import events_pb2, table_pb2, table_pb2_grpc

from backbone import tls
from backbone.auth import Role, bearer, operator_token
from backbone.config import ConfigError

DEFAULT_TABLE_ADDR = "127.0.0.1:50052"
ADMIN_SUBJECT = "niuniu-admin"
CLOSE_POLL_S = 0.5


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what}: expected KEY=VALUE, not {item!r}")
        pairs[key] = value
    return pairs


def limits_of(items: list[str], base: events_pb2.TableLimits | None = None) -> events_pb2.TableLimits:
    """TableLimits from FIELD=VALUE items, over ``base`` (the fields it does not name stay)."""
    limits = events_pb2.TableLimits()
    if base is not None:
        limits.CopyFrom(base)
    fields = limits.DESCRIPTOR.fields_by_name
    for name, value in _pairs(items, "--limit").items():
        if name not in fields:
            raise ConfigError(f"--limit: no field {name!r}; TableLimits has {', '.join(fields)}")
        try:
            numbers = [int(v) for v in value.split(",")]
        except ValueError:
            raise ConfigError(f"--limit {name}: integers expected, not {value!r}") from None
        if not isinstance(getattr(limits, name), int):  # a repeated field
            del getattr(limits, name)[:]
            getattr(limits, name).extend(numbers)
        else:
            setattr(limits, name, numbers[0])
    return limits


async def run(
    args: argparse.Namespace, stub: table_pb2_grpc.TableAsyncStub, auth: tuple[tuple[str, str]]
) -> table_pb2.TableInfo | table_pb2.ListTablesResponse:
    """The command's answer: a TableInfo, or a ListTablesResponse."""
    table_id = getattr(args, "table_id", "")
    if args.command == "create":
        request = table_pb2.CreateTableRequest(
            table_id=table_id, variant=args.variant, config=_pairs(args.config, "--config")
        )
        if args.limit:
            request.limits.CopyFrom(limits_of(args.limit))
        return await stub.CreateTable(request, metadata=auth)
    if args.command == "configure":
        current = await stub.GetTable(table_pb2.GetTableRequest(table_id=table_id), metadata=auth)
        update = table_pb2.UpdateConfigRequest(table_id=table_id, config=_pairs(args.config, "--config"))
        update.limits.CopyFrom(limits_of(args.limit, current.limits))
        return await stub.UpdateConfig(update, metadata=auth)
    if args.command == "close":
        info = await stub.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=auth)
        deadline = time.monotonic() + args.wait_s
        while info.status != "closed" and time.monotonic() < deadline:
            await asyncio.sleep(CLOSE_POLL_S)
            info = await stub.GetTable(table_pb2.GetTableRequest(table_id=table_id), metadata=auth)
        return info
    if args.command == "show":
        return await stub.GetTable(table_pb2.GetTableRequest(table_id=table_id), metadata=auth)
    return await stub.ListTables(table_pb2.ListTablesRequest(), metadata=auth)


def parser() -> argparse.ArgumentParser:
    formatter = argparse.RawTextHelpFormatter
    top = argparse.ArgumentParser(prog="niuniu-admin", description=__doc__, formatter_class=formatter)
    top.add_argument("--table-addr", default=os.environ.get("NIUNIU_TABLE_ADDR", DEFAULT_TABLE_ADDR))
    area = top.add_subparsers(dest="area", required=True)
    table = area.add_parser("table", help="create, configure, close, show and list tables")
    commands = table.add_subparsers(dest="command", required=True)
    for name in ("create", "configure"):
        command = commands.add_parser(name)
        command.add_argument("table_id")
        if name == "create":
            command.add_argument("--variant", required=True)
        command.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
        command.add_argument("--limit", action="append", default=[], metavar="FIELD=VALUE")
    close = commands.add_parser("close", help="refuse new bets; the round in play finishes, then the table stops")
    close.add_argument("table_id")
    close.add_argument("--wait-s", type=float, default=60.0, help="wait this long for 'closed' (0: do not wait)")
    commands.add_parser("show").add_argument("table_id")
    commands.add_parser("list")
    area.add_parser("staff", help="the wallet's staff accounts: python -m services.wallet.admin --help", add_help=False)
    return top


async def _main(args: argparse.Namespace) -> int:
    auth = bearer(operator_token(Role.ADMIN, ADMIN_SUBJECT))
    async with tls.aio_channel(args.table_addr, None) as channel:
        try:
            stub: table_pb2_grpc.TableAsyncStub = table_pb2_grpc.TableStub(channel)
            answer = await run(args, stub, auth)
        except grpc.aio.AioRpcError as error:
            print(f"niuniu-admin: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    print(json.dumps(json_format.MessageToDict(answer), indent=2, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["staff"]:
        from services.wallet import admin  # needs the wallet's database: only for this command

        return admin.main(argv[1:])
    args = parser().parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except ConfigError as error:
        print(f"niuniu-admin: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
