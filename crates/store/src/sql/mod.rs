//! The one SQL layer of the SQLite and PostgreSQL backends: each statement written once
//! ([`Stmt`]) and rendered per [`Dialect`], one transaction view ([`SqlTxn`]) over a small
//! connection trait ([`SqlConn`]) that each backend implements, the checksum column an optional
//! codec of the view, and the two layouts (`schema_sqlite.sql`, `schema_postgres.sql`).

mod columns;
mod txn;

#[cfg(feature = "sqlite")]
pub(crate) use columns::row_checksum;
pub(crate) use columns::{LeaseColumns, RecordColumns};
pub(crate) use txn::SqlTxn;

use crate::Result;

/// What differs between the two SQL dialects the store speaks.
#[derive(Debug)]
pub(crate) struct Dialect {
    /// What a numbered placeholder starts with: `?` (`?1`) or `$` (`$1`).
    pub(crate) placeholder: char,
    /// The checksum codec: every row's last column is a CRC-32 of its fields (`checksum.rs`),
    /// written with the row and verified whenever it is read. SQLite keeps no checksum of what
    /// a page holds; PostgreSQL checks its own pages and has no such column.
    pub(crate) checksums: bool,
    /// What orders session ids byte by byte, as every backend lists them (`{C}`).
    pub(crate) collate: &'static str,
    /// Writes a commit's rows in one statement of arrays ([`Stmt::PutRowArrays`]) instead of
    /// one [`Stmt::PutRow`] each: a round trip saved per row on a server.
    pub(crate) row_arrays: bool,
}

/// SQLite (rusqlite): checksummed rows, one statement per row (no round trips to save).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) const SQLITE: Dialect = Dialect {
    placeholder: '?',
    checksums: true,
    collate: "",
    row_arrays: false,
};

/// PostgreSQL (the `postgres` crate).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const POSTGRES: Dialect = Dialect {
    placeholder: '$',
    checksums: false,
    collate: " COLLATE \"C\"",
    row_arrays: true,
};

