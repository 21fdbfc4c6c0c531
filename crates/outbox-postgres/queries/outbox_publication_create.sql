-- The CDC publication: inserts of the outbox table only. Updates (dead-lettering) and deletes
-- (retention) are not published, so they cost the stream nothing and never look like events.
CREATE PUBLICATION {{publication}} FOR TABLE {{table}} WITH (publish = 'insert')
