-- Whether consumer ?1 has processed event ?2 (primary key lookup).
SELECT EXISTS (SELECT 1 FROM {{table}} WHERE consumer = ?1 AND event_id = ?2)
