-- Serializes concurrent `outbox migrate` runs on one catalog (CREATE TABLE IF NOT EXISTS is
-- not safe against itself); released at commit.
SELECT pg_advisory_xact_lock(hashtext('{{qname:_subscriptions}}'))
