-- Releases `migrate`'s named lock ?.
SELECT RELEASE_LOCK(?)
