//! The boxed future of the crate's object-safe traits ([`DynSink`](crate::sink::DynSink), the
//! backend and verification traits), in a module of its own so that those modules need not
//! import one another for it.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
