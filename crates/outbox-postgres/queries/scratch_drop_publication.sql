-- `outbox crash-test`: drops a scratch outbox's CDC publication (named after the scratch table).
DROP PUBLICATION IF EXISTS {{publication}}
