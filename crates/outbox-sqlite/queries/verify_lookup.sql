-- `outbox verify`: the rows with these ids, in any state. ?1 = a JSON array of id texts.
SELECT id, state, seq, created_at
FROM {{table}}
WHERE id IN (SELECT value FROM json_each(?1))
