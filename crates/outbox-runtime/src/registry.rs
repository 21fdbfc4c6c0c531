//! The one place that names the databases and the brokers.
//!
//! Adding a database is its crate (a [`outbox_core::BackendConfig`] implementation) plus one line in
//! `source_registry!` below; adding a sink is its folder in `outbox-sinks` (a [`BuildSink`]
//! implementation) plus one line in `sinks!`. Nothing else in the runtime or the CLI names a
//! database or a broker. `docs/architecture.md` walks through both.

use figment::Figment;
use outbox_core::{BuildSink, DynSink, Event, SinkError};

/// Generates a `[source]` registry: an enum tagged by `kind` with one variant per
/// [`BackendConfig`](outbox_core::BackendConfig), and the methods the runtime calls on it (`kind`, `validate`,
/// `describe`, `open`, `kind_of_url`). The runtime's own registry is [`SourceConfig`] below;
/// a test or an application with a database of its own can build another one (the caller
/// depends on `serde`):
///
/// ```ignore
/// outbox_runtime::source_registry! {
///     /// My sources.
///     pub enum MySources {
///         /// An in-house store.
///         Mine(my_store::MyConfig),
///         /// SQLite.
///         Sqlite(outbox_sqlite::SqliteConfig),
///     }
/// }
/// ```
#[macro_export]
macro_rules! source_registry {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $( #[doc = $doc:literal] $(#[cfg($cfg:meta)])? $variant:ident($config:ty) ),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, ::serde::Deserialize, ::serde::Serialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        $vis enum $name {
            $( #[doc = $doc] $(#[cfg($cfg)])? $variant($config), )+
        }

        impl $name {
            /// Every `kind` this registry knows, in registry order.
            pub const KINDS: &'static [&'static str] =
                &[$( $(#[cfg($cfg)])? <$config as $crate::__private::BackendConfig>::KIND, )+];

            /// The `kind`.
            pub fn kind(&self) -> &'static str {
                match self { $( $(#[cfg($cfg)])? Self::$variant(_) => <$config as $crate::__private::BackendConfig>::KIND, )+ }
            }
            /// Checks what serde cannot, against the relay settings.
            pub fn validate(&self, relay: &$crate::__private::RelayConfig) -> Result<(), String> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => $crate::__private::BackendConfig::validate(c, relay), )+ }
            }
            /// The database for messages, secrets redacted.
            pub fn describe(&self) -> String {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => $crate::__private::BackendConfig::describe(c), )+ }
            }
            /// The same database with subscription `name`'s table as the outbox table;
            /// `Err` when this kind cannot keep one.
            pub fn for_subscription(&self, name: &str) -> Result<Self, String> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => $crate::__private::BackendConfig::for_subscription(c, name).map(Self::$variant), )+ }
            }
            /// The same database with a scratch outbox named `tag` (`outbox crash-test`);
            /// `Err` when this kind cannot have one.
            pub fn scratch(&self, tag: &$crate::__private::Identifier) -> Result<Self, String> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => $crate::__private::BackendConfig::scratch(c, tag).map(Self::$variant), )+ }
            }
            /// Connects.
            pub async fn open(
                &self,
                options: $crate::__private::OpenOptions,
            ) -> Result<::std::sync::Arc<dyn $crate::__private::Backend>, $crate::__private::OpenError> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => $crate::__private::BackendConfig::open(c, options).await, )+ }
            }
            /// The `kind` a `--database-url` without `[source] kind` means, if any.
            pub fn kind_of_url(url: &str) -> Option<&'static str> {
                $( $(#[cfg($cfg)])? {
                    if <$config as $crate::__private::BackendConfig>::claims_url(url) {
                        return Some(<$config as $crate::__private::BackendConfig>::KIND);
                    }
                } )+
                None
            }
            /// The precise error of a `[source]` section read as `kind`'s own type (serde
            /// reports errors inside a tagged enum at the section only).
            pub fn extract_error(
                kind: &str,
                section: &$crate::__private::Figment,
            ) -> Option<$crate::__private::FigmentError> {
                $( $(#[cfg($cfg)])? {
                    if kind == <$config as $crate::__private::BackendConfig>::KIND {
                        return section.extract::<$config>().err();
                    }
                } )+
                None
            }
        }
    };
}

