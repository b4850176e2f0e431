//! Store benchmark: `commit_turn` throughput and latency for 1 session and for 64 concurrent
//! sessions per backend, beside raw baselines measured in the same run (a plain redb write
//! transaction, a plain rusqlite WAL `synchronous=FULL` transaction doing the same writes, and a
//! raw write+fsync loop). Run through `cargo xtask bench store` (release build).
//!
//! A diagnostic row per engine runs the raw transaction on a thread of its own behind the same
//! channel hand-off as the store's writer thread: it splits the store's gap to raw into the
//! hand-off (an async caller must cross to a blocking thread) and the store's own work.
//!
//! Options: `--seconds S` per measurement (default 3), `--sessions N` (default 64),
//! `--rows R` rows per turn (default 2), `--dir PATH` where the files go (default: a temporary
//! directory under the system temp dir), `--postgres URL` (default `$RETHREAD_BENCH_POSTGRES_URL`,
//! else `$RETHREAD_TEST_POSTGRES_URL`): with feature `postgres`, adds the PostgreSQL store (1
//! and N sessions) beside a raw tokio-postgres baseline doing the same writes (one transaction:
//! lock the session row, insert the rows, upsert the session) over the same pool size.
//! `--prune-sessions N` (default 10000): the prune figures (`prune.rs`) for that many idle
//! sessions per backend; `--prune-only` measures only those.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rethread_store::{open_url, BindingStore, Clock, OpenOptions, TurnCommit};
use serde_json::{json, Value};

#[derive(Clone, Copy)]
struct Args {
    seconds: f64,
    sessions: usize,
    rows: usize,
    prune_sessions: usize,
    prune_only: bool,
}

impl Args {
    fn store_options(&self) -> OpenOptions {
        OpenOptions::new()
    }
}

#[derive(Default)]
struct Result {
    name: String,
    commits: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Result {
    /// Adds another round of the same measurement.
    fn absorb(&mut self, other: Result) {
        self.name = other.name;
        self.commits += other.commits;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
    }
    fn rate(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort();
        l[((l.len() as f64 - 1.0) * p).round() as usize]
    }
}

fn row(session: usize, turn: usize, i: usize) -> Value {
    json!({
        "role": if i.is_multiple_of(2) { "user" } else { "assistant" },
        "session": session,
        "turn": turn,
        "text": "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    })
}

fn commit(session: usize, turn: usize, rows: usize) -> TurnCommit {
    TurnCommit::new(
        format!("bench-{session:03}"),
        format!("thr-{session}-{}", turn / 10),
        (0..rows).map(|i| row(session, turn, i)).collect(),
    )
    .codex_home(Some("/home/bench/.codex".to_string()))
}

/// Runs `op` back to back for `seconds`, timing each call.
fn measure_sync(name: &str, seconds: f64, mut op: impl FnMut(usize)) -> Result {
    let mut latencies = Vec::new();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut n = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        op(n);
        latencies.push(t.elapsed());
        n += 1;
    }
    Result {
        name: name.to_string(),
        commits: n,
        elapsed: start.elapsed(),
        latencies,
    }
}

/// Runs the future `op` makes back to back for `seconds`, timing each.
async fn measure_async<F, Fut>(name: &str, seconds: f64, mut op: F) -> Result
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut latencies = Vec::new();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut n = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        op(n).await;
        latencies.push(t.elapsed());
        n += 1;
    }
    Result {
        name: name.to_string(),
        commits: n,
        elapsed: start.elapsed(),
        latencies,
    }
}

/// A raw baseline: set up once, then measured in rounds interleaved with the store's.
trait Raw {
    fn name(&self) -> &'static str;
    fn commit(&mut self, n: usize);
}

struct RawFsync {
    file: std::fs::File,
    payload: Vec<u8>,
}

impl RawFsync {
    fn new(dir: &Path, args: Args) -> Self {
        let path = dir.join("raw.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        RawFsync {
            file,
            payload: serde_json::to_vec(&commit(0, 0, args.rows).rows).unwrap(),
        }
    }
}

impl Raw for RawFsync {
    fn name(&self) -> &'static str {
        "raw write+fsync loop"
    }
    fn commit(&mut self, _: usize) {
        self.file.write_all(&self.payload).unwrap();
        self.file.sync_data().unwrap();
    }
}

const SESSIONS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("sessions");
const ROWS: redb::TableDefinition<(&str, u64), &[u8]> = redb::TableDefinition::new("rows");

fn record_json() -> Value {
    json!({"session_id": "bench-000", "model_config": {"codex_thread_id": "thr"},
        "binding": {"thread_id": "thr", "codex_home": "/home/bench/.codex", "bound_at_ms": 0},
        "row_count": 0, "retired_threads": [], "created_at_ms": 0, "updated_at_ms": 0})
}

