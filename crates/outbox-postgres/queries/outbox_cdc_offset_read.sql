-- The acknowledged position the CDC relay saved for slot $1 (no row: never saved).
SELECT confirmed_lsn FROM {{qname:_cdc_offsets}} WHERE slot = $1