/// Generates [`BrokerConfig`]: the broker part of a `[sink]` section, tagged by `kind`.
macro_rules! sinks {
    ($( #[doc = $doc:literal] $(#[cfg($cfg:meta)])? $variant:ident($config:ty) ),+ $(,)?) => {
        /// The broker of a `[sink]`, chosen by `kind`, with its own keys.
        #[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        pub enum BrokerConfig {
            $( #[doc = $doc] $(#[cfg($cfg)])? $variant($config), )+
        }

        impl BrokerConfig {
            /// The `kind`.
            pub fn kind(&self) -> &'static str {
                match self { $( $(#[cfg($cfg)])? Self::$variant(_) => <$config as BuildSink>::KIND, )+ }
            }
            /// The largest message it sends, if it has a limit (see
            /// [`BuildSink::message_limit`]).
            pub fn message_limit(&self) -> Option<usize> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::message_limit(c), )+ }
            }
            /// Checks what serde cannot.
            pub fn validate(&self) -> Result<(), String> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::validate(c), )+ }
            }
            /// Connects to the broker.
            pub async fn build(&self) -> Result<Box<dyn DynSink>, SinkError> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::build(c).await, )+ }
            }
            /// Connects a reader of the destination for `outbox verify` (see
            /// [`BuildSink::read_back`]).
            pub async fn read_back(&self) -> Result<Box<dyn outbox_core::verify::ReadBack>, outbox_core::verify::ReadBackError> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::read_back(c).await, )+ }
            }
            /// The same broker with a scratch destination named after `tag` (see
            /// [`BuildSink::scratch`]); `Err` says why this kind has none.
            pub fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::scratch(c, tag).map(Self::$variant), )+ }
            }
            /// Deletes the scratch destination (see [`BuildSink::remove_scratch`]).
            pub async fn remove_scratch(&self) -> Result<String, SinkError> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::remove_scratch(c).await, )+ }
            }
            /// Checks the broker without changing anything (see [`BuildSink::check`]).
            pub async fn check(&self) -> Result<String, SinkError> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::check(c).await, )+ }
            }
            /// Replaces the destination template (a subscription's `destination`); `Err` for
            /// a kind whose target is a URL or an ARN.
            pub fn set_destination(&mut self, destination: outbox_core::Destination) -> Result<(), String> {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => match BuildSink::destination_mut(c) {
                    Some(d) => { *d = destination; Ok(()) }
                    None => Err(format!("sink kind = \"{}\" has no destination template to replace; give this subscription a [sinks.NAME] of its own instead", <$config as BuildSink>::KIND)),
                }, )+ }
            }
            /// Where `event` goes, for people.
            pub fn describe_destination(&self, event: &Event) -> String {
                match self { $( $(#[cfg($cfg)])? Self::$variant(c) => BuildSink::describe_destination(c, event), )+ }
            }
            /// See [`SourceConfig::extract_error`].
            pub fn extract_error(kind: &str, section: &Figment) -> Option<figment::Error> {
                $( $(#[cfg($cfg)])? {
                    if kind == <$config as BuildSink>::KIND {
                        return section.extract::<$config>().err();
                    }
                } )+
                None
            }
        }
    };
}

source_registry! {
    /// `[source]`: the database holding the outbox, chosen by `kind`.
    pub enum SourceConfig {
        /// PostgreSQL: polling (`FOR UPDATE SKIP LOCKED`) or CDC (logical replication).
        #[cfg(feature = "postgres")]
        Postgres(outbox_postgres::PostgresConfig),
        /// SQLite, the embedded default.
        Sqlite(outbox_sqlite::SqliteConfig),
        /// MySQL 8 / MariaDB 10.6+: polling (`FOR UPDATE SKIP LOCKED`).
        #[cfg(feature = "mysql")]
        Mysql(outbox_mysql::MySqlConfig),
        /// DynamoDB (single-table design), relayed from the table's stream.
        #[cfg(feature = "dynamodb")]
        Dynamodb(outbox_dynamodb::DynamoDbConfig),
    }
}

sinks! {
    /// NATS JetStream.
    #[cfg(feature = "nats")]
    Nats(outbox_sinks::NatsConfig),
    /// HTTP webhooks.
    #[cfg(feature = "http")]
    Http(outbox_sinks::HttpConfig),
    /// JSON lines on standard output.
    Stdout(outbox_sinks::StdoutConfig),
    /// JSON lines appended to a file.
    File(outbox_sinks::FileConfig),
    /// Kafka (idempotent producer).
    #[cfg(feature = "kafka")]
    Kafka(outbox_sinks::KafkaConfig),
    /// Redis Streams (`XADD`).
    #[cfg(feature = "redis")]
    Redis(outbox_sinks::RedisConfig),
    /// RabbitMQ (publisher confirms, mandatory routing).
    #[cfg(feature = "rabbitmq")]
    Rabbitmq(outbox_sinks::RabbitMqConfig),
    /// Amazon SQS (standard and FIFO queues).
    #[cfg(feature = "sqs")]
    Sqs(outbox_sinks::SqsConfig),
    /// Amazon SNS (standard and FIFO topics).
    #[cfg(feature = "sns")]
    Sns(outbox_sinks::SnsConfig),
    /// Amazon Kinesis Data Streams.
    #[cfg(feature = "kinesis")]
    Kinesis(outbox_sinks::KinesisConfig),
    /// Google Cloud Pub/Sub.
    #[cfg(feature = "pubsub")]
    Pubsub(outbox_sinks::PubSubConfig),
}

/// The kinds a build can leave out, each with a cargo feature of its own name (the default
/// features have them all): a config naming one that this build lacks gets that said.
pub(crate) const OPTIONAL_KINDS: &[&str] = &[
    "postgres", "mysql", "dynamodb", "nats", "http", "kafka", "redis", "rabbitmq", "sqs", "sns",
    "kinesis", "pubsub",
];

