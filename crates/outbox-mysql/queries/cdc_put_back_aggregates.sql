-- CDC mode: aggregates with dead letters put back to `pending` and not delivered since (read
-- when the stream starts: their events streamed again from the kept position must not
-- overtake those rows, which stream from where `dead retry` committed).
SELECT DISTINCT aggregate_type, aggregate_id FROM {{table}}
WHERE state = 'pending' AND last_error IS NOT NULL
