//! Damage and edits made outside rethread: opening a store does not read its records (it takes
//! the same time whatever the store holds), so each kind of damage must be `Corrupt` when it
//! is first touched, never a changed, missing or empty session, and `verify` must report it.
//! Every test damages one session and reads another first: the open did not scan.
//!
//! Each kind of damage runs on both file backends: a changed value, a session whose key
//! changed, a missing row, a row past its session's count, a lost record; then SQLite's own
//! (a flipped byte in the file, a changed lease, a changed thread owner) and redb's (damage
//! that makes redb itself fail).

use std::path::{Path, PathBuf};

use redb::ReadableTable;
use rethread_store::{
    BindingStore, LocalOwner, OpenOptions, ProblemKind, StoreError, TurnCommit, VerifyReport,
};
use serde_json::json;

fn commit(session: &str, thread: &str, texts: &[&str]) -> TurnCommit {
    TurnCommit::new(
        session.to_string(),
        thread.to_string(),
        texts
            .iter()
            .map(|t| json!({"role": "user", "text": t}))
            .collect(),
    )
}

fn is_corrupt<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Corrupt { .. }))
}

async fn verify(store: &BindingStore) -> VerifyReport {
    let mut updates = 0;
    let report = store.verify(&mut |_| updates += 1).await.unwrap();
    assert!(updates > 0, "verify reports progress");
    report
}

/// The kinds of the problems found, with their sessions.
fn kinds(report: &VerifyReport) -> Vec<(ProblemKind, Option<&str>)> {
    report
        .problems
        .iter()
        .map(|p| (p.kind, p.session_id.as_deref()))
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Redb,
    Sqlite,
}

/// A file store of either backend, and edits made to its file by another program.
struct Fixture {
    backend: Backend,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

const SESSIONS: &str = "sessions";

impl Fixture {
    /// A closed store holding session `a` (3 rows, thread `thr_a`) and `b` (1 row).
    async fn new(backend: Backend) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(match backend {
            Backend::Redb => "s.redb",
            Backend::Sqlite => "s.db",
        });
        let fixture = Fixture {
            backend,
            path,
            _dir: dir,
        };
        let store = fixture.open().await.unwrap();
        store
            .commit_turn(commit("a", "thr_a", &["needle-0123456789", "two", "three"]))
            .await
            .unwrap();
        store
            .commit_turn(commit("b", "thr_b", &["hi"]))
            .await
            .unwrap();
        drop(store);
        fixture
    }

    async fn open(&self) -> Result<BindingStore, StoreError> {
        let options = OpenOptions::new();
        Ok(match self.backend {
            Backend::Redb => BindingStore::redb(&self.path, options).await?,
            Backend::Sqlite => BindingStore::sqlite(&self.path, options).await?,
        })
    }

    /// Opens the damaged store, and reads session `b` whole: the open did not scan the file.
    async fn open_damaged(&self) -> BindingStore {
        let store = self.open().await.expect("a damaged store still opens");
        let b = store.export_session("b").await.unwrap().unwrap();
        assert_eq!(b.rows.len(), 1);
        store
    }

    /// Changes the text of row `seq` of `session` (valid JSON either way).
    fn change_row(&self, session: &str, seq: u64) {
        match self.backend {
            Backend::Sqlite => sqlite_edit(
                &self.path,
                &format!(
                    r#"UPDATE transcript_rows SET body = '{{"role":"user","text":"forged"}}' WHERE session_id = '{session}' AND seq = {seq}"#
                ),
            ),
            Backend::Redb => redb_rows(&self.path, |rows| {
                let mut value = rows.get((session, seq)).unwrap().unwrap().value().to_vec();
                // The first letter of the first key changes case: still JSON, only the
                // checksum can tell.
                let at = value.iter().position(u8::is_ascii_alphabetic).unwrap();
                value[at] ^= 0x20;
                rows.insert((session, seq), value.as_slice()).unwrap();
            }),
        }
    }