/// Every statement of [`SqlTxn`], written once as a template: `$N` a placeholder, `{p}` the
/// tables' prefix (PostgreSQL's schema), `{record}` and `{lease}` the columns of
/// [`RecordColumns`] and [`LeaseColumns`], `{C}` the dialect's byte-order collation, and
/// `[[...]]` what only the checksum codec writes or reads (its column, always the last).
macro_rules! statements {
    ($($(#[$doc:meta])* $name:ident: $text:expr,)*) => {
        /// A statement of [`SqlTxn`]; [`render`] gives its text in a dialect.
        #[derive(Debug, Clone, Copy)]
        pub(crate) enum Stmt { $($(#[$doc])* $name),* }
        const TEMPLATES: &[&str] = &[$($text),*];
    };
}

statements!(
    Load: "SELECT {record}[[, checksum]] FROM {p}sessions WHERE session_id = $1",
    ListAll: "SELECT {record}[[, checksum]] FROM {p}sessions ORDER BY session_id{C} LIMIT $1",
    ListAfter: "SELECT {record}[[, checksum]] FROM {p}sessions WHERE session_id{C} > $1 \
        ORDER BY session_id{C} LIMIT $2",
    Rows: "SELECT seq, body[[, checksum]] FROM {p}transcript_rows \
        WHERE session_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq",
    HasRows: "SELECT 1 FROM {p}transcript_rows WHERE session_id = $1 LIMIT 1",
    RowBytes: "SELECT coalesce(sum(octet_length(body)), 0) FROM {p}transcript_rows \
        WHERE session_id = $1",
    /// The sessions of the first and last row, each with whether its record exists.
    RowEnds: "SELECT e.session_id, EXISTS (SELECT 1 FROM {p}sessions s \
        WHERE s.session_id = e.session_id) FROM \
        (SELECT session_id FROM (SELECT session_id FROM {p}transcript_rows \
        ORDER BY session_id LIMIT 1) f UNION ALL \
        SELECT session_id FROM (SELECT session_id FROM {p}transcript_rows \
        ORDER BY session_id DESC LIMIT 1) l) e",
    StaleLeases: "SELECT session_id FROM {p}leases l WHERE session_id > $1 \
        AND expires_at_ms < $2 \
        AND NOT EXISTS (SELECT 1 FROM {p}sessions s WHERE s.session_id = l.session_id) \
        ORDER BY session_id LIMIT $3",
    ThreadOwner: "SELECT session_id[[, checksum]] FROM {p}threads WHERE thread_id = $1",
    SessionThreads: "SELECT thread_id[[, checksum]] FROM {p}threads WHERE session_id = $1",
    Chunks: "SELECT seq, bytes[[, checksum]] FROM {p}mirror_chunks WHERE session_id = $1 \
        AND thread_id = $2 AND path = $3 AND seq >= $4 AND seq < $5 ORDER BY seq",
    Put: "INSERT INTO {p}sessions ({record}[[, checksum]]) \
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8[[, $9]]) \
        ON CONFLICT (session_id) DO UPDATE SET model_config = excluded.model_config, \
        state = excluded.state, row_count = excluded.row_count, \
        retired_threads = excluded.retired_threads, \
        created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
        mirror = excluded.mirror[[, checksum = excluded.checksum]]",
    /// A plain INSERT, for rows and chunks: they are append-only, and a duplicate key means
    /// the record's count is wrong, which must fail loudly rather than overwrite.
    PutRow: "INSERT INTO {p}transcript_rows (session_id, seq, body[[, checksum]]) \
        VALUES ($1, $2, $3[[, $4]])",
    /// [`Stmt::PutRow`] for a whole commit (PostgreSQL only: [`Dialect::row_arrays`]).
    PutRowArrays: "INSERT INTO {p}transcript_rows (session_id, seq, body) \
        SELECT $1, s, b FROM unnest($2::int8[], $3::text[]) AS t(s, b)",
    /// Never takes a thread over: PostgreSQL's writers of different sessions run at once, so
    /// another session may have claimed it since this transaction looked. The conflicting
    /// insert waits for that claim's commit and returns the owner it leaves (the caller
    /// refuses another session's). SQLite's one writer never gets there.
    PutThread: "INSERT INTO {p}threads AS t (thread_id, session_id[[, checksum]]) \
        VALUES ($1, $2[[, $3]]) ON CONFLICT (thread_id) DO UPDATE SET session_id = t.session_id \
        RETURNING session_id",
    PutChunk: "INSERT INTO {p}mirror_chunks (session_id, thread_id, path, seq, bytes\
        [[, checksum]]) VALUES ($1, $2, $3, $4, $5[[, $6]])",
    RemoveChunks: "DELETE FROM {p}mirror_chunks WHERE session_id = $1 AND thread_id = $2 \
        AND path = $3 AND seq >= $4",
    RemoveRows: "DELETE FROM {p}transcript_rows WHERE session_id = $1",
    RemoveThreads: "DELETE FROM {p}threads WHERE session_id = $1",
    RemoveSessionChunks: "DELETE FROM {p}mirror_chunks WHERE session_id = $1",
    Remove: "DELETE FROM {p}sessions WHERE session_id = $1",
    LoadLease: "SELECT {lease}[[, checksum]] FROM {p}leases WHERE session_id = $1",
    PutLease: "INSERT INTO {p}leases ({lease}[[, checksum]]) \
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11[[, $12]]) \
        ON CONFLICT (session_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
        started_at_ms = excluded.started_at_ms, instance = excluded.instance, \
        acquired_at_ms = excluded.acquired_at_ms, expires_at_ms = excluded.expires_at_ms, \
        fence = excluded.fence, process_space = excluded.process_space, \
        process_start = excluded.process_start, state = excluded.state\
        [[, checksum = excluded.checksum]]",
    RemoveLease: "DELETE FROM {p}leases WHERE session_id = $1",
    /// The key check of a sealed store (`seal.rs`); no row in one never sealed.
    SealCheck: "SELECT value FROM {p}rethread_meta WHERE key = 'seal_check'",
    PutSealCheck: "INSERT INTO {p}rethread_meta (key, value) VALUES ('seal_check', $1)",
);

/// The texts of every [`Stmt`] in `dialect`, its tables after `prefix`, in [`Stmt`]'s order.
pub(crate) fn render(dialect: &Dialect, prefix: &str) -> Vec<String> {
    TEMPLATES
        .iter()
        .map(|t| render_one(t, dialect, prefix))
        .collect()
}

/// One template (a statement or a layout) in `dialect`, its tables after `prefix`.
pub(crate) fn render_one(template: &str, dialect: &Dialect, prefix: &str) -> String {
    let text = template
        .replace("{record}", RecordColumns::ALL)
        .replace("{lease}", LeaseColumns::ALL)
        .replace("{C}", dialect.collate)
        .replace("{p}", prefix)
        .replace('$', &dialect.placeholder.to_string());
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some((before, optional)) = rest.split_once("[[") {
        let (optional, after) = optional.split_once("]]").unwrap_or((optional, ""));
        out.push_str(before);
        if dialect.checksums {
            out.push_str(optional);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// A value bound to a placeholder.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum Param<'a> {
    Int(i64),
    OptInt(Option<i64>),
    Text(&'a str),
    OptText(Option<&'a str>),
    Bytes(&'a [u8]),
    /// An array (PostgreSQL only: [`Dialect::row_arrays`]).
    Ints(&'a [i64]),
    /// An array (PostgreSQL only: [`Dialect::row_arrays`]).
    Texts(&'a [String]),
}

/// One row a statement selected, read by column index; text and bytes borrowed from the
/// driver's buffer. A value of another type than the column's is an error of the store.
pub(crate) trait SqlRow {
    fn int(&self, at: usize) -> Result<i64>;
    fn opt_int(&self, at: usize) -> Result<Option<i64>>;
    fn str(&self, at: usize) -> Result<&str>;
    fn opt_str(&self, at: usize) -> Result<Option<&str>>;
    fn bytes(&self, at: usize) -> Result<&[u8]>;
    fn flag(&self, at: usize) -> Result<bool>;
}

/// One live transaction of a backend's connection: what [`SqlTxn`] runs its statements on.
/// Synchronous: SQLite runs on the store's writer and reader threads, PostgreSQL (the blocking
/// `postgres` crate) on its pool's threads.
pub(crate) trait SqlConn {
    /// The dialect the connection speaks.
    const DIALECT: &'static Dialect;
    /// Runs `statement`; how many rows it changed.
    fn execute(&mut self, statement: Stmt, params: &[Param<'_>]) -> Result<u64>;
    /// Hands `each` the rows `statement` selects, in order, one at a time as the driver reads
    /// them (a long mirror is never all in memory).
    fn query(
        &mut self,
        statement: Stmt,
        params: &[Param<'_>],
        each: &mut dyn FnMut(&dyn SqlRow) -> Result<()>,
    ) -> Result<()>;
    /// The space still to give back ([`crate::logic::WriteTxn::reclaim`]); by default none.
    fn free_pages(&mut self) -> Result<u64> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_renders_its_placeholders_collation_and_checksum_column() {
        let sqlite = render(&SQLITE, "");
        let postgres = render(&POSTGRES, "\"s\".");
        let (list, chunk) = (Stmt::ListAfter as usize, Stmt::PutChunk as usize);
        assert!(sqlite[list].ends_with("WHERE session_id > ?1 ORDER BY session_id LIMIT ?2"));
        assert!(postgres[list].contains("FROM \"s\".sessions WHERE session_id COLLATE \"C\" > $1"));
        assert!(sqlite[chunk].ends_with("bytes, checksum) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
        assert!(postgres[chunk].ends_with("bytes) VALUES ($1, $2, $3, $4, $5)"));
        for text in sqlite.iter().chain(&postgres) {
            assert!(
                !text.contains(['{', '[']) || text.contains("::int8[]"),
                "{text}"
            );
        }
    }
}
