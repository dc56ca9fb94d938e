"""A producer's metadata requests wake its network selector once per wanted update, not once per call
(backbone/kafkafix.py): the sender thread of kafka-python 3.0 calls ``request_update`` on every turn while
a partition's leader is unknown, and each wake-up turned the next poll into a spin."""

from __future__ import annotations

from typing import Any

import kafka
from kafka.cluster import ClusterMetadata

import backbone.kafka  # noqa: F401  (applies the patch, as every client of the project gets it)
from backbone.kafkafix import AFFECTED, request_update_once


class _Net:
    """The network selector's one method the metadata's wake-up calls, counted."""

    def __init__(self) -> None:
        self.wakeups = 0

    def call_soon_threadsafe(self, callback: Any) -> None:
        self.wakeups += 1


class _Manager:
    """The connection manager as ``ClusterMetadata.attach`` and ``start_refresh_loop`` use it."""

    def __init__(self) -> None:
        self._net = _Net()
        self.loops_started = 0

    def call_soon(self, coroutine: Any) -> object:
        self.loops_started += 1
        return object()


def _attached() -> tuple[ClusterMetadata, _Manager]:
    cluster, manager = ClusterMetadata(), _Manager()
    cluster.attach(manager)
    cluster._need_update = False  # as a refresh that succeeded leaves it
    return cluster, manager


def test_the_project_runs_the_patched_request_update() -> None:
    assert kafka.__version__.startswith(AFFECTED)
    assert ClusterMetadata.request_update is request_update_once


def test_a_wanted_update_wakes_the_selector_once_however_often_it_is_requested() -> None:
    cluster, manager = _attached()
    futures = [cluster.request_update() for _ in range(1_000)]
    assert manager._net.wakeups == 1
    assert cluster.need_update
    assert all(f is futures[0] for f in futures)  # one pending update, one future for every caller
    assert manager.loops_started == 1  # the refresh loop, started once (idempotent)


def test_once_an_update_is_done_the_next_request_wakes_it_again() -> None:
    cluster, manager = _attached()
    first = cluster.request_update()
    first.success(cluster)
    cluster._need_update = False  # the refresh succeeded
    second = cluster.request_update()
    assert manager._net.wakeups == 2
    assert second is not first and not second.is_done
