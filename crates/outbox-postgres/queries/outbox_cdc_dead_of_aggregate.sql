-- CDC: the dead letters of one aggregate, with their seq, checked before an event of an
-- aggregate known to have had dead letters is published (they may have been retried or
-- purged since). Reads *_held_idx. $1 aggregate_type, $2 aggregate_id.
SELECT id, seq FROM {{table}} WHERE state = 'dead' AND aggregate_type = $1 AND aggregate_id = $2
