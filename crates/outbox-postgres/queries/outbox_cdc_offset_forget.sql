-- Forgets the saved position of slot $1: run when `migrate` creates the slot, so a slot
-- dropped and created again under the same name starts from its own position.
DELETE FROM {{qname:_cdc_offsets}} WHERE slot = $1
