//! Forwarding impls of the backend's ability traits: each database module keeps its logic in
//! inherent `async fn`s, and one macro call writes the object-safe trait impl that boxes
//! them, so the traits' signatures are written once, here.
//!
//! - [`forward_dead_letter_store!`](crate::forward_dead_letter_store) writes
//!   [`DeadLetterStore`](super::DeadLetterStore);
//! - [`forward_replay!`](crate::forward_replay) writes [`Replay`](super::Replay);
//! - [`forward_retention!`](crate::forward_retention) writes [`Retention`](super::Retention)
//!   for the batched-delete shape (a preview of rows and the oldest, a run of batches);
//! - [`forward_explain!`](crate::forward_explain) writes [`Explain`](super::Explain);
//! - [`forward_producer!`](crate::forward_producer) writes [`Producer`](super::Producer),
//!   and [`pool_producer!`](crate::pool_producer) `Producer` and [`Forward`](super::Forward)
//!   for a producer library on a pool;
//! - [`backend_abilities!`](crate::backend_abilities) writes the [`Backend`](super::Backend)
//!   methods that hand those abilities out, and
//!   [`backend_commands!`](crate::backend_commands) those every backend has (migrate, relay,
//!   pending, status, doctor);
//! - [`forward_source!`](crate::forward_source) writes a [`Source`](crate::Source) whose
//!   fetch and settle are inherent methods (a claim and its record).
//!
//! Every forwarded error goes through `Into<SourceError>`, so an inherent method may return
//! its own error type where the crate converts it (`impl From<E> for SourceError`).

