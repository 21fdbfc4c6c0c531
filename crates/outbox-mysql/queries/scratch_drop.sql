-- `outbox crash-test`: drops a scratch outbox table and the tables its migrations and its
-- relay made beside it (the backend runs it only for a table named `outbox_crash_...`). The
-- trigger goes with its table. Statements are split at the `-- ;;` lines.
DROP TABLE IF EXISTS {{table}}
-- ;;
DROP TABLE IF EXISTS {{name:_aggregate_heads}}
-- ;;
DROP TABLE IF EXISTS {{name:_migrations}}
-- ;;
DROP TABLE IF EXISTS {{name:_cdc_position}}
