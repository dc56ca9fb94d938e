"""The services' garbage collector once started (backbone/service.py ``tune_gc``): what they started
with is frozen out of collections, the youngest generation is collected less often, and cycles made
afterwards are still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from backbone.service import GC_YOUNGEST_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_start_up_objects_are_frozen_and_later_cycles_still_go(restored_gc: None) -> None:
    started_with = Node()
    _, middle, oldest = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > 0 and gc.get_threshold() == (GC_YOUNGEST_THRESHOLD, middle, oldest)
    assert gc.is_tracked(started_with) and started_with not in gc.get_objects()  # frozen: never scanned
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made after start-up: reference counting alone never frees it
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
