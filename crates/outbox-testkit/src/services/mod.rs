//! Real servers for integration tests, on 127.0.0.1: [`Postgres`], [`Nats`] (JetStream),
//! [`Redis`], [`RabbitMq`], `Kafka` (tansu; feature `kafka`) and [`HttpReceiver`] (a recording
//! webhook endpoint). For failover tests, [`PostgresPair`] (a primary and a streaming standby)
//! and [`MariaDbPair`] (a primary and a GTID replica), with `crate::forwarder::Forwarder` as
//! the stable address in front of them.
//!
//! Servers are started from the installed binaries (no Docker). Each has a *shared* instance
//! per test process, which honours an environment variable naming an existing server
//! ([`DATABASE_URL_ENV`], [`NATS_URL_ENV`], [`REDIS_URL_ENV`], [`AMQP_URL_ENV`];
//! `scripts/test.sh` starts one of each for the whole run), and *private* instances owned by
//! one test, which may stop and restart them to simulate outages. Every server this process
//! starts dies with it, even when the process is killed: a watchdog shell polls the test
//! process and stops the server once it is gone.

mod http;
#[cfg(feature = "kafka")]
mod kafka;
mod mariadb;
mod mariadb_pair;
mod methods;
mod moto;
mod nats;
mod pgbouncer;
mod postgres;
mod postgres_pair;
mod process;
mod pubsub;
mod rabbitmq;
mod redis;
mod server;

pub use http::{HttpReceiver, Request};
#[cfg(feature = "kafka")]
pub use kafka::{
    KAFKA_BROKERS_ENV, Kafka, KafkaSecurity, KafkaUser, Scram, TANSU_BIN_ENV, find_tansu,
};
pub use mariadb::{MYSQL_URL_ENV, MariaDb};
pub use mariadb_pair::MariaDbPair;
pub use moto::{MOTO_BIN_ENV, MOTO_URL_ENV, Moto};
pub use nats::{NATS_URL_ENV, Nats};
pub use pgbouncer::PgBouncer;
pub use postgres::{DATABASE_URL_ENV, Postgres};
pub use postgres_pair::{PostgresPair, STANDBY_NAME};
pub use pubsub::{
    PUBSUB_EMULATOR_ENV, PUBSUB_HOST_ENV, PubSubEmulator, PulledMessage, find_emulator,
};
pub use rabbitmq::{AMQP_URL_ENV, RabbitMq};
pub use redis::{REDIS_URL_ENV, Redis};