struct RawRedb {
    db: redb::Database,
    seq: u64,
    rows: usize,
}

impl Raw for RawRedb {
    fn name(&self) -> &'static str {
        "raw redb transaction"
    }
    fn commit(&mut self, n: usize) {
        let txn = self.db.begin_write().unwrap();
        {
            let mut rows = txn.open_table(ROWS).unwrap();
            for r in commit(0, n, self.rows).rows {
                rows.insert(
                    ("bench-000", self.seq),
                    serde_json::to_vec(&r).unwrap().as_slice(),
                )
                .unwrap();
                self.seq += 1;
            }
            let mut sessions = txn.open_table(SESSIONS).unwrap();
            sessions
                .insert(
                    "bench-000",
                    serde_json::to_vec(&record_json()).unwrap().as_slice(),
                )
                .unwrap();
        }
        txn.commit().unwrap();
    }
}

struct RawSqlite {
    conn: rusqlite::Connection,
    seq: i64,
    rows: usize,
}

impl RawSqlite {
    fn new(dir: &Path, args: Args) -> Self {
        let conn = rusqlite::Connection::open(dir.join("raw.db")).unwrap();
        let _: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        conn.execute_batch(
            "PRAGMA synchronous=FULL;
             CREATE TABLE sessions (session_id TEXT PRIMARY KEY, model_config TEXT, row_count INTEGER) WITHOUT ROWID;
             CREATE TABLE transcript_rows (session_id TEXT, seq INTEGER, body TEXT, PRIMARY KEY (session_id, seq)) WITHOUT ROWID;",
        )
        .unwrap();
        RawSqlite {
            conn,
            seq: 0,
            rows: args.rows,
        }
    }
}

impl Raw for RawSqlite {
    fn name(&self) -> &'static str {
        "raw rusqlite WAL synchronous=FULL transaction"
    }
    fn commit(&mut self, n: usize) {
        let conn = &self.conn;
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        for r in commit(0, n, self.rows).rows {
            conn.prepare_cached("INSERT INTO transcript_rows VALUES (?1, ?2, ?3)")
                .unwrap()
                .execute(rusqlite::params!["bench-000", self.seq, r.to_string()])
                .unwrap();
            self.seq += 1;
        }
        conn.prepare_cached("INSERT OR REPLACE INTO sessions VALUES (?1, ?2, ?3)")
            .unwrap()
            .execute(rusqlite::params![
                "bench-000",
                record_json().to_string(),
                self.seq
            ])
            .unwrap();
        conn.execute_batch("COMMIT").unwrap();
    }
}

/// Diagnostic, not a goal baseline: a raw baseline on a thread of its own, driven from async
/// through a channel with oneshot replies the way the store's writer thread is. Its gap to the
/// raw row is the price of the hand-off alone; the store's gap to it is the store's own work
/// (rules, record encoding, checksums).
struct HandOff {
    tx: std::sync::mpsc::Sender<(usize, tokio::sync::oneshot::Sender<()>)>,
}

impl HandOff {
    fn spawn(make: impl FnOnce() -> Box<dyn Raw> + Send + 'static) -> HandOff {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, tokio::sync::oneshot::Sender<()>)>();
        std::thread::spawn(move || {
            let mut raw = make();
            while let Ok((n, reply)) = rx.recv() {
                raw.commit(n);
                let _ = reply.send(());
            }
        });
        HandOff { tx }
    }

    /// One commit through the hand-off, waited for as a store write is.
    async fn commit(&self, n: usize) {
        let (reply, done) = tokio::sync::oneshot::channel();
        self.tx.send((n, reply)).unwrap();
        done.await.unwrap();
    }

    async fn round(&self, name: &str, seconds: f64, offset: usize) -> Result {
        measure_async(name, seconds, |n| self.commit(offset + n)).await
    }
}

fn raw_round(raw: &mut dyn Raw, seconds: f64, offset: usize) -> Result {
    let name = raw.name();
    measure_sync(name, seconds, |n| raw.commit(offset + n))
}

async fn store_one(
    name: &str,
    store: BindingStore,
    args: Args,
    seconds: f64,
    offset: usize,
) -> Result {
    measure_async(name, seconds, |n| {
        let store = store.clone();
        async move {
            store
                .commit_turn(commit(0, offset + n, args.rows))
                .await
                .unwrap();
        }
    })
    .await
}

