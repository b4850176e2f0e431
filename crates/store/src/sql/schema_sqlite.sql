-- The SQLite layout (schema 1). Every row carries a CRC-32 of its fields (the checksum
-- codec, `checksum.rs`). A free lease keeps its row so that `fence` keeps growing; expiry is
-- judged by the clock of the machine the processes share. `threads` says which session each
-- thread belongs to. `mirror_chunks` holds the mirrored rollout files (their state is the
-- session's `mirror` column); a rowid table, as SQLite advises for rows of kilobytes.
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    model_config TEXT NOT NULL,
    state TEXT NOT NULL,
    row_count INTEGER NOT NULL,
    retired_threads TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    mirror TEXT NOT NULL,
    checksum INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE transcript_rows (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    checksum INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE leases (
    session_id TEXT PRIMARY KEY NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    fence INTEGER NOT NULL,
    process_space TEXT,
    process_start INTEGER,
    state INTEGER NOT NULL,
    checksum INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE threads (
    thread_id TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL,
    checksum INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX threads_by_session ON threads (session_id);
CREATE TABLE mirror_chunks (
    session_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    path TEXT NOT NULL,
    seq INTEGER NOT NULL,
    bytes BLOB NOT NULL,
    checksum INTEGER NOT NULL,
    PRIMARY KEY (session_id, thread_id, path, seq)
);