    /// Moves `from`'s session record to the key `to`, as a flipped byte in a key would.
    fn rename_session(&self, from: &str, to: &str) {
        match self.backend {
            Backend::Sqlite => sqlite_edit(
                &self.path,
                &format!("UPDATE sessions SET session_id = '{to}' WHERE session_id = '{from}'"),
            ),
            Backend::Redb => redb_sessions(&self.path, |sessions| {
                let value = sessions.remove(from).unwrap().unwrap().value().to_vec();
                sessions.insert(to, value.as_slice()).unwrap();
            }),
        }
    }

    /// Removes `session`'s record, leaving its rows.
    fn lose_session(&self, session: &str) {
        match self.backend {
            Backend::Sqlite => sqlite_edit(
                &self.path,
                &format!("DELETE FROM sessions WHERE session_id = '{session}'"),
            ),
            Backend::Redb => redb_sessions(&self.path, |sessions| {
                sessions.remove(session).unwrap().unwrap();
            }),
        }
    }

    /// Removes row `seq` of `session`.
    fn remove_row(&self, session: &str, seq: u64) {
        match self.backend {
            Backend::Sqlite => sqlite_edit(
                &self.path,
                &format!(
                    "DELETE FROM transcript_rows WHERE session_id = '{session}' AND seq = {seq}"
                ),
            ),
            Backend::Redb => redb_rows(&self.path, |rows| {
                rows.remove((session, seq)).unwrap().unwrap();
            }),
        }
    }

    /// Copies row `from` of `session` (checksum included) to seq `to`.
    fn copy_row(&self, session: &str, from: u64, to: u64) {
        match self.backend {
            Backend::Sqlite => sqlite_edit(
                &self.path,
                &format!(
                    "INSERT INTO transcript_rows (session_id, seq, body, checksum) \
                     SELECT session_id, {to}, body, checksum FROM transcript_rows \
                     WHERE session_id = '{session}' AND seq = {from}"
                ),
            ),
            Backend::Redb => redb_rows(&self.path, |rows| {
                let value = rows.get((session, from)).unwrap().unwrap().value().to_vec();
                rows.insert((session, to), value.as_slice()).unwrap();
            }),
        }
    }
}

/// Runs SQL on the file from a connection of its own, as another program would.
fn sqlite_edit(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let changed = conn.execute(sql, []).unwrap();
    assert_eq!(changed, 1, "{sql}");
}

