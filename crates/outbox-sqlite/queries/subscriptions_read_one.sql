-- One catalog row's filter and sink (inside migrate's BEGIN IMMEDIATE); primary key.
SELECT filter, sink FROM {{name:_subscriptions}} WHERE name = ?1
