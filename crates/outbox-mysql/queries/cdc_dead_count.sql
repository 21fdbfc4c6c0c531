-- CDC mode: dead letters (streamed rows stay `pending`, so this is the only row count
-- `status` can take from the table).
SELECT COUNT(*) FROM {{table}} WHERE state = 'dead'
