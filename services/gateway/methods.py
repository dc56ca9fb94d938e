"""What the gateway exposes: the player-facing calls of the table and the wallet, nothing else.

Staff calls (CreateTable, UpdateConfig, Deposit, Withdraw, holds, ListBalances, ...) are not
served here at all: a browser has no business with them, and an allowlist keeps a new admin
RPC unreachable until someone decides otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2

TABLE = "table"
WALLET = "wallet"

TABLE_METHODS = (
    "GetTable",
    "ListTables",
    "JoinTable",
    "LeaveTable",
    "PlaceBet",
    "PlaceBets",
    "CancelBet",
    "ChangeBet",
    "PlaceBid",
    "GetRound",
    "ListRounds",
    "WatchTable",
    "GetJackpot",
    "ApplyBanker",
    "LeaveBanker",
    "GetBankerQueue",
)
WALLET_METHODS = (
    "Register",
    "Login",
    "GetProfile",
    "GetBalance",
    "ListMovements",
    "ListHolds",
    "GetHold",
    "GetResponsiblePlay",
    "SetLimit",
    "SelfExclude",
)


@dataclass(frozen=True, slots=True)
class Method:
    path: str  # "/niuniu.table.v1.Table/WatchTable"
    upstream: str  # TABLE or WALLET
    request: type[Message]
    response: type[Message]
    server_streaming: bool


def _method(upstream: str, descriptor: MethodDescriptor) -> Method:
    return Method(
        path=f"/{descriptor.containing_service.full_name}/{descriptor.name}",
        upstream=upstream,
        request=message_factory.GetMessageClass(descriptor.input_type),
        response=message_factory.GetMessageClass(descriptor.output_type),
        server_streaming=descriptor.server_streaming,
    )


def exposed() -> dict[str, Method]:
    """Path -> method for every call the gateway forwards."""
    table = table_pb2.DESCRIPTOR.services_by_name["Table"]
    wallet = wallet_pb2.DESCRIPTOR.services_by_name["Wallet"]
    methods = [_method(TABLE, table.methods_by_name[name]) for name in TABLE_METHODS]
    methods += [_method(WALLET, wallet.methods_by_name[name]) for name in WALLET_METHODS]
    return {m.path: m for m in methods}
