-- 0006: room on every page of the delivery-position table for its rows' next versions.
--
-- The polling relay moves the `aggregate_seq` head of every aggregate of a batch in the
-- transaction that settles it (outbox_positions_advance.sql): one UPDATE per aggregate per
-- batch, on a table of one row per aggregate. With full pages each new row version lands on
-- another page and adds an index entry; with half the page kept free it usually stays on its
-- page as a heap-only tuple (no index write), and the old versions are pruned in place.
-- Measured: +8 % drain rate into a null sink (docs/benchmarks.md, "The polling ceiling").
-- Rows written before this migration keep their pages until they are rewritten.
ALTER TABLE {{qname:_aggregate_positions}} SET (fillfactor = 50);
