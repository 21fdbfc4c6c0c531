//! The broker's side of a delivery: what the lanes ask of it ([`Settle`]) and what they get
//! from it ([`Incoming`]).

use std::time::Duration;

use futures::future::BoxFuture;

use super::super::BoxError;
use crate::InboxMessage;

/// What a broker does with a delivery once the lanes decided its fate. Implemented once per
/// broker; `Handle` is whatever the broker needs to ack it (the raw message, an entry id...).
pub(crate) trait Settle: Send + Sync + 'static {
    /// One delivery as the broker knows it.
    type Handle: Send + Sync + 'static;

    /// Acknowledges a delivery whose handler committed. An error is logged: the message
    /// comes back and the inbox reports a duplicate.
    fn ack(&self, handle: Self::Handle) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Hands a delivery to the broker's dead-letter mechanism with `reason`, then
    /// acknowledges it. An error leaves it unacknowledged (redelivered, not lost).
    fn dead_letter(
        &self,
        handle: Self::Handle,
        message: Option<&InboxMessage>,
        reason: &str,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Gives a delivery back unhandled (shutdown), for redelivery.
    fn release(&self, handle: Self::Handle) -> impl Future<Output = ()> + Send;

    /// How often a held delivery must be kept alive; `None`: never.
    fn keep_alive_every(&self) -> Option<Duration> {
        None
    }

    /// Tells the broker a delivery is still being worked on.
    fn keep_alive(&self, _handle: &Self::Handle) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The same as [`keep_alive`](Self::keep_alive) as a future that owns what it needs, so
    /// the sweeper can run it without holding the queues; `None` when there is nothing to do.
    fn keep_alive_owned(&self, _handle: &Self::Handle) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// One delivery on its way to the lanes.
pub(crate) struct Incoming<D> {
    /// The broker's handle.
    pub(crate) handle: D,
    /// The parsed message.
    pub(crate) message: InboxMessage,
    /// Deliveries of this message before this one, when the broker counts them.
    pub(crate) earlier_attempts: u32,
}
