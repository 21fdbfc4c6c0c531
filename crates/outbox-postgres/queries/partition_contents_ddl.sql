-- Partitioned mode: the query that counts what a detached partition still holds, built by
-- format() (%I-quoted): rows not delivered (pending or dead: never dropped), and rows
-- delivered at or after the cutoff $1 (still inside the retention window).
-- $1 schema, $2 partition name. The built query takes the cutoff as its own $1.
SELECT format('SELECT count(*) FILTER (WHERE state <> ''delivered''), '
              || 'count(*) FILTER (WHERE state = ''delivered'' AND delivered_at >= $1), '
              || 'count(*) FROM %I.%I', $1::text, $2::text)
