//! The relay lease: at most one relay claims events from a SQLite file at a time.
//!
//! SQLite has no row locks, so the PostgreSQL way (`FOR UPDATE SKIP LOCKED` lets replicas
//! claim disjoint batches) does not exist here: two relays reading the same file would
//! publish the same events and interleave their order. Instead one row in
//! `<table>_relay_lease` names the relay allowed to claim, until an expiry time:
//!
//! - A source takes the lease on its first fetch (if it is free or expired) and renews it on
//!   later fetches, writing at most once per [`RENEW_EVERY`], and in every settle
//!   transaction. The claim query runs only while the lease is held.
//! - Any other source on the same file is a **standby**: its fetch reads the lease row (a
//!   plain read, no write lock), sees it held and returns no events. Once the holder stops
//!   renewing (it died or hung) and the lease expires, or the holder releases it on shutdown,
//!   the next standby fetch takes it over. Taking it is one conditional upsert in a
//!   `BEGIN IMMEDIATE` transaction (see `writer.rs`), so of two standbys racing for it,
//!   exactly one wins.
//! - A holder that finds at settle time that its lease was taken over (it stalled past the
//!   expiry) records only its deliveries (facts about the broker) and leaves retries and dead
//!   letters to the new holder, which may publish some of the same events again: duplicates,
//!   never loss.
//!
//! Time is the `now` the relay passes in, like everywhere else, so tests move it.

use std::time::Duration;

use sqlx::sqlite::SqliteConnection;
use sqlx::{Row, SqlitePool};

use crate::sql::{Queries, stmt};
use crate::timestamp::duration_micros;
use crate::writer::WriteConnection;

/// A holder renews its lease in the database at most this often (or every quarter of the
/// lease's lifetime, if that is shorter).
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(1);

/// Whether this source may claim events now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseState {
    /// This source holds the lease.
    Held,
    /// Another relay holds it until `expires_at` (Unix microseconds).
    Standby {
        /// The other holder.
        holder: String,
        /// When its lease expires unless renewed.
        expires_at: i64,
    },
}

/// One source's side of the lease.
#[derive(Debug)]
pub(crate) struct Lease {
    holder: String,
    ttl: i64,
    renew_every: i64,
    /// Our expiry and when we last wrote it, while we believe we hold the lease.
    held: Option<(i64, i64)>,
    /// Until when (monotonic clock) the lease is surely still ours: measured from before the
    /// statement that took or renewed it, so a paused process sees the time that passed.
    valid_until: Option<tokio::time::Instant>,
    ttl_duration: Duration,
    /// The last state, to log transitions once rather than on every poll.
    last: Option<LeaseState>,
}

impl Lease {
    pub(crate) fn new(holder: String, ttl: Duration) -> Self {
        let ttl_duration = ttl;
        let ttl = duration_micros(ttl).max(1);
        Self {
            holder,
            ttl,
            renew_every: duration_micros(RENEW_EVERY).min(ttl / 4),
            held: None,
            valid_until: None,
            ttl_duration,
            last: None,
        }
    }

    /// See the field: `None` when the lease is not held.
    pub(crate) fn valid_until(&self) -> Option<tokio::time::Instant> {
        self.held.and(self.valid_until)
    }

    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    pub(crate) fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// Takes or renews the lease if possible; says whether this source may claim at `now`.
    pub(crate) async fn ensure(
        &mut self,
        pool: &SqlitePool,
        writer: &mut WriteConnection,
        queries: &Queries,
        now: i64,
    ) -> Result<LeaseState, sqlx::Error> {
        let started = tokio::time::Instant::now();
        if let Some((until, renewed_at)) = self.held
            && now < until
            && (renewed_at..renewed_at.saturating_add(self.renew_every)).contains(&now)
        {
            // Renewed less than RENEW_EVERY ago and not expired: nobody else can have it.
            return Ok(LeaseState::Held);
        }
        if self.held.is_none()
            && let Some(row) = sqlx::query(stmt(&queries.lease_read))
                .fetch_optional(pool)
                .await?
        {
            let holder: String = row.try_get(0)?;
            let expires_at: i64 = row.try_get(2)?;
            if holder != self.holder && expires_at > now {
                return Ok(self.transition(LeaseState::Standby { holder, expires_at }));
            }
        }
        let conn = writer.begin().await?;
        let taken = Self::acquire(
            conn,
            queries,
            &self.holder,
            now,
            now.saturating_add(self.ttl),
        )
        .await;
        let state = match taken {
            Ok(state) => {
                writer.commit().await?;
                state
            }
            Err(e) => {
                writer.rollback().await;
                return Err(e);
            }
        };
        self.valid_until = Some(started + self.ttl_duration);
        self.held = match state {
            LeaseState::Held => Some((now.saturating_add(self.ttl), now)),
            LeaseState::Standby { .. } => None,
        };
        Ok(self.transition(state))
    }

