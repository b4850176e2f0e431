-- The PostgreSQL layout (schema 1), each table's name after `{p}` (the store's schema and a
-- dot, or nothing). `rethread_meta` tells a rethread store from other tables and holds its
-- schema version. No checksum column: the server checks its own pages.
CREATE TABLE {p}rethread_meta (key TEXT PRIMARY KEY NOT NULL, value BIGINT NOT NULL);
INSERT INTO {p}rethread_meta VALUES ('schema_version', {version});
CREATE TABLE {p}sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    model_config TEXT NOT NULL,
    state TEXT NOT NULL,
    row_count BIGINT NOT NULL,
    retired_threads TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    mirror TEXT NOT NULL
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
    fence BIGINT NOT NULL,
    process_space TEXT,
    process_start BIGINT,
    state BIGINT NOT NULL
);
CREATE TABLE {p}threads (
    thread_id TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL
);
CREATE INDEX ON {p}threads (session_id);
CREATE TABLE {p}mirror_chunks (
    session_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    path TEXT NOT NULL,
    seq BIGINT NOT NULL,
    bytes BYTEA NOT NULL,
    PRIMARY KEY (session_id, thread_id, path, seq)
);
-- Out of line, uncompressed: pglz would spend a commit's budget on every chunk and a
-- restore's on reading it back (`cargo xtask bench mirror`).
ALTER TABLE {p}mirror_chunks ALTER COLUMN bytes SET STORAGE EXTERNAL;
