-- Puts delivered events back in line: pending, attempts reset, ready at once. `seq` is kept,
-- so each goes out again in its aggregate's order, before the aggregate's later pending
-- events, and the next claim numbers it like any event (the aggregate's next
-- `aggregate_seq`). ?1 = JSON array of ids. `state = 'delivered'` leaves a row an operator
-- or the relay changed meanwhile alone; the unique id index drives the lookup.
UPDATE {{table}}
SET state = 'pending', attempts = 0, next_attempt_at = 0, delivered_at = NULL,
    last_error = NULL
WHERE id IN (SELECT value FROM json_each(?1)) AND state = 'delivered'
