//! The SQL text of the PostgreSQL backend, qualified with the store's schema.

/// The statements, qualified with the store's schema.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) schema: Option<String>,
    pub(super) lock: String,
    pub(super) load: String,
    pub(super) row_ends: String,
    pub(super) list_all: String,
    pub(super) list_after: String,
    pub(super) rows: String,
    pub(super) put: String,
    pub(super) put_rows: String,
    pub(super) remove_rows: String,
    pub(super) remove: String,
    pub(super) load_lease: String,
    pub(super) put_lease: String,
}

pub(super) const RECORD_COLUMNS: &str =
    "session_id, model_config, binding_thread_id, binding_codex_home, \
     bound_at_ms, row_count, retired_threads, created_at_ms, updated_at_ms";

impl Sql {
    pub(super) fn new(schema: Option<String>) -> Sql {
        let p = match &schema {
            Some(s) => format!("{}.", quote_ident(s)),
            None => String::new(),
        };
        Sql {
            // One round trip: the session's lock, the server's clock, and this transaction's
            // `synchronous_commit` ($2: `on` for `Durable`, whatever the server's default,
            // `off` for `Relaxed`).
            lock: "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text IS NULL, \
                   (extract(epoch FROM clock_timestamp()) * 1000)::int8, \
                   set_config('synchronous_commit', $2, true)"
                .to_string(),
            // One row whatever is stored: the record's columns (NULL when absent), then
            // whether rows of the session exist (one statement: one snapshot).
            load: format!(
                "SELECT {cols}, EXISTS (SELECT 1 FROM {p}transcript_rows r \
                 WHERE r.session_id = k.id) \
                 FROM (SELECT $1::text AS id) k LEFT JOIN {p}sessions s ON s.session_id = k.id",
                cols = RECORD_COLUMNS
                    .split(", ")
                    .map(|c| format!("s.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            // The sessions of the first and last row, each with whether its record exists.
            row_ends: format!(
                "SELECT e.session_id, EXISTS (SELECT 1 FROM {p}sessions s \
                 WHERE s.session_id = e.session_id) FROM \
                 ((SELECT session_id FROM {p}transcript_rows ORDER BY session_id LIMIT 1) \
                 UNION ALL \
                 (SELECT session_id FROM {p}transcript_rows ORDER BY session_id DESC LIMIT 1)) e"
            ),
            list_all: format!(
                "SELECT {RECORD_COLUMNS} FROM {p}sessions ORDER BY session_id COLLATE \"C\" LIMIT $1"
            ),
            list_after: format!(
                "SELECT {RECORD_COLUMNS} FROM {p}sessions WHERE session_id COLLATE \"C\" > $1 \
                 ORDER BY session_id COLLATE \"C\" LIMIT $2"
            ),
            rows: format!(
                "SELECT seq, body FROM {p}transcript_rows \
                 WHERE session_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq"
            ),
            put: format!(
                "INSERT INTO {p}sessions ({RECORD_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (session_id) DO UPDATE SET model_config = excluded.model_config, \
                 binding_thread_id = excluded.binding_thread_id, \
                 binding_codex_home = excluded.binding_codex_home, \
                 bound_at_ms = excluded.bound_at_ms, row_count = excluded.row_count, \
                 retired_threads = excluded.retired_threads, \
                 created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms"
            ),
            // A plain INSERT: rows are append-only; a duplicate key fails loudly.
            put_rows: format!(
                "INSERT INTO {p}transcript_rows (session_id, seq, body) \
                 SELECT $1, s, b FROM unnest($2::int8[], $3::text[]) AS t(s, b)"
            ),
            remove_rows: format!("DELETE FROM {p}transcript_rows WHERE session_id = $1"),
            remove: format!("DELETE FROM {p}sessions WHERE session_id = $1"),
            load_lease: format!(
                "SELECT host, pid, started_at_ms, instance, acquired_at_ms, expires_at_ms, fence, \
                 process_space, process_start FROM {p}leases WHERE session_id = $1"
            ),
            put_lease: format!(
                "INSERT INTO {p}leases (session_id, host, pid, started_at_ms, instance, \
                 acquired_at_ms, expires_at_ms, fence, process_space, process_start) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (session_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
                 started_at_ms = excluded.started_at_ms, instance = excluded.instance, \
                 acquired_at_ms = excluded.acquired_at_ms, expires_at_ms = excluded.expires_at_ms, \
                 fence = excluded.fence, process_space = excluded.process_space, \
                 process_start = excluded.process_start"
            ),
            schema,
        }
    }

    pub(super) fn prefix(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.", quote_ident(s)),
            None => String::new(),
        }
    }

    /// The advisory lock key of a session: distinct per schema, so stores in different
    /// schemas of one database do not wait for each other.
    pub(super) fn lock_key(&self, session_id: &str) -> String {
        format!("{}/{session_id}", self.schema.as_deref().unwrap_or(""))
    }
}

pub(super) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Schema 1 (the PostgreSQL backend starts with leases).
pub(super) fn schema_v1(p: &str) -> String {
    format!(
        "CREATE TABLE {p}sessions (
            session_id TEXT PRIMARY KEY NOT NULL,
            model_config TEXT NOT NULL,
            binding_thread_id TEXT,
            binding_codex_home TEXT,
            bound_at_ms BIGINT,
            row_count BIGINT NOT NULL,
            retired_threads TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            updated_at_ms BIGINT NOT NULL
        );
        CREATE TABLE {p}transcript_rows (
            session_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
        CREATE TABLE {p}leases (
            session_id TEXT PRIMARY KEY NOT NULL,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            started_at_ms BIGINT NOT NULL,
            instance BIGINT NOT NULL,
            acquired_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL,
            fence BIGINT NOT NULL
        );"
    )
}
