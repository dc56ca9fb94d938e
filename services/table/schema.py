"""The table service's own tables. Rows are the current state; events are the record.

Every row change commits with the events that announce it, so the state can be
rebuilt from the event store, and the rows make the hot paths (a bet during the
betting window) a single indexed read.
"""

from __future__ import annotations

from backbone.lease import FENCE_SCHEMA

DDL = (
    """
    CREATE TABLE IF NOT EXISTS tables (
        table_id          TEXT PRIMARY KEY,
        variant           TEXT NOT NULL,
        config            JSONB NOT NULL,
        limits            BYTEA NOT NULL,
        config_version    INT NOT NULL,
        round_no          BIGINT NOT NULL DEFAULT 0,
        current_round_id  TEXT,
        created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
        -- CloseTable: asked (no bet accepted, no round opened from then on), then done (its last round ended).
        closing_at        TIMESTAMPTZ,
        closed_at         TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS rounds (
        round_id           TEXT PRIMARY KEY,
        table_id           TEXT NOT NULL REFERENCES tables (table_id),
        round_no           BIGINT NOT NULL,
        phase              TEXT NOT NULL,
        commitment         TEXT NOT NULL,
        config             JSONB NOT NULL,
        limits             BYTEA NOT NULL,
        config_version     INT NOT NULL,
        betting_closes_at  TIMESTAMPTZ NOT NULL,
        next_step_at       TIMESTAMPTZ,
        reveals_done       INT NOT NULL DEFAULT 0,
        deck               TEXT[],
        client_seed        TEXT NOT NULL DEFAULT '',
        server_seed        TEXT,
        void_reason        TEXT,
        fencing_token      BIGINT NOT NULL DEFAULT 0,
        opened_at          TIMESTAMPTZ NOT NULL,
        ended_at           TIMESTAMPTZ,
        UNIQUE (table_id, round_no)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS bets (
        bet_id       TEXT PRIMARY KEY,
        round_id     TEXT NOT NULL REFERENCES rounds (round_id),
        table_id     TEXT NOT NULL,
        player       TEXT NOT NULL,
        area         TEXT NOT NULL,
        stake_minor  BIGINT NOT NULL CHECK (stake_minor > 0),
        hold_minor   BIGINT NOT NULL CHECK (hold_minor >= stake_minor),
        hold_id      TEXT NOT NULL UNIQUE,
        status       TEXT NOT NULL,
        outcome      TEXT,
        net_minor    BIGINT,
        placed_at    TIMESTAMPTZ NOT NULL,
        -- The player's client seed contribution ('' for none), combined into the round's client seed.
        client_seed  TEXT NOT NULL DEFAULT ''
    )
    """,
    "CREATE INDEX IF NOT EXISTS bets_round_idx ON bets (round_id, player)",
    # A round's bets of any status (the bound MAX_BETS_PER_ROUND), counted by the statement that records
    # each one under the table's ordering lock: a lookup, not a count of the round's bets on every bet.
    """
    CREATE TABLE IF NOT EXISTS round_bet_counts (
        round_id  TEXT PRIMARY KEY REFERENCES rounds (round_id),
        bets      INT NOT NULL CHECK (bets > 0)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS seats (
        table_id   TEXT NOT NULL REFERENCES tables (table_id),
        player     TEXT NOT NULL,
        joined_at  TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (table_id, player)
    )
    """,
    # Settlements that pay from the jackpot pool, until the wallet has applied them (services/table/jackpot.py).
    """
    CREATE TABLE IF NOT EXISTS jackpot_claims (
        round_id          TEXT PRIMARY KEY,
        table_id          TEXT NOT NULL,
        pool_delta_minor  BIGINT NOT NULL CHECK (pool_delta_minor < 0),
        payable_minor     BIGINT NOT NULL CHECK (payable_minor >= 0),
        status            TEXT NOT NULL DEFAULT 'in_flight',
        claimed_at        TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    "CREATE INDEX IF NOT EXISTS jackpot_claims_in_flight_idx ON jackpot_claims (claimed_at) WHERE status = 'in_flight'",
    # The banker seat of banked variants (services/table/banker.py).
    """
    CREATE TABLE IF NOT EXISTS banker_seats (
        table_id        TEXT PRIMARY KEY REFERENCES tables (table_id),
        player          TEXT,
        capital_minor   BIGINT NOT NULL DEFAULT 0,
        rounds_banked   INT NOT NULL DEFAULT 0,
        leaving         BOOLEAN NOT NULL DEFAULT false
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS banker_queue (
        table_id       TEXT NOT NULL REFERENCES tables (table_id),
        player         TEXT NOT NULL,
        capital_minor  BIGINT NOT NULL CHECK (capital_minor >= 0),
        seq            BIGSERIAL,
        applied_at     TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (table_id, player)
    )
    """,
    "CREATE INDEX IF NOT EXISTS banker_queue_order_idx ON banker_queue (table_id, seq)",
    """
    CREATE TABLE IF NOT EXISTS banked_rounds (
        round_id          TEXT PRIMARY KEY,
        table_id          TEXT NOT NULL REFERENCES tables (table_id),
        banker            TEXT,
        capital_minor     BIGINT NOT NULL CHECK (capital_minor >= 0),
        hold_id           TEXT,
        hold_expires_at   TIMESTAMPTZ,
        table_cap_minor   BIGINT NOT NULL CHECK (table_cap_minor >= 0),
        staked_minor      BIGINT NOT NULL DEFAULT 0,
        CHECK (staked_minor >= 0 AND staked_minor <= table_cap_minor)
    )
    """,
    # Red-envelope rounds: bids, grabs, bet changes (services/table/round_envelope.py, bidding.py).
    """
    CREATE TABLE IF NOT EXISTS envelope_rounds (
        round_id           TEXT PRIMARY KEY,
        table_id           TEXT NOT NULL REFERENCES tables (table_id),
        bidding_closes_at  TIMESTAMPTZ NOT NULL,
        leading_bid_id     TEXT,
        highest_bid_minor  BIGINT NOT NULL DEFAULT 0,
        dealer             TEXT,
        dealer_pool_minor  BIGINT,
        dealer_hold_id     TEXT,
        dealer_hold_minor  BIGINT,
        redeal_of          TEXT,
        redeal             BOOLEAN NOT NULL DEFAULT false
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS envelope_bids (
        bid_id        TEXT PRIMARY KEY,
        round_id      TEXT NOT NULL REFERENCES envelope_rounds (round_id),
        player        TEXT NOT NULL,
        amount_minor  BIGINT NOT NULL CHECK (amount_minor > 0),
        hold_id       TEXT NOT NULL UNIQUE,
        hold_minor    BIGINT NOT NULL,
        status        TEXT NOT NULL,
        placed_at     TIMESTAMPTZ NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS envelope_bids_round_idx ON envelope_bids (round_id)",
    # The shares, stored when the envelope is sent; each leaves the server in its grab's event.
    """
    CREATE TABLE IF NOT EXISTS envelope_grabs (
        round_id      TEXT NOT NULL REFERENCES envelope_rounds (round_id),
        grab_no       INT NOT NULL,
        position      INT NOT NULL,
        participant   TEXT NOT NULL,
        bet_id        TEXT,
        amount_minor  BIGINT NOT NULL CHECK (amount_minor > 0),
        PRIMARY KEY (round_id, grab_no)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS bet_changes (
        change_id     TEXT PRIMARY KEY,
        bet_id        TEXT NOT NULL REFERENCES bets (bet_id),
        stake_minor   BIGINT NOT NULL,
        changed_at    TIMESTAMPTZ NOT NULL
    )
    """,
    # One open bet per player and round at a red-envelope table (its only area is the dealer).
    "CREATE UNIQUE INDEX IF NOT EXISTS bets_one_envelope_bet_idx ON bets (round_id, player)"
    " WHERE status = 'placed' AND area = 'dealer'",
    # The fencing tokens of the tables' leases (backbone/lease.py; also created by every service's start).
    *FENCE_SCHEMA,
)
