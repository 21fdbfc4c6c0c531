-- `outbox verify`: the rows with these ids, in any state, by the unique key.
-- ? = JSON array of ids (lowercase UUID text).
SELECT o.id, o.state, o.seq, o.created_at
FROM JSON_TABLE(?, '$[*]' COLUMNS (id CHAR(36) CHARACTER SET ascii PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS o ON o.id = r.id COLLATE ascii_bin
