-- `outbox verify`: the rows with these ids ($1, uuid[]), in any state, by primary key.
SELECT id, state, seq, created_at
FROM {{table}}
WHERE id = ANY ($1::uuid[])
