"""The banker seat's RPCs (ApplyBanker, LeaveBanker, GetBankerQueue), mixed into the Table servicer."""

from __future__ import annotations

from typing import Any

import grpc
from niuniu.table.v1 import table_pb2

from backbone.auth import Principal
from services.table.app import TableApp

Context = grpc.aio.ServicerContext[Any, Any]


class BankerRpcs:
    """Thin adapters: proto in, ``BankerSeats`` call, proto out."""

    _app: TableApp

    def _who(self, context: Context) -> Principal:
        raise NotImplementedError  # the Table servicer authenticates

    async def ApplyBanker(self, request: table_pb2.ApplyBankerRequest, context: Context) -> table_pb2.BankerQueue:
        return await self._app.banker.apply(self._who(context), request.table_id, request.capital_minor)

    async def LeaveBanker(self, request: table_pb2.LeaveBankerRequest, context: Context) -> table_pb2.BankerQueue:
        return await self._app.banker.leave_banker(self._who(context), request.table_id)

    async def GetBankerQueue(self, request: table_pb2.GetBankerQueueRequest, context: Context) -> table_pb2.BankerQueue:
        self._who(context)
        return await self._app.banker.queue(request.table_id)
