//! Rows of the PostgreSQL tables to and from the crate's types.

use serde_json::{Map, Value};
use tokio_postgres::Row;

use crate::logic::check_record;
use crate::{Binding, Lease, LeaseOwner, ProcessIdentity, SessionRecord, StoreError};

pub(super) fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Backend {
        backend: "postgres",
        source: Box::new(e),
    })
}

pub(super) fn lease_from_row(label: &str, session_id: &str, r: &Row) -> Result<Lease, StoreError> {
    let process = ProcessIdentity::from_columns(r.get(7), r.get(8)).map_err(|what| {
        StoreError::corrupt(label, format!("lease of session {session_id}: {what}"))
    })?;
    Ok(Lease {
        session_id: session_id.to_string(),
        owner: LeaseOwner {
            host: r.get(0),
            pid: r.get::<_, i64>(1) as u32,
            started_at_ms: r.get(2),
            instance: r.get::<_, i64>(3) as u64,
            process,
        },
        acquired_at_ms: r.get(4),
        expires_at_ms: r.get(5),
        fence: r.get::<_, i64>(6) as u64,
    })
}

pub(super) fn decode_record(label: &str, row: &Row) -> Result<SessionRecord, StoreError> {
    let id: String = row.get(0);
    let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt {
        path: label.to_string(),
        detail: format!("{what} of {id} does not decode"),
        source: Some(Box::new(e)),
    };
    let model_config: Map<String, Value> =
        serde_json::from_str(row.get(1)).map_err(|e| corrupt("model_config", e))?;
    let retired_threads: Vec<String> =
        serde_json::from_str(row.get(6)).map_err(|e| corrupt("retired_threads", e))?;
    let binding = row.get::<_, Option<String>>(2).map(|thread_id| Binding {
        thread_id,
        codex_home: row.get(3),
        bound_at_ms: row.get::<_, Option<i64>>(4).unwrap_or(0),
    });
    let record = SessionRecord {
        session_id: id.clone(),
        model_config,
        binding,
        row_count: row.get::<_, i64>(5) as u64,
        retired_threads,
        created_at_ms: row.get(7),
        updated_at_ms: row.get(8),
    };
    check_record(&record).map_err(|d| StoreError::corrupt(label, format!("session {id}: {d}")))?;
    Ok(record)
}
