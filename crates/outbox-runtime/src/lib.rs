//! The outbox relay as a library: everything `outbox relay` does, for a Rust service that
//! wants to run the relay inside its own tokio runtime.
//!
//! - [`config`]: the `outbox.toml` tree (`[source]`, `[relay]`, `[sink]`, `[metrics]`,
//!   `[retention]`, `[ui]`, `[tracing]`), unknown keys refused, environment overrides;
//! - [`registry`]: the one file that names the databases and the brokers;
//! - [`relay`]: builds the backend's pipelines and the sink, runs the relay with the
//!   watchdog, the metrics endpoint and the retention schedule, and drains on shutdown;
//! - [`reload`]: SIGHUP and the console's reload: the file read again, checked, the changes
//!   logged, the pipelines drained and started again in the same process;
//! - [`console`]: the web console at `/ui` on the metrics listener;
//! - [`story`]: what `outbox why` and `outbox dead show` tell, for the CLI and the console;
//! - [`otlp`]: `[tracing]`, a span per publish attempt exported over OTLP/HTTP;
//! - [`verify`]: `outbox verify`, the table's deliveries reconciled with the destination;
//! - [`catalog`]: the subscription catalog (`<table>_subscriptions`) the fan-out routes by;
//! - [`canary`]: `[canary]`, a probe event the relay writes and reads back on a schedule;
//! - [`schemas`]: `[payload] schemas`, payloads validated against JSON Schema files.
//!
//! ```no_run
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn service() -> Result<(), outbox_runtime::RuntimeError> {
//! let config = outbox_runtime::Config::from_toml(
//!     r#"
//!     [source]
//!     kind = "postgres"
//!     url = "postgres://app@127.0.0.1:5432/app"
//!
//!     [sink]
//!     kind = "nats"
//!     url = "nats://127.0.0.1:4222"
//!     "#,
//! )?;
//! let shutdown = CancellationToken::new(); // cancel it when your service stops
//! let report = outbox_runtime::run_relay(config, shutdown).await?;
//! println!("delivered {} events", report.delivered);
//! # Ok(())
//! # }
//! ```

pub mod canary;
pub mod catalog;
pub mod config;
pub mod console;
#[cfg(feature = "fault-injection")]
mod fault_injection;
pub mod observe;
pub mod otlp;
pub mod payload;
mod pipeline;
mod readiness;
pub mod registry;
pub mod relay;
pub mod reload;
pub mod retention;
pub mod schemas;
mod sink;
pub mod story;
pub mod subscription;
pub mod verify;

pub use canary::CanaryConfig;
pub use config::{Config, ConfigError, MetricsConfig, Origin, SinkConfig, SourceConfig};
pub use console::UiConfig;
pub use otlp::TracingConfig;
pub use outbox_core::RelayReport;
pub use payload::PayloadConfig;
pub use retention::RetentionConfig;
pub use tokio_util::sync::CancellationToken;

#[doc(hidden)]
/// What the registry macros expand to; not an API.
pub mod __private {
    pub use figment::{Error as FigmentError, Figment};
    pub use outbox_core::Identifier;
    pub use outbox_core::RelayConfig;
    pub use outbox_core::backend::{Backend, BackendConfig, OpenError, OpenOptions};
}

/// Why the relay could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be opened.
    #[error(transparent)]
    Open(outbox_core::OpenError),
    /// The database refused what the relay needs (schema missing, permissions).
    #[error(transparent)]
    Source(outbox_core::SourceError),
    /// The sink is misconfigured.
    #[error("{0}")]
    Sink(String),
    /// The metrics endpoint could not start.
    #[error("{0}")]
    Metrics(String),
    /// A signal handler could not be installed.
    #[error("{0}")]
    Signal(String),
    /// The trace exporter (`[tracing]`) could not start.
    #[error("{0}")]
    Tracing(String),
    /// The relay stopped with an error.
    #[error("relay stopped: {0}")]
    Relay(String),
}

/// Runs the relay of `config` until `shutdown` is cancelled, then drains the batch in flight.
/// See [`relay::run`].
pub async fn run_relay(
    config: Config,
    shutdown: CancellationToken,
) -> Result<RelayReport, RuntimeError> {
    relay::run(config, &Origin::Code, shutdown).await
}
