"""A record key's hash, as Kafka's default partitioner computes it: the outbox row's ``key_hash``.

Written out here rather than taken from kafka-python (whose ``DefaultPartitioner`` computes the same;
``tests/backbone/test_partitions.py`` holds the two together) so the event store, which the gateway
imports for its errors, does not load the Kafka client.
"""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of a record key (its Java client's ``Utils.murmur2``), as an unsigned 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little") * m & mask
        k = (k ^ (k >> 24)) * m & mask
        h = (h * m & mask) ^ k
    tail = data[whole:]
    if tail:
        for i in reversed(range(len(tail))):
            h ^= tail[i] << (8 * i)
        h = h * m & mask
    h ^= h >> 13
    h = h * m & mask
    return h ^ (h >> 15)


def key_hash(record_key: str) -> int:
    """The outbox row's ``key_hash``: its partition on a topic of N partitions is ``key_hash % N``, the
    partition Kafka's default partitioner gives the key (``murmur2(key) & 0x7fffffff``, modulo N)."""
    return murmur2(record_key.encode()) & 0x7FFFFFFF
