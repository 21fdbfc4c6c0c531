//! Events as array parameters: the seven columns a multi-row insert of events binds as one
//! array each (`unnest($1::uuid[], $2::text[], ...)`), gathered and bound in one place.

use std::collections::BTreeMap;

use outbox_core::Event;
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

/// The columns of some events, one array each, in the order [`EventArrays::bind`] binds them:
/// id, aggregate type, aggregate id, event type, payload, headers (a JSON object of strings),
/// creation time.
pub(crate) struct EventArrays<'a> {
    ids: Vec<Uuid>,
    aggregate_types: Vec<&'a str>,
    aggregate_ids: Vec<&'a str>,
    event_types: Vec<&'a str>,
    payloads: Vec<&'a [u8]>,
    headers: Vec<Json<BTreeMap<&'a str, &'a str>>>,
    created: Vec<OffsetDateTime>,
}

impl<'a> EventArrays<'a> {
    /// The columns of `events`, in their order; of each event's headers only those whose
    /// name `keep` accepts.
    pub(crate) fn new(
        events: impl IntoIterator<Item = &'a Event>,
        keep: impl Fn(&str) -> bool,
    ) -> Self {
        let mut arrays = Self {
            ids: Vec::new(),
            aggregate_types: Vec::new(),
            aggregate_ids: Vec::new(),
            event_types: Vec::new(),
            payloads: Vec::new(),
            headers: Vec::new(),
            created: Vec::new(),
        };
        for e in events {
            arrays.ids.push(e.id);
            arrays.aggregate_types.push(e.aggregate_type.as_str());
            arrays.aggregate_ids.push(e.aggregate_id.as_str());
            arrays.event_types.push(e.event_type.as_str());
            arrays.payloads.push(&e.payload[..]);
            arrays.headers.push(Json(
                e.headers
                    .iter()
                    .filter(|(k, _)| keep(k))
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
            ));
            arrays.created.push(e.created_at);
        }
        arrays
    }

    /// Binds the seven arrays, in column order, as the next parameters of `query`.
    pub(crate) fn bind<'q>(
        &'q self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.aggregate_types)
            .bind(&self.aggregate_ids)
            .bind(&self.event_types)
            .bind(&self.payloads)
            .bind(&self.headers)
            .bind(&self.created)
    }
}