impl Default for SourceConfig {
    /// The embedded default: SQLite `outbox.db`.
    fn default() -> Self {
        Self::Sqlite(outbox_sqlite::SqliteConfig::default())
    }
}

impl Default for BrokerConfig {
    /// The embedded default: JSON lines on stdout.
    fn default() -> Self {
        Self::Stdout(outbox_sinks::StdoutConfig::default())
    }
}

/// `[sink]` or one `[sinks.NAME]`: the broker (its `kind` and keys) and what happens to
/// payloads on their way to it (`claim_check`, `encryption`: docs/payloads.md).
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
pub struct SinkConfig {
    /// Large payloads to a store, a reference on the broker. Unset: `[payload]`'s, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_check: Option<outbox_payload::claim_check::ClaimCheckConfig>,
    /// Payloads (or some JSON fields) encrypted. Unset: `[payload]`'s, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<outbox_payload::encryption::EncryptionConfig>,
    /// The broker. Flattened: its `kind` and keys sit in the same table (each broker's own
    /// type refuses unknown keys).
    #[serde(flatten)]
    pub broker: BrokerConfig,
}

/// The keys of a `[sink]` table that are not the broker's.
pub(crate) const PAYLOAD_KEYS: [&str; 2] = ["claim_check", "encryption"];

impl From<BrokerConfig> for SinkConfig {
    fn from(broker: BrokerConfig) -> Self {
        Self {
            broker,
            claim_check: None,
            encryption: None,
        }
    }
}

impl SinkConfig {
    /// The broker's `kind`.
    pub fn kind(&self) -> &'static str {
        self.broker.kind()
    }
    /// Checks what serde cannot: the broker's keys, then the payload options against its
    /// message limit.
    pub fn validate(&self) -> Result<(), String> {
        self.broker.validate()?;
        self.own_payload()
            .validate(self.broker.message_limit())
            .map_err(|e| format!("sink.{e}"))
    }
    /// This sink's own `claim_check` and `encryption`.
    pub fn own_payload(&self) -> outbox_payload::PayloadOptions {
        outbox_payload::PayloadOptions {
            claim_check: self.claim_check.clone(),
            encryption: self.encryption.clone(),
        }
    }
    /// What applies to this sink's payloads: its own keys, each unset one from `global`
    /// (`[payload]`).
    pub fn payload(
        &self,
        global: &outbox_payload::PayloadOptions,
    ) -> outbox_payload::PayloadOptions {
        self.own_payload().or(global)
    }
    /// Connects to the broker (the payload options are applied by the relay around it).
    pub async fn build(&self) -> Result<Box<dyn DynSink>, SinkError> {
        self.broker.build().await
    }
    /// See [`BrokerConfig::read_back`].
    pub async fn read_back(
        &self,
    ) -> Result<Box<dyn outbox_core::verify::ReadBack>, outbox_core::verify::ReadBackError> {
        self.broker.read_back().await
    }
    /// The same sink with a scratch destination (see [`BrokerConfig::scratch`]).
    pub fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
        Ok(Self {
            broker: self.broker.scratch(tag)?,
            ..self.clone()
        })
    }
    /// See [`BrokerConfig::remove_scratch`].
    pub async fn remove_scratch(&self) -> Result<String, SinkError> {
        self.broker.remove_scratch().await
    }
    /// See [`BrokerConfig::check`].
    pub async fn check(&self) -> Result<String, SinkError> {
        self.broker.check().await
    }
    /// See [`BrokerConfig::set_destination`].
    pub fn set_destination(&mut self, destination: outbox_core::Destination) -> Result<(), String> {
        self.broker.set_destination(destination)
    }
    /// See [`BrokerConfig::describe_destination`].
    pub fn describe_destination(&self, event: &Event) -> String {
        self.broker.describe_destination(event)
    }
    /// See [`BrokerConfig::message_limit`].
    pub fn message_limit(&self) -> Option<usize> {
        self.broker.message_limit()
    }
    /// See [`SourceConfig::extract_error`]; the payload keys are read on their own.
    pub fn extract_error(kind: &str, section: &Figment) -> Option<figment::Error> {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Payload {
            claim_check: Option<outbox_payload::claim_check::ClaimCheckConfig>,
            encryption: Option<outbox_payload::encryption::EncryptionConfig>,
        }
        if let Err(e) = section.extract::<Payload>() {
            return Some(e);
        }
        let mut keys: figment::value::Dict = section.extract().ok()?;
        for key in PAYLOAD_KEYS {
            keys.remove(key);
        }
        let broker = Figment::from(figment::providers::Serialized::defaults(keys));
        let mut error = BrokerConfig::extract_error(kind, &broker)?;
        // The broker's type knows only its own keys; the table takes the payload keys too.
        if let figment::error::Kind::UnknownField(found, expected) = &error.kind {
            let all: Vec<&'static str> = expected.iter().copied().chain(PAYLOAD_KEYS).collect();
            // Leaked once, on the way to a config error that stops the process.
            error.kind = figment::error::Kind::UnknownField(
                found.clone(),
                Box::leak(all.into_boxed_slice()),
            );
        }
        Some(error)
    }
}