type RedbSessions<'t> = redb::Table<'t, &'static str, &'static [u8]>;
type RedbRows<'t> = redb::Table<'t, (&'static str, u64), &'static [u8]>;

/// Edits the redb `sessions` table directly, as another program would.
fn redb_sessions(path: &Path, edit: impl FnOnce(&mut RedbSessions<'_>)) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let def: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new(SESSIONS);
        edit(&mut txn.open_table(def).unwrap());
    }
    txn.commit().unwrap();
}

/// Edits the redb `rows` table directly, as another program would.
fn redb_rows(path: &Path, edit: impl FnOnce(&mut RedbRows<'_>)) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let def: redb::TableDefinition<(&str, u64), &[u8]> = redb::TableDefinition::new("rows");
        edit(&mut txn.open_table(def).unwrap());
    }
    txn.commit().unwrap();
}

const BACKENDS: [Backend; 2] = [Backend::Redb, Backend::Sqlite];

#[tokio::test]
async fn a_changed_row_is_corrupt_when_read_and_reported() {
    for backend in BACKENDS {
        let fixture = Fixture::new(backend).await;
        fixture.change_row("a", 1);
        let store = fixture.open_damaged().await;
        // The record is intact; reading the row is what finds the damage.
        assert_eq!(store.session("a").await.unwrap().unwrap().row_count, 3);
        assert_eq!(store.rows("a", 0..1).await.unwrap().len(), 1, "{backend:?}");
        let rows = store.rows("a", 0..3).await;
        assert!(is_corrupt(&rows), "{backend:?}: {rows:?}");
        let export = store.export_session("a").await;
        assert!(is_corrupt(&export), "{backend:?}: {export:?}");
        let report = verify(&store).await;
        assert!(report.complete, "{backend:?}: {report:?}");
        assert_eq!(
            kinds(&report),
            vec![(ProblemKind::Row, Some("a"))],
            "{backend:?}"
        );
        assert_eq!((report.sessions, report.rows), (2, 4), "{backend:?}");
    }
}

#[tokio::test]
async fn a_session_whose_key_changed_is_corrupt_under_both_keys() {
    for backend in BACKENDS {
        let fixture = Fixture::new(backend).await;
        fixture.rename_session("a", "c");
        let store = fixture.open_damaged().await;
        // Under the old key: rows without a record. Under the new one: a record whose
        // checksum (or own id) does not match its key.
        let old = store.session("a").await;
        assert!(is_corrupt(&old), "{backend:?}: {old:?}");
        let new = store.session("c").await;
        assert!(is_corrupt(&new), "{backend:?}: {new:?}");
        let rows = store.all_rows("a").await;
        assert!(is_corrupt(&rows), "{backend:?}: {rows:?}");
        let listed = store.list_sessions(None, 10).await;
        assert!(is_corrupt(&listed), "{backend:?}: {listed:?}");
        let report = verify(&store).await;
        assert_eq!(
            kinds(&report),
            vec![
                (ProblemKind::StrayRows, Some("a")),
                (ProblemKind::Session, Some("c"))
            ],
            "{backend:?}: {report:?}"
        );
    }
}

#[tokio::test]
async fn a_lost_record_is_never_a_missing_session() {
    for backend in BACKENDS {
        let fixture = Fixture::new(backend).await;
        fixture.lose_session("a");
        let store = fixture.open_damaged().await;
        let lookup = store.session("a").await;
        assert!(is_corrupt(&lookup), "{backend:?}: {lookup:?}");
        // A write does not start the session over on top of its rows.
        let write = store.commit_turn(commit("a", "thr_x", &["again"])).await;
        assert!(is_corrupt(&write), "{backend:?}: {write:?}");
        let report = verify(&store).await;
        assert_eq!(
            kinds(&report),
            vec![(ProblemKind::StrayRows, Some("a"))],
            "{backend:?}"
        );
        // Deleting the session clears its rows: a repair.
        assert!(!store.delete_session("a").await.unwrap());
        assert_eq!(store.session("a").await.unwrap(), None);
        assert!(verify(&store).await.is_ok());
    }
}

#[tokio::test]
async fn a_missing_row_is_corrupt_when_the_session_is_read() {
    for backend in BACKENDS {
        let fixture = Fixture::new(backend).await;
        fixture.remove_row("a", 1);
        let store = fixture.open_damaged().await;
        for range in [0..3, 1..2, 0..u64::MAX] {
            let rows = store.rows("a", range.clone()).await;
            assert!(is_corrupt(&rows), "{backend:?} {range:?}: {rows:?}");
        }
        let export = store.export_session("a").await;
        assert!(is_corrupt(&export), "{backend:?}: {export:?}");
        // The last row missing: a short read is caught too.
        let fixture = Fixture::new(backend).await;
        fixture.remove_row("a", 2);
        let store = fixture.open_damaged().await;
        let rows = store.all_rows("a").await;
        assert!(is_corrupt(&rows), "{backend:?}: {rows:?}");
        let report = verify(&store).await;
        assert_eq!(
            kinds(&report),
            vec![(ProblemKind::MissingRows, Some("a"))],
            "{backend:?}"
        );
    }
}

#[tokio::test]
async fn a_row_past_its_sessions_count_is_reported_and_never_overwritten() {
    for backend in BACKENDS {
        let fixture = Fixture::new(backend).await;
        fixture.copy_row("a", 0, 3);
        let store = fixture.open_damaged().await;
        // Reads stop at the row count; the next commit must not write over the stray row.
        assert_eq!(store.all_rows("a").await.unwrap().len(), 3);
        let write = store.commit_turn(commit("a", "thr_a", &["four"])).await;
        assert!(write.is_err(), "{backend:?}: {write:?}");
        assert_eq!(store.all_rows("a").await.unwrap().len(), 3);
        // The copied row's checksum names seq 0, so it is also a damaged row.
        let report = verify(&store).await;
        assert_eq!(
            kinds(&report),
            vec![
                (ProblemKind::Row, Some("a")),
                (ProblemKind::StrayRows, Some("a"))
            ],
            "{backend:?}"
        );
    }
}

#[tokio::test]
async fn a_healthy_store_verifies_clean() {
    for backend in BACKENDS {
        let fixture = Fixture::new(backend).await;
        let store = fixture.open().await.unwrap();
        let report = verify(&store).await;
        assert!(report.is_ok(), "{backend:?}: {report:?}");
        assert_eq!((report.sessions, report.rows), (2, 4));
    }
}

#[tokio::test]
async fn a_flipped_byte_in_a_sqlite_file_is_corrupt_when_read() {
    let fixture = Fixture::new(Backend::Sqlite).await;
    let mut bytes = std::fs::read(&fixture.path).unwrap();
    let at = bytes
        .windows(6)
        .position(|w| w == b"needle")
        .expect("the row is in the checkpointed file");
    // 'n' -> 'N': still valid UTF-8 and valid JSON, so only a checksum can tell.
    bytes[at] ^= 0x20;
    std::fs::write(&fixture.path, &bytes).unwrap();
    let store = fixture.open_damaged().await;
    let rows = store.rows("a", 0..1).await;
    assert!(is_corrupt(&rows), "{rows:?}");
    let report = verify(&store).await;
    assert_eq!(kinds(&report), vec![(ProblemKind::Row, Some("a"))]);
}

#[tokio::test]
async fn a_sqlite_session_changed_outside_rethread_is_corrupt() {
    let fixture = Fixture::new(Backend::Sqlite).await;
    sqlite_edit(
        &fixture.path,
        "UPDATE sessions SET row_count = 0 WHERE session_id = 'a'",
    );
    let store = fixture.open_damaged().await;
    let session = store.session("a").await;
    assert!(is_corrupt(&session), "{session:?}");
    let report = verify(&store).await;
    // The record cannot be trusted, so its rows are not judged either.
    assert_eq!(kinds(&report), vec![(ProblemKind::Session, Some("a"))]);
}

#[tokio::test]
async fn a_sqlite_lease_changed_outside_rethread_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = BindingStore::sqlite(&path, OpenOptions::new())
        .await
        .unwrap();
    let holder = LocalOwner::new();
    let owner = holder.owner().clone();
    let ttl = std::time::Duration::from_secs(30);
    let lease = store.acquire_lease("a", &owner, ttl).await.unwrap();
    sqlite_edit(
        &path,
        "UPDATE leases SET expires_at_ms = expires_at_ms + 86400000 WHERE session_id = 'a'",
    );
    let renewed = store.renew_lease(&lease, ttl).await;
    assert!(is_corrupt(&renewed), "{renewed:?}");
    let report = verify(&store).await;
    assert_eq!(kinds(&report), vec![(ProblemKind::Lease, Some("a"))]);
    assert_eq!(report.leases, 1);
}

