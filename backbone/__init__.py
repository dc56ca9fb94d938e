"""The event backbone every service stands on.

An event store with optimistic concurrency, a transactional outbox and its relay
to Kafka, a consumer framework with exactly-once effects, projection replay, a
Redis lease with fencing tokens, and the gRPC server bootstrap (health,
reflection, error mapping, metrics, JSON logs).
"""
