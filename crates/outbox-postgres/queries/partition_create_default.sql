-- Partitioned mode: the DEFAULT partition, a safety net for rows outside every range
-- partition (a producer's clock far off, or the relay and retention down for longer than
-- the partitions created ahead). Never dropped by retention.
CREATE TABLE IF NOT EXISTS {{qname:_default}} PARTITION OF {{table}} DEFAULT
