"""The services' event loop: uvloop by default, asyncio's own on request, anything else refused."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from backbone.config import ConfigError
from backbone.service import event_loop_factory


def test_uvloop_by_name_and_asyncio_by_name() -> None:
    for name, kind in (("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)):
        loop = event_loop_factory(name)()
        try:
            assert isinstance(loop, kind)
            assert loop.run_until_complete(asyncio.sleep(0, result=name)) == name
        finally:
            loop.close()
    plain = event_loop_factory("asyncio")()
    try:
        assert not isinstance(plain, uvloop.Loop)
    finally:
        plain.close()


@pytest.mark.parametrize("name", ["", "UVLOOP", "tokio"])
def test_an_unknown_loop_is_a_configuration_error(name: str) -> None:
    with pytest.raises(ConfigError, match="NIUNIU_EVENT_LOOP must be uvloop or asyncio"):
        event_loop_factory(name)
