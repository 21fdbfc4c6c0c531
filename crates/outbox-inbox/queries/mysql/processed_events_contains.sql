-- Whether consumer ? has processed event ? (primary key lookup).
SELECT EXISTS (SELECT 1 FROM {{table}} WHERE consumer = ? AND event_id = ?)
