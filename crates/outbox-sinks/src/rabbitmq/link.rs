//! The connection behind [`RabbitMqSink`]: connecting, declaring or checking the exchange,
//! opening the confirm-mode channel, and re-establishing them lazily after a failure.

use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::SinkError;

use super::RabbitMqSink;

/// An open connection and its confirm-mode publishing channel.
pub(super) struct Link {
    pub(super) connection: Connection,
    /// The publishing channels, in confirm mode (`channels` of them).
    pub(super) channels: Vec<Channel>,
}

/// Why the connection, the exchange or the channel could not be set up.
pub(super) struct SetupError {
    /// The broker answered but refused the setup (credentials, exchange missing or of another
    /// type): a configuration problem rather than an outage.
    misconfigured: bool,
    message: String,
    source: Option<lapin::Error>,
}

impl SetupError {
    fn unreachable(message: String, source: lapin::Error) -> Self {
        Self {
            misconfigured: false,
            message,
            source: Some(source),
        }
    }

    fn misconfigured(message: String, source: Option<lapin::Error>) -> Self {
        Self {
            misconfigured: true,
            message,
            source,
        }
    }

    /// At start-up a configuration problem stops the relay (`Rejected`).
    pub(super) fn at_startup(self) -> SinkError {
        let kind = if self.misconfigured {
            outbox_core::SinkErrorKind::Rejected
        } else {
            outbox_core::SinkErrorKind::Unavailable
        };
        self.into_error(kind)
    }

    /// While running, nothing about the setup is any one event's fault: an outage releases
    /// the batch (`Unavailable`), a configuration problem (the exchange was deleted) is
    /// retried with backoff (`Transient`).
    pub(super) fn at_runtime(self) -> SinkError {
        let kind = if self.misconfigured {
            outbox_core::SinkErrorKind::Transient
        } else {
            outbox_core::SinkErrorKind::Unavailable
        };
        self.into_error(kind)
    }

    fn into_error(self, kind: outbox_core::SinkErrorKind) -> SinkError {
        let error = SinkError::new(kind, self.message);
        match self.source {
            Some(source) => error.with_source(source),
            None => error,
        }
    }
}

/// The AMQP error a lapin error carries, if the broker sent one.
pub(super) fn amqp_error(e: &lapin::Error) -> Option<&lapin::protocol::AMQPError> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => Some(amqp),
        _ => None,
    }
}

fn is_soft(e: &lapin::Error, soft: AMQPSoftError) -> bool {
    amqp_error(e).is_some_and(|a| *a.kind() == AMQPErrorKind::Soft(soft))
}

/// True when the broker refused the login or the vhost (`ACCESS_REFUSED`, `NOT_ALLOWED`).
fn is_auth_failure(e: &lapin::Error) -> bool {
    if let Some(amqp) = amqp_error(e) {
        return matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                | AMQPErrorKind::Hard(lapin::protocol::AMQPHardError::NOTALLOWED)
        );
    }
    matches!(e.kind(), lapin::ErrorKind::AuthProviderError(_))
}

impl RabbitMqSink {
    /// Connects, declares or checks the exchange, and opens the publishing channel.
    pub(super) async fn open(&self) -> Result<Link, SetupError> {
        let properties = ConnectionProperties::default().with_connection_name(LongString::from(
            concat!("outbox/", env!("CARGO_PKG_VERSION")),
        ));
        crate::tls::choose_crypto_provider();
        let runtime = lapin::runtime::default_runtime().map_err(|e| SetupError {
            misconfigured: true,
            message: "no async runtime for the RabbitMQ client".to_owned(),
            source: Some(e),
        })?;
        let connection = match tokio::time::timeout(
            self.connect_timeout,
            Connection::connect_with_config(&self.url, properties, self.tls.clone(), runtime),
        )
        .await
        {
            Err(_) => {
                return Err(SetupError {
                    misconfigured: false,
                    message: format!(
                        "RabbitMQ at {} did not complete the handshake within {:?}",
                        self.shown_url, self.connect_timeout
                    ),
                    source: None,
                });
            }
            Ok(Err(e)) if is_auth_failure(&e) => {
                return Err(SetupError::misconfigured(
                    format!(
                        "RabbitMQ at {} refused the credentials or the vhost (check sink.url)",
                        self.shown_url
                    ),
                    Some(e),
                ));
            }
            Ok(Err(e)) => {
                return Err(SetupError::unreachable(
                    format!("cannot connect to RabbitMQ at {}", self.shown_url),
                    e,
                ));
            }
            Ok(Ok(connection)) => connection,
        };
        if let Err(e) = self.check_exchange(&connection).await {
            let _ = connection.close(200, "outbox: setup failed".into()).await;
            return Err(e);
        }
        let mut channels = Vec::with_capacity(self.channels);
        for _ in 0..self.channels {
            channels.push(self.open_channel(&connection).await?);
        }
        Ok(Link {
            connection,
            channels,
        })
    }

