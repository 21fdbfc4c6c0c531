-- Partitioned mode: the DDL that creates one range partition. DDL takes no bind parameters,
-- so the statement is built by the server's format(): %I quotes the partition's schema and
-- name, %L quotes the bounds (timestamptz values, written with their UTC offset). The
-- outbox table comes from sql::render. $1 schema, $2 partition name, $3 from, $4 to.
SELECT format('CREATE TABLE IF NOT EXISTS %I.%I PARTITION OF {{table}} FOR VALUES FROM (%L) TO (%L)',
              $1::text, $2::text, $3::timestamptz, $4::timestamptz)