/// Implements [`DeadLetterStore`](crate::backend::DeadLetterStore) for a type with inherent
/// `async fn`s `list(event_type, aggregate_id, limit)`, `retry(selection)` and
/// `purge(before, event_type)` of the trait's signatures, and `show(id, now)`, which the
/// trait's `show(id)` calls at `OffsetDateTime::now_utc()`. `forward_dead_letter_store!(T,
/// show = show_at)` names another method for `show`.
#[macro_export]
macro_rules! forward_dead_letter_store {
    ($ty:ty) => {
        $crate::forward_dead_letter_store!($ty, show = show);
    };
    ($ty:ty, show = $show:ident) => {
        impl $crate::backend::DeadLetterStore for $ty {
            fn list<'a>(
                &'a self,
                event_type: Option<&'a str>,
                aggregate_id: Option<&'a str>,
                limit: i64,
            ) -> $crate::sink::BoxFuture<
                'a,
                Result<Vec<$crate::admin::DeadLetter>, $crate::SourceError>,
            > {
                Box::pin(async move {
                    <$ty>::list(self, event_type, aggregate_id, limit)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
            fn show(
                &self,
                id: $crate::backend::__forward::Uuid,
            ) -> $crate::sink::BoxFuture<
                '_,
                Result<Option<$crate::admin::StoredEventDetail>, $crate::SourceError>,
            > {
                Box::pin(async move {
                    let now = $crate::backend::__forward::OffsetDateTime::now_utc();
                    <$ty>::$show(self, id, now)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
            fn retry<'a>(
                &'a self,
                selection: &'a $crate::admin::RetrySelection,
            ) -> $crate::sink::BoxFuture<
                'a,
                Result<Vec<$crate::backend::__forward::Uuid>, $crate::SourceError>,
            > {
                Box::pin(async move {
                    <$ty>::retry(self, selection)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
            fn purge<'a>(
                &'a self,
                before: $crate::backend::__forward::OffsetDateTime,
                event_type: Option<&'a str>,
            ) -> $crate::sink::BoxFuture<
                'a,
                Result<Vec<$crate::backend::__forward::Uuid>, $crate::SourceError>,
            > {
                Box::pin(async move {
                    <$ty>::purge(self, before, event_type)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
        }
    };
}

/// Implements [`Replay`](crate::backend::Replay) for a type with inherent `async fn`s of the
/// trait's signatures, named after `plan`, `ids` and `replay_batch`:
/// `forward_replay!(T, plan = replay_plan, ids = replay_ids, replay_batch = put_back)`.
#[macro_export]
macro_rules! forward_replay {
    ($ty:ty, plan = $plan:ident, ids = $ids:ident, replay_batch = $batch:ident) => {
        impl $crate::backend::Replay for $ty {
            fn plan<'a>(
                &'a self,
                selection: &'a $crate::admin::ReplaySelection,
                preview: usize,
            ) -> $crate::sink::BoxFuture<'a, Result<$crate::admin::ReplayPlan, $crate::SourceError>>
            {
                Box::pin(async move {
                    <$ty>::$plan(self, selection, preview)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
            fn ids<'a>(
                &'a self,
                selection: &'a $crate::admin::ReplaySelection,
            ) -> $crate::sink::BoxFuture<
                'a,
                Result<Vec<$crate::backend::__forward::Uuid>, $crate::SourceError>,
            > {
                Box::pin(async move {
                    <$ty>::$ids(self, selection)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
            fn replay_batch<'a>(
                &'a self,
                ids: &'a [$crate::backend::__forward::Uuid],
            ) -> $crate::sink::BoxFuture<'a, Result<u64, $crate::SourceError>> {
                Box::pin(async move {
                    <$ty>::$batch(self, ids)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
        }
    };
}

/// Implements [`Retention`](crate::backend::Retention) for a type that deletes delivered
/// rows in batches, with inherent `async fn preview(now, keep) -> Result<(rows, oldest), E>`
/// and `async fn run(now, keep, batch, pause, progress) -> Result<RetentionReport, E>`
/// (`progress: &mut (dyn FnMut(u64) -> ControlFlow<()> + Send)`), where `SourceError:
/// From<E>`. `forward_retention!(T, preview = retention_preview, run = retention_run)`
/// names other methods.
#[macro_export]
macro_rules! forward_retention {
    ($ty:ty) => {
        $crate::forward_retention!($ty, preview = preview, run = run);
    };
    ($ty:ty, preview = $preview:ident, run = $run:ident) => {
        impl $crate::backend::Retention for $ty {
            fn preview(
                &self,
                now: $crate::backend::__forward::OffsetDateTime,
                keep: $crate::backend::__forward::Duration,
            ) -> $crate::sink::BoxFuture<
                '_,
                Result<$crate::admin::RetentionPreview, $crate::SourceError>,
            > {
                Box::pin(async move {
                    let (rows, oldest) = <$ty>::$preview(self, now, keep)
                        .await
                        .map_err($crate::backend::__forward::error)?;
                    Ok($crate::admin::RetentionPreview {
                        rows,
                        oldest,
                        ..Default::default()
                    })
                })
            }
            fn run<'a>(
                &'a self,
                now: $crate::backend::__forward::OffsetDateTime,
                settings: &'a $crate::admin::RetentionSettings,
                progress: &'a mut $crate::backend::RetentionProgress<'_>,
            ) -> $crate::sink::BoxFuture<
                'a,
                Result<$crate::admin::RetentionReport, $crate::SourceError>,
            > {
                Box::pin(async move {
                    let mut step = |n: u64| progress(n);
                    <$ty>::$run(
                        self,
                        now,
                        settings.keep,
                        settings.batch,
                        settings.pause,
                        &mut step,
                    )
                    .await
                    .map_err($crate::backend::__forward::error)
                })
            }
        }
    };
}

/// Implements [`Explain`](crate::backend::Explain) for a type with an inherent
/// `async fn $method(id, now) -> Result<Explanation, E>`: `forward_explain!(T, story)`.
#[macro_export]
macro_rules! forward_explain {
    ($ty:ty, $method:ident) => {
        impl $crate::backend::Explain for $ty {
            fn explain(
                &self,
                id: $crate::backend::__forward::Uuid,
                now: $crate::backend::__forward::OffsetDateTime,
            ) -> $crate::sink::BoxFuture<'_, Result<$crate::admin::Explanation, $crate::SourceError>>
            {
                Box::pin(async move {
                    <$ty>::$method(self, id, now)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
        }
    };
}

/// Implements [`Producer`](crate::backend::Producer) for a type with inherent
/// `async fn`s `(events: &[NewEvent]) -> Result<(), E>` for a backlog fill and for an
/// application's commit: `forward_producer!(T, fill = fill_batches, commit = write)`.
#[macro_export]
macro_rules! forward_producer {
    ($ty:ty, fill = $fill:ident, commit = $commit:ident) => {
        impl $crate::backend::Producer for $ty {
            fn fill<'a>(
                &'a self,
                events: &'a [$crate::NewEvent],
            ) -> $crate::sink::BoxFuture<'a, Result<(), $crate::SourceError>> {
                Box::pin(async move {
                    <$ty>::$fill(self, events)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
            fn commit<'a>(
                &'a self,
                events: &'a [$crate::NewEvent],
            ) -> $crate::sink::BoxFuture<'a, Result<(), $crate::SourceError>> {
                Box::pin(async move {
                    <$ty>::$commit(self, events)
                        .await
                        .map_err($crate::backend::__forward::error)
                })
            }
        }
    };
}

/// Writes, inside an `impl Backend for T` block, the [`Backend`](crate::backend::Backend)
/// methods that hand out an ability the backend keeps in a field (or is itself):
/// `backend_abilities!(dead_letters: dead, explain: self, producer: producer, forward:
/// producer)`. The abilities: `dead_letters`, `explain`, `replay`, `retention`, `forward`,
/// `catalog`, `capture`, `producer`, `delivery_ledger`; and two that read the backend's
/// `pool` and `config` fields: `backfill: B` makes the subscription's backfill with
/// `B::new(pool.clone(), &config, subscription)` (its `Err` message becomes the
/// [`Unsupported`](crate::Unsupported) hint), and `scratch: self` hands out the backend
/// itself when `config.table` names a scratch outbox ([`scratch_only`](crate::backend::scratch_only)).
#[macro_export]
macro_rules! backend_abilities {
    ($($ability:ident: $field:ident),* $(,)?) => {
        $($crate::backend_abilities!(@ability $ability $field);)*
    };
    (@ability dead_letters $f:ident) => {
        $crate::backend_abilities!(@one dead_letters $crate::backend::DeadLetterStore, $f);
    };
    (@ability explain $f:ident) => {
        $crate::backend_abilities!(@one explain $crate::backend::Explain, $f);
    };
    (@ability replay $f:ident) => {
        $crate::backend_abilities!(@one replay $crate::backend::Replay, $f);
    };
    (@ability retention $f:ident) => {
        $crate::backend_abilities!(@one retention $crate::backend::Retention, $f);
    };
    (@ability forward $f:ident) => {
        $crate::backend_abilities!(@one forward $crate::backend::Forward, $f);
    };
    (@ability catalog $f:ident) => {
        $crate::backend_abilities!(@one catalog $crate::catalog::SubscriptionCatalog, $f);
    };
    (@ability capture $f:ident) => {
        $crate::backend_abilities!(@one capture $crate::capture::Capture, $f);
    };
    (@ability producer $f:ident) => {
        $crate::backend_abilities!(@one producer $crate::backend::Producer, $f);
    };
    (@ability delivery_ledger $f:ident) => {
        $crate::backend_abilities!(@one delivery_ledger $crate::verify::DeliveryLedger, $f);
    };
    (@ability backfill $backfill:ident) => {
        fn backfill(
            &self,
            subscription: &str,
        ) -> Result<Box<dyn $crate::backfill::Backfill>, $crate::Unsupported> {
            $backfill::new(self.pool.clone(), &self.config, subscription)
                .map(|b| Box::new(b) as Box<dyn $crate::backfill::Backfill>)
                .map_err(|e| $crate::Unsupported::new(self.kind(), "backfill").with_hint(e))
        }
    };
    (@ability scratch self) => {
        fn scratch(&self) -> Result<&dyn $crate::backend::Scratch, $crate::Unsupported> {
            $crate::backend::scratch_only(self.kind(), &self.config.table, self)
        }
    };
    (@one $name:ident $ability:path, self) => {
        fn $name(&self) -> Result<&dyn $ability, $crate::Unsupported> {
            Ok(self)
        }
    };
    (@one $name:ident $ability:path, $f:ident) => {
        fn $name(&self) -> Result<&dyn $ability, $crate::Unsupported> {
            Ok(&self.$f)
        }
    };
}

/// Implements [`Source`](crate::Source) (without `wait_for_events`, which keeps its default)
/// for a type with inherent `async fn`s of the trait's `fetch` and `settle` signatures:
/// `forward_source!(T, fetch = claim, settle = record)`.
#[macro_export]
macro_rules! forward_source {
    ($ty:ty, fetch = $fetch:ident, settle = $settle:ident) => {
        impl $crate::Source for $ty {
            async fn fetch(
                &mut self,
                limit: usize,
                now: $crate::backend::__forward::OffsetDateTime,
            ) -> Result<$crate::source::Fetched, $crate::SourceError> {
                <$ty>::$fetch(self, limit, now).await
            }

            async fn settle(
                &mut self,
                settlements: &[$crate::source::Settlement],
                now: $crate::backend::__forward::OffsetDateTime,
            ) -> Result<(), $crate::SourceError> {
                <$ty>::$settle(self, settlements, now).await
            }
        }
    };
}

/// Writes, inside an `impl Backend for T` block, the [`Backend`](crate::backend::Backend)
/// commands that every backend has, forwarded to inherent `async fn`s of their signatures:
/// `backend_commands!()` forwards `migrate` to `migrate_lines`, `start_relay` to
/// `pipelines`, `pending` to `pending_events`, `status` to `status_report` and `doctor` to
/// `checks`; `backend_commands!(migrate = m, start_relay = p, pending = e, status = s,
/// doctor = c)` names others.
#[macro_export]
macro_rules! backend_commands {
    () => {
        $crate::backend_commands!(
            migrate = migrate_lines,
            start_relay = pipelines,
            pending = pending_events,
            status = status_report,
            doctor = checks,
        );
    };
    (
        migrate = $migrate:ident,
        start_relay = $start_relay:ident,
        pending = $pending:ident,
        status = $status:ident,
        doctor = $doctor:ident $(,)?
    ) => {
        fn migrate(&self) -> $crate::sink::BoxFuture<'_, Result<Vec<String>, $crate::SourceError>> {
            Box::pin(Self::$migrate(self))
        }
        fn start_relay<'a>(
            &'a self,
            relay: &'a $crate::RelayConfig,
        ) -> $crate::sink::BoxFuture<'a, Result<$crate::backend::Pipelines, $crate::SourceError>> {
            Box::pin(Self::$start_relay(self, relay))
        }
        fn pending(&self) -> $crate::sink::BoxFuture<'_, Result<Option<u64>, $crate::SourceError>> {
            Box::pin(Self::$pending(self))
        }
        fn status(
            &self,
            now: $crate::backend::__forward::OffsetDateTime,
            stuck_after: $crate::backend::__forward::Duration,
        ) -> $crate::sink::BoxFuture<'_, Result<$crate::admin::StatusReport, $crate::SourceError>> {
            Box::pin(Self::$status(self, now, stuck_after))
        }
        fn doctor(
            &self,
            thresholds: $crate::admin::DoctorThresholds,
        ) -> $crate::sink::BoxFuture<'_, Vec<$crate::admin::DoctorCheck>> {
            Box::pin(Self::$doctor(self, thresholds))
        }
    };
}

/// Implements [`Producer`](crate::backend::Producer) and [`Forward`](crate::backend::Forward)
/// for a backend's producer struct with two fields: `pool` (a connection pool whose
/// `begin()` opens a transaction) and `outbox` (the database's producer library, with
/// `enqueue_batch(executor, events)` and `copy_in(executor, events)` over `&pool` or a
/// transaction). A fill is one `enqueue_batch` on the pool; a commit is BEGIN, enqueue,
/// COMMIT; a copy is one `copy_in` on the pool. `$unavailable` turns a database error
/// (`&dyn Error`) into the retryable [`SourceError`](crate::SourceError).
#[macro_export]
macro_rules! pool_producer {
    ($ty:ty, $unavailable:path) => {
        impl $ty {
            /// A backlog fill: one `enqueue_batch` on the pool.
            async fn fill_on_pool(
                &self,
                events: &[$crate::NewEvent],
            ) -> Result<(), $crate::SourceError> {
                self.outbox
                    .enqueue_batch(&self.pool, events)
                    .await
                    .map(drop)
                    .map_err(|e| $unavailable(&e))
            }

            /// An application's write: BEGIN, enqueue, COMMIT.
            async fn commit_on_pool(
                &self,
                events: &[$crate::NewEvent],
            ) -> Result<(), $crate::SourceError> {
                let mut tx = self.pool.begin().await.map_err(|e| $unavailable(&e))?;
                self.outbox
                    .enqueue_batch(&mut *tx, events)
                    .await
                    .map_err(|e| $unavailable(&e))?;
                tx.commit().await.map_err(|e| $unavailable(&e))
            }
        }

        $crate::forward_producer!($ty, fill = fill_on_pool, commit = commit_on_pool);

        impl $crate::backend::Forward for $ty {
            fn copy_in<'a>(
                &'a self,
                events: &'a [$crate::Event],
            ) -> $crate::sink::BoxFuture<'a, Result<u64, $crate::SourceError>> {
                Box::pin(async move {
                    self.outbox
                        .copy_in(&self.pool, events)
                        .await
                        .map_err(|e| $unavailable(&e))
                })
            }
        }
    };
}
