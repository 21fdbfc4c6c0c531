-- `outbox backfill`: inserts the backfilled events and the re-inserted pending rows of the
-- held aggregates into subscription table {{table}}, in array order (`n`), which is outbox
-- commit order per aggregate: the insert trigger numbers each row from the aggregate's head
-- in insert order, so the pipeline delivers and numbers them in that order. A re-inserted
-- row keeps its id, attempts, backoff and last error. ? = JSON array of objects: id, t
-- (aggregate type), i (aggregate id), e (event type), p (payload, hex), h (headers, JSON
-- object text), c (created_at, UTC), a (attempts), x (next attempt, UTC; absent: ready at
-- once), err (last error; absent: none).
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers,
                       created_at, attempts, next_attempt_at, last_error)
SELECT j.id, j.t, j.i, j.e, UNHEX(j.p), j.h, CAST(j.c AS DATETIME(6)), j.a,
       COALESCE(CAST(j.x AS DATETIME(6)), '1970-01-01 00:00:01'), j.err
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        n FOR ORDINALITY,
        id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$.id',
        t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.t',
        i VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.i',
        e VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.e',
        p LONGTEXT CHARACTER SET ascii PATH '$.p',
        h LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.h',
        c VARCHAR(32) CHARACTER SET ascii PATH '$.c',
        a INT PATH '$.a',
        x VARCHAR(32) CHARACTER SET ascii PATH '$.x',
        err LONGTEXT CHARACTER SET utf8mb4 PATH '$.err')) AS j
ORDER BY j.n
