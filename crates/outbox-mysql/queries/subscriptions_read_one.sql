-- One catalog row's filter and sink, locked until migrate's transaction commits; primary key.
SELECT filter, sink FROM {{name:_subscriptions}} WHERE name = ? FOR UPDATE