/// A thread handed to another session outside rethread is `Corrupt` when the store asks whose
/// it is (a commit of another session included), never a thread that changed hands.
#[tokio::test]
async fn a_sqlite_thread_owner_changed_outside_rethread_is_corrupt() {
    let fixture = Fixture::new(Backend::Sqlite).await;
    sqlite_edit(
        &fixture.path,
        "UPDATE threads SET session_id = 'b' WHERE thread_id = 'thr_a'",
    );
    let store = fixture.open().await.expect("a damaged store still opens");
    let owner = store.thread_session("thr_a").await;
    assert!(is_corrupt(&owner), "{owner:?}");
    // An export of b names its threads, so it reads the row that now says b.
    let export = store.export_session("b").await;
    assert!(is_corrupt(&export), "{export:?}");
    let commit = store.commit_turn(commit("c", "thr_a", &["x"])).await;
    assert!(is_corrupt(&commit), "{commit:?}");
    // Reported where it shows: a's bound thread is missing from a's threads, b's threads hold
    // a damaged row, and the row itself.
    let report = verify(&store).await;
    assert_eq!(
        kinds(&report),
        vec![
            (ProblemKind::Session, Some("a")),
            (ProblemKind::Session, Some("b")),
            (ProblemKind::Thread, Some("b"))
        ]
    );
}

