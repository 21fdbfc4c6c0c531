-- `outbox backfill`: which of these event ids subscription table {{table}} holds (unique
-- id index), in any state. ?1 = JSON array of ids.
SELECT id FROM {{table}} WHERE id IN (SELECT value FROM json_each(?1))