    /// The conditional upsert, in the caller's write transaction; on failure reports who
    /// holds the lease instead.
    async fn acquire(
        conn: &mut SqliteConnection,
        queries: &Queries,
        holder: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<LeaseState, sqlx::Error> {
        let changed = sqlx::query(stmt(&queries.lease_acquire))
            .bind(holder)
            .bind(now)
            .bind(expires_at)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if changed == 1 {
            return Ok(LeaseState::Held);
        }
        let row = sqlx::query(stmt(&queries.lease_read))
            .fetch_one(&mut *conn)
            .await?;
        Ok(LeaseState::Standby {
            holder: row.try_get(0)?,
            expires_at: row.try_get(2)?,
        })
    }

    /// Renews the lease inside the caller's (settle) transaction. Returns false when another
    /// relay has taken it over.
    pub(crate) async fn renew_in(
        &self,
        conn: &mut SqliteConnection,
        queries: &Queries,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let changed = sqlx::query(stmt(&queries.lease_renew))
            .bind(&self.holder)
            .bind(now.saturating_add(self.ttl))
            .execute(conn)
            .await?
            .rows_affected();
        Ok(changed == 1)
    }

    /// Records the outcome of [`Self::renew_in`] once its transaction committed.
    /// `started`: when the renewing transaction began (monotonic).
    pub(crate) fn renewed(&mut self, still_held: bool, now: i64, started: tokio::time::Instant) {
        if still_held {
            self.held = Some((now.saturating_add(self.ttl), now));
            self.valid_until = Some(started + self.ttl_duration);
        } else {
            self.held = None;
            tracing::warn!(
                holder = %self.holder,
                "the relay lease was taken over by another relay while this one was publishing; \
                 recorded its deliveries only, the new holder retries the rest"
            );
            self.last = None;
        }
    }

    /// Gives the lease up so that a standby takes over at once.
    pub(crate) async fn release(
        &mut self,
        pool: &SqlitePool,
        queries: &Queries,
    ) -> Result<(), sqlx::Error> {
        self.held = None;
        self.last = None;
        sqlx::query(stmt(&queries.lease_release))
            .bind(&self.holder)
            .execute(pool)
            .await?;
        Ok(())
    }

    fn transition(&mut self, state: LeaseState) -> LeaseState {
        if self.last.as_ref() != Some(&state) {
            match &state {
                LeaseState::Held if !matches!(self.last, Some(LeaseState::Held)) => {
                    tracing::info!(holder = %self.holder, "took the relay lease; this relay publishes");
                }
                LeaseState::Held => {}
                LeaseState::Standby { holder, .. } if !matches!(&self.last, Some(LeaseState::Standby { holder: h, .. }) if h == holder) =>
                {
                    tracing::info!(
                        holder = %holder,
                        "another relay holds the lease on this outbox; standing by until it stops or its lease expires"
                    );
                }
                LeaseState::Standby { .. } => {}
            }
            self.last = Some(state.clone());
        }
        state
    }
}

/// Longest wait for the write lock when releasing a lease on drop.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// Releases `holder`'s lease (`release`: a rendered `outbox_lease_release.sql`) from a drop:
/// on a short-lived thread of its own with its own connection (`options`, busy handler set
/// to a second), so that it works wherever the owner is dropped: in a task, at the end of
/// `main`, or while the Tokio runtime shuts down. Waits for it at most about two seconds; if
/// it fails, the lease simply expires.
pub(crate) fn release_on_drop(
    options: &sqlx::sqlite::SqliteConnectOptions,
    release: std::sync::Arc<str>,
    holder: String,
) {
    use sqlx::{ConnectOptions as _, Connection as _};
    let options = options.clone().busy_timeout(RELEASE_WAIT);
    let (done, finished) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("outbox-lease-release".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
                .and_then(|rt| {
                    rt.block_on(async {
                        let mut conn = options.connect().await?;
                        sqlx::query(stmt(&release))
                            .bind(holder)
                            .execute(&mut conn)
                            .await?;
                        conn.close().await
                    })
                    .map_err(|e| e.to_string())
                });
            let _ = done.send(result);
        });
    if spawned.is_err() {
        return;
    }
    match finished.recv_timeout(RELEASE_WAIT * 2) {
        Ok(Ok(())) => tracing::debug!("released the relay lease"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not release the relay lease; it will expire");
        }
        Err(_) => tracing::warn!("releasing the relay lease timed out; it will expire"),
    }
}
