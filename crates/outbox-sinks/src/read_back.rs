//! What the sinks' readers for `outbox verify` share: the [`outbox_core::verify::ReadBack`]
//! impl, which is the same for every reader but for how it describes itself and which field
//! holds its destination template (see [`impl_read_back`]), and [`Read`], the arguments of
//! one read.

use outbox_core::verify::{LedgerEvent, ReadProgress};
use time::OffsetDateTime;

/// What [`outbox_core::BuildSink::read_back`] returns (see the crate's `build_sink!`).
pub(crate) type ReadBackFuture<'a> = outbox_core::sink::BoxFuture<
    'a,
    Result<Box<dyn outbox_core::verify::ReadBack>, outbox_core::verify::ReadBackError>,
>;

/// The arguments of one [`outbox_core::verify::ReadBack::read`], as a reader's `read_all`
/// takes them.
pub(crate) struct Read<'a> {
    /// Read every message stored at or after this time.
    pub(crate) since: OffsetDateTime,
    /// The events the table says were delivered (the NATS and file readers read every
    /// stream or line without them: with only those sinks built, nothing reads this).
    #[allow(dead_code)]
    pub(crate) expected: &'a [LedgerEvent],
    /// Where the read reports how far it is.
    pub(crate) progress: &'a dyn ReadProgress,
}

/// Implements [`outbox_core::verify::ReadBack`] for a sink's reader: `describe` is the given
/// expression of the reader (`|r| ...`), `destination` the given field of it, and `read` the
/// reader's own `async fn read_all(&self, read: Read<'_>)`. With `debug: field`, also a
/// `Debug` that shows that field and the destination template. A macro because a blanket
/// impl of the core's trait over a local one is not allowed.
macro_rules! impl_read_back {
    (
        $reader:ident,
        describe: |$r:ident| $describe:expr,
        destination: $($field:ident).+
        $(, debug: $debug:ident)? $(,)?
    ) => {
        impl outbox_core::verify::ReadBack for $reader {
            fn describe(&self) -> String {
                let $r = self;
                $describe
            }

            fn destination(&self) -> &outbox_core::Destination {
                &self.$($field).+
            }

            fn read<'a>(
                &'a self,
                since: time::OffsetDateTime,
                expected: &'a [outbox_core::verify::LedgerEvent],
                progress: &'a dyn outbox_core::verify::ReadProgress,
            ) -> outbox_core::sink::BoxFuture<
                'a,
                Result<outbox_core::verify::ReadOutcome, outbox_core::verify::ReadBackError>,
            > {
                Box::pin(self.read_all(crate::read_back::Read {
                    since,
                    expected,
                    progress,
                }))
            }
        }

        $(
            impl std::fmt::Debug for $reader {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.debug_struct(stringify!($reader))
                        .field(stringify!($debug), &self.$debug)
                        .field("destination", &self.destination.template())
                        .finish_non_exhaustive()
                }
            }
        )?
    };
}
pub(crate) use impl_read_back;