    /// A new channel in confirm mode.
    async fn open_channel(&self, connection: &Connection) -> Result<Channel, SetupError> {
        let lost = |e| {
            SetupError::unreachable(
                format!(
                    "cannot open a channel to RabbitMQ at {} (connection lost?)",
                    self.shown_url
                ),
                e,
            )
        };
        let channel = connection.create_channel().await.map_err(lost)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(lost)?;
        Ok(channel)
    }

    /// Declares the exchange (durable topic) or, with `declare_exchange = false`, checks that
    /// it exists. Uses a channel of its own: a refusal closes the channel it happened on.
    async fn check_exchange(&self, connection: &Connection) -> Result<(), SetupError> {
        if self.exchange.is_empty() {
            return Ok(());
        }
        let channel = connection.create_channel().await.map_err(|e| {
            SetupError::unreachable(
                format!("cannot open a channel to RabbitMQ at {}", self.shown_url),
                e,
            )
        })?;
        let options = ExchangeDeclareOptions {
            passive: !self.declare_exchange,
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let name = ShortString::from(self.exchange.as_str());
        let result = channel
            .exchange_declare(name, ExchangeKind::Topic, options, FieldTable::default())
            .await;
        match result {
            Ok(()) => {
                let _ = channel.close(200, "outbox: exchange checked".into()).await;
                Ok(())
            }
            Err(e) if is_soft(&e, AMQPSoftError::NOTFOUND) => Err(SetupError::misconfigured(
                format!(
                    "exchange `{}` does not exist on RabbitMQ at {} (sink.declare_exchange = \
                     false: create it, or let the sink declare it)",
                    self.exchange, self.shown_url
                ),
                Some(e),
            )),
            Err(e) if is_soft(&e, AMQPSoftError::PRECONDITIONFAILED) => {
                Err(SetupError::misconfigured(
                    format!(
                        "exchange `{}` exists on RabbitMQ at {} but is not a durable topic \
                         exchange (set sink.declare_exchange = false to publish to it as it is)",
                        self.exchange, self.shown_url
                    ),
                    Some(e),
                ))
            }
            Err(e) if is_soft(&e, AMQPSoftError::ACCESSREFUSED) => Err(SetupError::misconfigured(
                format!(
                    "the RabbitMQ user may not declare exchange `{}` on {}",
                    self.exchange, self.shown_url
                ),
                Some(e),
            )),
            Err(e) => Err(SetupError::unreachable(
                format!(
                    "cannot check exchange `{}` on RabbitMQ at {}",
                    self.exchange, self.shown_url
                ),
                e,
            )),
        }
    }

    /// The publishing channels, reconnecting or reopening those that were closed.
    pub(super) async fn channels(&self) -> Result<Vec<Channel>, SetupError> {
        let mut link = self.link.lock().await;
        if let Some(current) = link.as_mut()
            && current.connection.status().connected()
        {
            for channel in &mut current.channels {
                if !channel.status().connected() {
                    // The broker closed the channel (a refused message) but not the
                    // connection.
                    *channel = self.open_channel(&current.connection).await?;
                }
            }
            return Ok(current.channels.clone());
        }
        *link = None;
        let fresh = self.open().await?;
        let channels = fresh.channels.clone();
        *link = Some(fresh);
        Ok(channels)
    }

    /// A passive declaration of the exchange, on a channel of its own.
    pub(super) async fn exchange_exists(&self, connection: &Connection) -> Result<(), SetupError> {
        let channel = connection.create_channel().await.map_err(|e| {
            SetupError::unreachable(
                format!("cannot open a channel to RabbitMQ at {}", self.shown_url),
                e,
            )
        })?;
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let name = ShortString::from(self.exchange.as_str());
        match channel
            .exchange_declare(name, ExchangeKind::Topic, options, FieldTable::default())
            .await
        {
            Ok(()) => {
                let _ = channel.close(200, "outbox: healthcheck".into()).await;
                Ok(())
            }
            Err(e) if is_soft(&e, AMQPSoftError::NOTFOUND) => Err(SetupError::misconfigured(
                format!(
                    "exchange `{}` does not exist on RabbitMQ at {} (deleted after the sink \
                     started?)",
                    self.exchange, self.shown_url
                ),
                Some(e),
            )),
            Err(e) => Err(SetupError::unreachable(
                format!(
                    "RabbitMQ at {} did not answer the healthcheck",
                    self.shown_url
                ),
                e,
            )),
        }
    }
}
