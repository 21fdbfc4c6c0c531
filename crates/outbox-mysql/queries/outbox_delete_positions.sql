-- Deletes rows by position (a purge of dead letters, selected and locked first).
-- ? = JSON array of positions.
DELETE o
FROM JSON_TABLE(?, '$[*]' COLUMNS (p BIGINT PATH '$')) AS d
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = d.p
