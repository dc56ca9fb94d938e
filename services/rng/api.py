"""The Rng gRPC servicer: proto in, application call, proto out."""

from __future__ import annotations

from typing import Any

import grpc
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc

from backbone.auth import Role, Tokens, require
from services.rng.app import RngApp

Context = grpc.aio.ServicerContext[Any, Any]


class RngServicer(rng_pb2_grpc.RngServicer):
    def __init__(self, app: RngApp, tokens: Tokens) -> None:
        self._app = app
        self._tokens = tokens

    def _table_only(self, context: Context) -> None:
        require(self._tokens.authenticate(context), Role.SERVICE, service="table")

    async def Commit(self, request: rng_pb2.CommitRequest, context: Context) -> rng_pb2.CommitResponse:
        require(self._tokens.authenticate(context), Role.SERVICE, Role.ADMIN, service="table")
        commitment = await self._app.commit(request.round_id, request.purpose or "deck")
        return rng_pb2.CommitResponse(round_id=request.round_id, commitment=commitment)

    async def GetCommitment(self, request: rng_pb2.GetCommitmentRequest, context: Context) -> rng_pb2.CommitResponse:
        self._tokens.authenticate(context)
        commitment = await self._app.commitment(request.round_id)
        return rng_pb2.CommitResponse(round_id=request.round_id, commitment=commitment)

    async def Draw(self, request: rng_pb2.DrawRequest, context: Context) -> rng_pb2.DrawResponse:
        self._table_only(context)
        cards, commitment, client_seed = await self._app.draw(
            request.round_id, request.deck_size, request.client_seed, request.client_seeds
        )
        return rng_pb2.DrawResponse(
            round_id=request.round_id, cards=cards, commitment=commitment, client_seed=client_seed
        )

    async def SplitEnvelope(
        self, request: rng_pb2.SplitEnvelopeRequest, context: Context
    ) -> rng_pb2.SplitEnvelopeResponse:
        self._table_only(context)
        split, commitment, client_seed = await self._app.split_envelope(
            request.round_id,
            request.total_minor,
            request.shares,
            request.min_minor,
            request.client_seed,
            request.client_seeds,
        )
        return rng_pb2.SplitEnvelopeResponse(
            round_id=request.round_id,
            amounts=split.amounts,
            grab_order=split.grab_order,
            commitment=commitment,
            client_seed=client_seed,
        )

    async def SetTestDeck(self, request: rng_pb2.SetTestDeckRequest, context: Context) -> rng_pb2.SetTestDeckResponse:
        require(self._tokens.authenticate(context), Role.ADMIN)
        size = await self._app.set_test_deck(request.round_id, request.cards)
        return rng_pb2.SetTestDeckResponse(round_id=request.round_id, deck_size=size)

    async def SetTestEnvelope(
        self, request: rng_pb2.SetTestEnvelopeRequest, context: Context
    ) -> rng_pb2.SetTestEnvelopeResponse:
        require(self._tokens.authenticate(context), Role.ADMIN)
        split = await self._app.set_test_envelope(request.round_id, request.amounts, request.grab_order)
        return rng_pb2.SetTestEnvelopeResponse(
            round_id=request.round_id, shares=len(split.amounts), total_minor=split.total_minor
        )

    async def Reveal(self, request: rng_pb2.RevealRequest, context: Context) -> rng_pb2.RevealResponse:
        self._tokens.authenticate(context)
        seed = await self._app.reveal(request.round_id)
        return rng_pb2.RevealResponse(
            round_id=seed.round_id,
            server_seed=seed.server_seed.hex(),
            commitment=seed.commitment,
            client_seed=seed.client_seed,
            deck_size=seed.deck_size,
            client_seeds=seed.client_seeds,
            envelope_client_seed=seed.envelope_client_seed,
            envelope_client_seeds=seed.envelope_client_seeds,
        )
