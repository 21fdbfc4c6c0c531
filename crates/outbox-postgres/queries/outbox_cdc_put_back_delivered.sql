-- CDC: put-back rows the broker acknowledged are no longer waited for (the UPDATE is no
-- stream event: the publication streams inserts only). $1 = ids.
UPDATE {{table}} SET last_error = NULL
WHERE id = ANY($1) AND state = 'pending' AND attempts = 0 AND last_error IS NOT NULL
