//! The steps every SQL database's `outbox crash-test` support shares (the
//! [`Scratch`](crate::backend::Scratch) ability and `BackendConfig::scratch`): building a
//! scratch config around the checked tag, and writing events in a transaction that is rolled
//! back. What differs per database (its config's fields, its transaction, its enqueue) comes
//! in as arguments.

use std::error::Error as StdError;
use std::future::Future;

use crate::relay::ErrorChain;
use crate::source::SourceError;

/// A scratch config for `tag`: `tag` checked to name a scratch outbox
/// ([`check_scratch_tag`](crate::backend::check_scratch_tag)), the config `build` makes of it
/// (the application's config with the table `tag` and short claims), then `validate`d.
pub fn scratch_config<C>(
    tag: &crate::Identifier,
    validate: impl FnOnce(&C) -> Result<(), String>,
    build: impl FnOnce(crate::Identifier) -> Result<C, String>,
) -> Result<C, String> {
    crate::backend::check_scratch_tag(tag)?;
    let scratch = build(tag.clone())?;
    validate(&scratch)?;
    Ok(scratch)
}

/// [`Scratch::roll_back`](crate::backend::Scratch::roll_back): in the transaction `begin`
/// opens, `write` the events (what it returns is dropped), then `roll_back` the transaction. A failed step is
/// unavailable, named in the message.
pub async fn write_and_roll_back<T, O, B, W, R>(
    begin: impl Future<Output = Result<T, B>>,
    write: impl AsyncFnOnce(&mut T) -> Result<O, W>,
    roll_back: impl AsyncFnOnce(T) -> Result<(), R>,
) -> Result<(), SourceError>
where
    B: StdError + 'static,
    W: StdError + 'static,
    R: StdError + 'static,
{
    let mut tx = begin
        .await
        .map_err(|e| unavailable("beginning a transaction", &e))?;
    write(&mut tx)
        .await
        .map_err(|e| unavailable("writing events", &e))?;
    roll_back(tx)
        .await
        .map_err(|e| unavailable("rolling back", &e))
}

fn unavailable(what: &str, e: &(dyn StdError + 'static)) -> SourceError {
    SourceError::unavailable(format!("{what}: {}", ErrorChain(e)))
}
