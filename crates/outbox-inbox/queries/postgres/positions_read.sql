-- The highest position of aggregate ($2, $3) that consumer $1 applied (primary key lookup).
SELECT applied_seq FROM {{qname:_positions}}
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
