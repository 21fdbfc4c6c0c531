//! Seed 003's scenario, done so that no booking's SMS or payment is lost, sent for a booking
//! that was rolled back, or sent out of order for one customer:
//!
//! - [`router`]: `POST /bookings` inserts one row into `bookings`, and nothing else. The
//!   application has no outbox code at all.
//! - `outbox capture install` (the `[[capture]]` entry of `outbox.toml`) puts a trigger on
//!   `bookings` that writes a `booking.created` event into the outbox **in the inserting
//!   transaction**, keyed by customer.
//! - Two `[[subscription]]`s of `outbox.toml`, `sms` and `payments`, each with its own
//!   progress, retries and dead letters, post every event to the SMS provider's and the
//!   payment processor's webhooks, in booking order per customer, from as many `outbox relay`
//!   processes as you run.
//!
//! `examples/bookings/README.md` runs it by hand; `crates/outbox-cli/tests/bookings.rs` runs it
//! under `kill -9` chaos.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// The business table: plain, with nothing about events in it.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bookings (
    id           bigserial   PRIMARY KEY,
    customer_id  text        NOT NULL,
    starts_at    timestamptz NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    created_at   timestamptz NOT NULL DEFAULT now()
)";

/// The example's relay configuration (`examples/bookings/outbox.toml`), for localhost.
pub const OUTBOX_TOML: &str = include_str!("../outbox.toml");

/// Creates the `bookings` table if it is missing.
pub async fn create_schema(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query(SCHEMA).execute(pool).await.map(drop)
}

/// A booking request.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NewBooking {
    /// Who books: the events of one customer are delivered in booking order.
    pub customer_id: String,
    /// When the appointment starts (RFC 3339).
    pub starts_at: String,
    /// What it costs, in cents.
    pub amount_cents: i64,
}

/// A stored booking.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Booking {
    /// The row's id.
    pub id: i64,
    /// Who booked.
    pub customer_id: String,
}

/// `POST /bookings` and `GET /healthz` over `pool`.
pub fn router(pool: PgPool) -> Router {
    Router::new()
        .route("/bookings", post(book))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(pool)
}

async fn book(
    State(pool): State<PgPool>,
    Json(booking): Json<NewBooking>,
) -> Result<(StatusCode, Json<Booking>), (StatusCode, String)> {
    if booking.customer_id.trim().is_empty() {
        return Err((StatusCode::BAD_REQUEST, "customer_id: empty\n".into()));
    }
    // One statement in its own transaction: the capture trigger writes the event in it.
    let row: Result<(i64,), sqlx::Error> = sqlx::query_as(
        "INSERT INTO bookings (customer_id, starts_at, amount_cents) VALUES ($1, $2::timestamptz, $3) RETURNING id",
    )
    .bind(&booking.customer_id)
    .bind(&booking.starts_at)
    .bind(booking.amount_cents)
    .fetch_one(&pool)
    .await;
    match row {
        Ok((id,)) => Ok((
            StatusCode::CREATED,
            Json(Booking {
                id,
                customer_id: booking.customer_id,
            }),
        )),
        Err(sqlx::Error::Database(e))
            if e.code()
                .is_some_and(|c| c.starts_with("22") || c.starts_with("23")) =>
        {
            // Bad input (an unparsable time, a negative amount): say what, store nothing.
            Err((StatusCode::BAD_REQUEST, format!("{}\n", e.message())))
        }
        Err(e) => {
            tracing::warn!(error = %e, "booking failed");
            Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable; try again\n".into(),
            ))
        }
    }
}
