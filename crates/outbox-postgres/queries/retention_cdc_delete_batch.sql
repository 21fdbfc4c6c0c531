-- Retention (CDC mode), step 3: deletes one bounded batch of streamed-and-confirmed events.
-- In CDC mode the relay leaves rows untouched (state stays 'pending'; the stream, not the
-- row, carries the event), so "delivered" is decided here: the row was created before the
-- cutoff $1 AND its inserting transaction's xid is older than $3, the horizon observed in
-- step 1 and since confirmed by the slot. $2 = batch size.
--
-- age(xid) = (newest xid - xid) in 32-bit modular arithmetic, evaluated with the same newest
-- xid for both sides, so `age(xmin) > age(horizon)` means "xmin is older than the horizon"
-- for every row younger than 2^31 transactions (vacuum guarantees that for unfrozen rows).
-- Dead letters (state = 'dead') are never selected: they have their own purge.
-- Reads *_pending_seq_idx in seq order, so the oldest rows come first and LIMIT ends the scan.
WITH gone AS (
    DELETE FROM {{table}}
    WHERE ctid = ANY (ARRAY(
              SELECT ctid
              FROM {{table}}
              WHERE state = 'pending'
                AND created_at < $1
                AND age(xmin) > age($3::text::xid)
              ORDER BY seq
              LIMIT $2
              FOR UPDATE SKIP LOCKED))
      AND state = 'pending'
      AND created_at < $1
      AND age(xmin) > age($3::text::xid)
    RETURNING 1
)
SELECT count(*) FROM gone
