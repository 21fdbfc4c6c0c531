-- The dead letters a retry selects, locked until the retry commits. ? = JSON array of ids
-- or NULL, ? = event_type or NULL, ? = 1 for every dead letter.
SELECT position, id
FROM {{table}}
WHERE state = 'dead'
  AND (? OR JSON_CONTAINS(COALESCE(?, '[]'), JSON_QUOTE(id)) OR event_type = ?)
ORDER BY position
FOR UPDATE
