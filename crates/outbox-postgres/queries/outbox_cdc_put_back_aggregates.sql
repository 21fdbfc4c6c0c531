-- CDC: aggregates with dead letters put back in line (`outbox dead retry`) and not delivered
-- since, read when streaming starts: an event of theirs that the slot's unconfirmed tail
-- streams again must not overtake those rows, which stream from where the retry committed.
-- Reads *_put_back_idx (migration 0005); usually empty.
SELECT DISTINCT aggregate_type, aggregate_id FROM {{table}}
WHERE state = 'pending' AND attempts = 0 AND last_error IS NOT NULL