async fn store_many(name: &str, store: BindingStore, args: Args) -> Result {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.seconds);
    let tasks: Vec<_> = (0..args.sessions)
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    store
                        .commit_turn(commit(s + 1, n, args.rows))
                        .await
                        .unwrap();
                    latencies.push(t.elapsed());
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    Result {
        name: name.to_string(),
        commits: latencies.len(),
        elapsed: start.elapsed(),
        latencies,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!(
        "{cores} cores, {cpu}, {}/{}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

#[cfg(feature = "postgres")]
mod pg;
mod prune;

/// The prune figures of each backend (PostgreSQL with a URL), each on a store of its own.
async fn prune_figures(dir: &Path, args: Args, postgres: Option<&str>) -> Vec<prune::Figures> {
    let n = args.prune_sessions;
    let mut figures = Vec::new();
    for backend in ["redb", "sqlite", "postgres"] {
        let clock = Clock::manual();
        let options = OpenOptions::new().clock(clock.clone());
        let store: BindingStore = match backend {
            "redb" => BindingStore::redb(dir.join("prune.redb"), options)
                .await
                .unwrap(),
            "sqlite" => BindingStore::sqlite(dir.join("prune.db"), options)
                .await
                .unwrap(),
            _ => match postgres {
                Some(url) => open_url(&prune_schema(url), options).await.unwrap(),
                None => continue,
            },
        };
        let name = format!("{backend} store");
        figures.push(prune::measure(&name, store, &clock, n).await);
    }
    figures
}

/// `url` with a schema of its own for the prune figures.
fn prune_schema(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}schema=bench_prune_{}", std::process::id())
}

fn print_prune(figures: &[prune::Figures]) {
    println!("\n| prune | idle sessions | prune s | commits during | commit p99 ms alone | commit p99 ms during | commit max ms during |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for f in figures {
        println!(
            "| {} | {} | {:.2} | {} | {} | {} | {} |",
            f.name,
            f.sessions,
            f.prune.as_secs_f64(),
            f.commits_during,
            ms(f.p99_alone),
            ms(f.p99_during),
            ms(f.max_during)
        );
    }
}

fn parse_args() -> (Args, Option<PathBuf>, Option<String>) {
    let mut postgres = None;
    let mut args = Args {
        seconds: 3.0,
        sessions: 64,
        rows: 2,
        prune_sessions: 10_000,
        prune_only: false,
    };
    let mut dir = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--seconds" => args.seconds = value().parse().expect("--seconds"),
            "--sessions" => args.sessions = value().parse().expect("--sessions"),
            "--rows" => args.rows = value().parse().expect("--rows"),
            "--dir" => dir = Some(PathBuf::from(value())),
            "--postgres" => postgres = Some(value()),
            "--prune-sessions" => args.prune_sessions = value().parse().expect("--prune-sessions"),
            "--prune-only" => args.prune_only = true,
            other => panic!("unknown option {other}"),
        }
    }
    (args, dir, postgres)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (args, dir, postgres_url) = parse_args();
    let tmp = match &dir {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let dir = tmp.path().to_path_buf();
    eprintln!(
        "bench store: {} s per row, {} rows per turn, files in {}",
        args.seconds,
        args.rows,
        dir.display()
    );

    let postgres_url = postgres_url
        .or_else(|| std::env::var("RETHREAD_BENCH_POSTGRES_URL").ok())
        .or_else(|| std::env::var("RETHREAD_TEST_POSTGRES_URL").ok());
    if args.prune_only {
        println!("machine: {}", machine());
        print_prune(&prune_figures(&dir, args, postgres_url.as_deref()).await);
        return;
    }
    // Raw baselines and the one-session store runs alternate in short rounds, so that noise
    // from other work on the machine falls on both alike.
    const ROUNDS: usize = 6;
    let round = args.seconds / ROUNDS as f64;
    let mut results = Vec::new();
    let mut fsync = Result::default();
    let mut raw_fsync = RawFsync::new(&dir, args);
    let mut checks = Vec::new();
    for backend in ["redb", "sqlite"] {
        let mut raw: Box<dyn Raw> = if backend == "redb" {
            let db = redb::Database::create(dir.join("raw.redb")).unwrap();
            Box::new(RawRedb {
                db,
                seq: 0,
                rows: args.rows,
            })
        } else {
            Box::new(RawSqlite::new(&dir, args))
        };
        let store: BindingStore = if backend == "redb" {
            BindingStore::redb(dir.join("store.redb"), args.store_options())
                .await
                .unwrap()
        } else {
            BindingStore::sqlite(dir.join("store.db"), args.store_options())
                .await
                .unwrap()
        };
        // The same store sealed (issue 43), measured in the same rounds.
        let sealed_options = args
            .store_options()
            .key(Some(rethread_store::StoreKey::generate().unwrap()));
        let sealed: BindingStore = if backend == "redb" {
            BindingStore::redb(dir.join("sealed.redb"), sealed_options).await
        } else {
            BindingStore::sqlite(dir.join("sealed.db"), sealed_options).await
        }
        .unwrap();
        let mut sealed_one = Result::default();
        let handoff_dir = dir.join(format!("handoff-{backend}"));
        std::fs::create_dir_all(&handoff_dir).unwrap();
        let handoff = HandOff::spawn(move || -> Box<dyn Raw> {
            if backend == "redb" {
                Box::new(RawRedb {
                    db: redb::Database::create(handoff_dir.join("raw.redb")).unwrap(),
                    seq: 0,
                    rows: args.rows,
                })
            } else {
                Box::new(RawSqlite::new(&handoff_dir, args))
            }
        });
        let (mut raw_total, mut handed, mut one) =
            (Result::default(), Result::default(), Result::default());
        for r in 0..ROUNDS {
            let offset = r * 1_000_000;
            if backend == "redb" {
                fsync.absorb(raw_round(&mut raw_fsync, round / 2.0, offset));
            }
            raw_total.absorb(raw_round(raw.as_mut(), round, offset));
            let name = format!("{} behind a thread hand-off (diagnostic)", raw.name());
            handed.absorb(handoff.round(&name, round / 2.0, offset).await);
            let name = format!("{backend} store, 1 session");
            one.absorb(store_one(&name, store.clone(), args, round, offset).await);
            let name = format!("{backend} store sealed, 1 session");
            sealed_one.absorb(store_one(&name, sealed.clone(), args, round, offset).await);
        }
        drop(handoff);
        eprintln!("  {}: {:.0}/s", raw_total.name, raw_total.rate());
        eprintln!("  {}: {:.0}/s", handed.name, handed.rate());
        eprintln!("  {}: {:.0}/s", one.name, one.rate());
        eprintln!("  {}: {:.0}/s", sealed_one.name, sealed_one.rate());
        let (plain_p50, sealed_p50) = (one.pct(0.5), sealed_one.pct(0.5));
        checks.push(format!(
            "{backend}: sealed commit p50 {} ms against {} ms unsealed ({:+.1}%, goal <= +10%): {}",
            ms(sealed_p50),
            ms(plain_p50),
            100.0 * (sealed_p50.as_secs_f64() / plain_p50.as_secs_f64() - 1.0),
            if sealed_p50.as_secs_f64() <= 1.1 * plain_p50.as_secs_f64() {
                "met"
            } else {
                "MISSED"
            },
        ));
        results.push(sealed_one);
        let many = store_many(
            &format!("{backend} store, {} sessions", args.sessions),
            store.clone(),
            args,
        )
        .await;
        eprintln!("  {}: {:.0}/s", many.name, many.rate());
        checks.push(format!(
            "{backend}: 1 session at {:.0}% of raw {backend} (goal >= 80%): {} \
             (the hand-off alone: {:.0}% of raw; the store: {:.0}% of the hand-off)",
            100.0 * one.rate() / raw_total.rate(),
            if one.rate() >= 0.8 * raw_total.rate() {
                "met"
            } else {
                "MISSED"
            },
            100.0 * handed.rate() / raw_total.rate(),
            100.0 * one.rate() / handed.rate(),
        ));
        checks.push(format!(
            "{backend}: {} sessions at {:.1}x the 1-session rate (goal >= 4x): {}; p99 {} ms (goal < 20 ms): {}",
            args.sessions,
            many.rate() / one.rate(),
            if many.rate() >= 4.0 * one.rate() { "met" } else { "MISSED" },
            ms(many.pct(0.99)),
            if many.pct(0.99) < Duration::from_millis(20) { "met" } else { "MISSED" }
        ));
        results.push(raw_total);
        results.push(handed);
        results.push(one);
        results.push(many);
    }
    results.insert(0, fsync);
    #[cfg(feature = "postgres")]
    {
        match postgres_url.clone() {
            Some(url) => pg::run(&url, args, &mut results, &mut checks).await,
            None => eprintln!("no PostgreSQL URL (--postgres or RETHREAD_BENCH_POSTGRES_URL): PostgreSQL rows skipped"),
        }
    }
    let prune = prune_figures(&dir, args, postgres_url.as_deref()).await;

    println!("machine: {}", machine());
    println!(
        "workload: one turn = {} JSON rows (~150 B each) + session record update\n",
        args.rows
    );
    println!("| measurement | commits | commits/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for r in &results {
        println!(
            "| {} | {} | {:.0} | {} | {} |",
            r.name,
            r.commits,
            r.rate(),
            ms(r.pct(0.5)),
            ms(r.pct(0.99))
        );
    }
    println!();
    for c in checks {
        println!("- {c}");
    }
    print_prune(&prune);
}
