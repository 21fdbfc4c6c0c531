-- `outbox capture snapshot` start: the primary-key columns of table ? in the outbox's
-- database, in key order, with their types (DATA_TYPE, COLUMN_TYPE: `unsigned` shows there).
SELECT CAST(k.COLUMN_NAME AS CHAR), CAST(c.DATA_TYPE AS CHAR), CAST(c.COLUMN_TYPE AS CHAR)
FROM information_schema.KEY_COLUMN_USAGE AS k
JOIN information_schema.COLUMNS AS c
  ON c.TABLE_SCHEMA = k.TABLE_SCHEMA AND c.TABLE_NAME = k.TABLE_NAME
 AND c.COLUMN_NAME = k.COLUMN_NAME
WHERE k.TABLE_SCHEMA = DATABASE() AND k.TABLE_NAME = ? AND k.CONSTRAINT_NAME = 'PRIMARY'
ORDER BY k.ORDINAL_POSITION
