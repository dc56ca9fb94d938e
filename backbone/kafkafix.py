"""A producer that does not spin while its brokers are away (kafka-python 3.0).

kafka-python 3.0's ``ClusterMetadata.request_update`` wakes the client's network selector every time it
is called, even when an update is already wanted. A producer with records for partitions whose leader is
unknown (every partition, while the brokers are down) calls it on each turn of its sender thread, so the
turn's poll returns at once and the thread spins: with the broker stopped, the table's and the wallet's
relay threads took 0.70 and 0.77 of a core (``niuniu-load --rate 20`` and the broker sent SIGTERM), and a
restarted broker on the chaos run's two cores took two minutes to start among them.

``request_update_once`` wakes the selector only when the update becomes wanted. The metadata refresh loop
needs no second wake-up: while an update is wanted it sleeps only as long as the metadata backoff
(``ClusterMetadata.ttl``) and then refreshes, and a refresh that succeeds clears the flag, so the next
request wakes it again.
"""

from __future__ import annotations

from typing import Any

import kafka
from kafka.cluster import ClusterMetadata
from kafka.future import Future

AFFECTED = ("3.0.",)
"""kafka-python versions whose ``request_update`` wakes the selector on every call."""


def request_update_once(self: Any) -> Future:
    """``ClusterMetadata.request_update``, waking the network selector only when the flag is raised."""
    with self._lock:
        already_wanted = self._need_update
        self._need_update = True
        if not self._future or self._future.is_done:
            self._future = Future()
        pending = self._future
        if self._manager:
            self.start_refresh_loop()
            if not already_wanted:
                self._wakeup.notify()
    return pending


def patch_request_update() -> bool:
    """Replace ``ClusterMetadata.request_update`` on the affected versions; whether it was replaced."""
    if not kafka.__version__.startswith(AFFECTED):
        return False
    ClusterMetadata.request_update = request_update_once
    return True