/// Page-level damage SQLite itself reports: `verify` runs `PRAGMA quick_check`.
#[tokio::test]
async fn sqlite_structure_damage_is_reported_by_verify() {
    let fixture = Fixture::new(Backend::Sqlite).await;
    let (root, page_size): (i64, i64) = {
        let conn = rusqlite::Connection::open(&fixture.path).unwrap();
        let root = conn
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE name = 'transcript_rows'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (
            root,
            conn.query_row("PRAGMA page_size", [], |r| r.get(0))
                .unwrap(),
        )
    };
    let mut bytes = std::fs::read(&fixture.path).unwrap();
    // The rows table's root page now claims 65535 cells.
    let header = ((root - 1) * page_size) as usize;
    bytes[header + 3] = 0xff;
    bytes[header + 4] = 0xff;
    std::fs::write(&fixture.path, &bytes).unwrap();
    let store = BindingStore::sqlite(&fixture.path, OpenOptions::new())
        .await
        .expect("the open reads the header only");
    let report = store.verify(&mut |_| {}).await.unwrap();
    assert!(!report.is_ok(), "{report:?}");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::Structure),
        "{report:?}"
    );
}

/// With the open-time page check off, damage redb itself does not check for on a cleanly
/// closed file makes redb panic; the store contains the panic on its own threads, answers
/// `Corrupt`, and refuses everything after. With the check (the default), the same file is
/// `Corrupt` at open.
#[tokio::test]
async fn a_redb_panic_on_a_damaged_page_is_corrupt_and_poisons_the_store() {
    let fixture = Fixture::new(Backend::Redb).await;
    let pristine = std::fs::read(&fixture.path).unwrap();
    let needle = br#""session_id":"a""#;
    let at = pristine
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("session a's record is in the file");
    let page = at - at % 4096;
    // The leaf's entry count and first offsets: some flip makes redb index past its page.
    let mut contained = None;
    for offset in page + 2..page + 8 {
        let mut bytes = pristine.clone();
        bytes[offset] ^= 0xff;
        std::fs::write(&fixture.path, &bytes).unwrap();
        // Without the open-time page check: the damage is met when touched.
        let options = OpenOptions::new().check_redb_integrity_on_open(false);
        let store = BindingStore::redb(&fixture.path, options)
            .await
            .expect("the open reads the header only");
        match store.session("a").await {
            Err(StoreError::Corrupt { detail, .. }) if detail.contains("redb failed") => {
                contained = Some(store);
                break;
            }
            _ => store.close().await,
        }
    }
    let store = contained.expect("a flip in the leaf header made redb fail");

    // Poisoned: every call is refused, a write too, and nothing panics.
    let b = store.session("b").await;
    assert!(is_corrupt(&b), "{b:?}");
    let write = store.commit_turn(commit("b", "thr_b", &["more"])).await;
    assert!(is_corrupt(&write), "{write:?}");
    let report = store.verify(&mut |_| {}).await.unwrap();
    assert!(!report.complete, "{report:?}");
    assert_eq!(report.problems[0].kind, ProblemKind::Structure);
    store.close().await;
    // The default open checks every page: the same file is refused there.
    let checked = BindingStore::redb(&fixture.path, OpenOptions::new()).await;
    assert!(
        matches!(checked, Err(StoreError::Corrupt { .. })),
        "the default open checks the pages: {:?}",
        checked.as_ref().err()
    );
}
