-- 0003: the CDC relay's acknowledged position, kept durably (CDC mode only; empty otherwise).
--
-- A logical replication slot saves its confirmed position only at checkpoints. After a
-- database crash the slot comes back where the last checkpoint left it, and a relay that
-- trusts it would publish again everything acknowledged since (measured: more duplicates
-- than the whole traffic of a 30 s run with two crashes). The relay commits the slot's new
-- confirmed position here after the broker acknowledged the events (at most every 100 ms),
-- as Debezium keeps its offsets, and on start skips the transactions that end at or before
-- it. `confirmed_lsn` is an LSN as a number (`pg_lsn - '0/0'`); one row per slot.
CREATE TABLE IF NOT EXISTS {{qname:_cdc_offsets}} (
    slot          text        PRIMARY KEY,
    confirmed_lsn bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
