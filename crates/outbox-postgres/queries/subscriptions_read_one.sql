-- One catalog row's filter and sink, locked until migrate's transaction commits; primary key.
SELECT filter, sink FROM {{qname:_subscriptions}} WHERE name = $1 FOR UPDATE
