-- `outbox capture snapshot`, second statement of a chunk's transaction: the keys of the next
-- ? rows after the recorded key (@AFTER@: `key > ?` with the key bound first, or TRUE for
-- the first chunk), in key order, as text (@KEY_TEXT@), share-locked until the chunk
-- commits: a writer of one of these rows waits for the chunk, and a writer holding one made
-- this read wait for its commit (a locking read then sees its change, READ COMMITTED or not).
-- The table is aliased NEW so that the capture trigger's own expressions apply.
SELECT @KEY_TEXT@
FROM {{captured_table}} AS `NEW`
WHERE @AFTER@
ORDER BY NEW.{{key_column}}
LIMIT ?
LOCK IN SHARE MODE
