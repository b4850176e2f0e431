//! Open benchmark: how long opening a store takes (in-process) and its first `session()`
//! lookup, for stores of 1k, 10k and 100k sessions of 40 rows, per file backend, beside the
//! file size. Run through `cargo xtask bench open` (release build).
//!
//! The stores are built once and kept (default under `target/bench-open/`; a store whose
//! build did not finish is built again). Each measurement opens the closed store, looks up
//! one session (a different one each run), and closes it; the stores take turns (so noise from
//! other work falls on all alike), after one open each that is not counted. The table gives
//! the fastest, the median and the slowest of the runs. The files are in the OS page cache (warm: they were just built or
//! measured), which is what a host reopening its store between turns sees.
//!
//! Options: `--sizes 1000,10000,100000`, `--rows 40` rows per session, `--runs 51`,
//! `--dir PATH` where the stores are kept, `--verify` also times one `BindingStore::verify`
//! per store (the whole-store check that opening no longer does).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use rethread_store::{
    BindingState, BindingStore, Durability, OpenOptions, SessionExport, SessionRecord,
    TranscriptRow,
};
use serde_json::json;

struct Args {
    sizes: Vec<usize>,
    rows: usize,
    runs: usize,
    dir: PathBuf,
    verify: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Redb,
    Sqlite,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Redb => "redb",
            Backend::Sqlite => "sqlite",
        }
    }

    async fn open(self, path: &Path, options: OpenOptions) -> BindingStore {
        match self {
            Backend::Redb => BindingStore::redb(path, options).await.expect("open redb"),
            Backend::Sqlite => BindingStore::sqlite(path, options)
                .await
                .expect("open sqlite"),
        }
    }

    async fn close(self, store: BindingStore) {
        // Every store handle is dropped by now: dropping the last one closes the file and
        // waits for the writer thread (a redb file is closed cleanly, so the next open needs
        // no repair).
        drop(store);
    }
}

fn session_id(i: usize) -> String {
    format!("session-{i:07}")
}

/// One session as a host would have written it: `rows` alternating user and assistant rows.
fn session(i: usize, rows: usize) -> SessionExport {
    let id = session_id(i);
    let mut record = SessionRecord::new(id.clone(), 1_700_000_000_000);
    record.model_config.insert("model".into(), json!("gpt-5"));
    record.set_state(BindingState::Bound(rethread_store::Binding::new(
        format!("thr-{i}"),
        Some("/home/user/.codex".into()),
        1_700_000_000_000,
    )));
    record.row_count = rows as u64;
    let rows = (0..rows as u64)
        .map(|seq| TranscriptRow {
            seq,
            body: json!({
                "role": if seq % 2 == 0 { "user" } else { "assistant" },
                "text": format!("Message {seq} of {id}: the quick brown fox jumps over the lazy dog, twice over the lazy dog."),
            }),
        })
        .collect();
    SessionExport::new(record, rows)
}

/// Builds the store at `path` unless a finished build is there.
async fn ensure_built(backend: Backend, path: &Path, sessions: usize, rows: usize) {
    // The schema version in the marker: a store of another schema is built anew.
    let done = path.with_extension(format!(
        "{}.v{}.done",
        backend.name(),
        rethread_store::SCHEMA_VERSION
    ));
    if done.exists() && path.exists() {
        return;
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(file));
    }
    eprintln!("building {} ...", path.display());
    let started = Instant::now();
    let options = OpenOptions::new()
        .durability(Durability::Relaxed)
        .create_dirs(true);
    let store = backend.open(path, options).await;
    // Imports in flight at once: the writer thread commits what queued up as one
    // transaction (group commit).
    stream::iter(0..sessions)
        .map(|i| {
            let store = store.clone();
            async move {
                store
                    .import_session(session(i, rows))
                    .await
                    .expect("import")
            }
        })
        .buffer_unordered(256)
        .for_each(|_| async {})
        .await;
    backend.close(store).await;
    std::fs::write(&done, b"").expect("write the build marker");
    eprintln!(
        "built {} in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
}

#[derive(Default)]
struct Measured {
    open: Vec<Duration>,
    lookup: Vec<Duration>,
    verify: Option<Duration>,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn min(v: &[Duration]) -> Duration {
    v.iter().copied().min().unwrap_or_default()
}

fn max(v: &[Duration]) -> Duration {
    v.iter().copied().max().unwrap_or_default()
}

/// One measurement: open the closed store, look up one session, close it.
async fn open_once(
    backend: Backend,
    path: &Path,
    sessions: usize,
    run: usize,
    rows: usize,
    into: &mut Measured,
) {
    // The constant-time open: redb's page check on open (on by default) reads the whole file.
    let options = OpenOptions::new()
        .create(false)
        .check_redb_integrity_on_open(false);
    let started = Instant::now();
    let store = backend.open(path, options).await;
    into.open.push(started.elapsed());
    // A different session each run, spread over the key space.
    let id = session_id((run * 7919 + sessions / 2) % sessions);
    let started = Instant::now();
    let record = store.session(&id).await.expect("lookup");
    into.lookup.push(started.elapsed());
    assert_eq!(record.map(|r| r.row_count), Some(rows as u64));
    backend.close(store).await;
}

async fn time_verify(backend: Backend, path: &Path, sessions: usize) -> Duration {
    let options = OpenOptions::new()
        .create(false)
        .check_redb_integrity_on_open(false);
    let store = backend.open(path, options).await;
    let started = Instant::now();
    let report = store.verify(&mut |_| {}).await.expect("verify");
    let took = started.elapsed();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(report.sessions, sessions as u64);
    backend.close(store).await;
    took
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn parse_args() -> Args {
    let mut args = Args {
        sizes: vec![1_000, 10_000, 100_000],
        rows: 40,
        runs: 51,
        dir: PathBuf::from("target/bench-open"),
        verify: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--sizes" => {
                args.sizes = value()
                    .split(',')
                    .map(|s| s.trim().parse().expect("--sizes"))
                    .collect()
            }
            "--rows" => args.rows = value().parse().expect("--rows"),
            "--runs" => args.runs = value().parse::<usize>().expect("--runs").max(1),
            "--dir" => args.dir = PathBuf::from(value()),
            "--verify" => args.verify = true,
            other => panic!("unknown option {other}"),
        }
    }
    args
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let mut stores = Vec::new();
    for backend in [Backend::Redb, Backend::Sqlite] {
        for &sessions in &args.sizes {
            let path = args.dir.join(format!(
                "{}-{sessions}x{}.{}",
                backend.name(),
                args.rows,
                match backend {
                    Backend::Redb => "redb",
                    Backend::Sqlite => "db",
                }
            ));
            ensure_built(backend, &path, sessions, args.rows).await;
            stores.push((backend, sessions, path));
        }
    }
    let mut measured: Vec<Measured> = stores.iter().map(|_| Measured::default()).collect();
    // One open of each first, not counted: the first open of a process or of a file pays for
    // what every later one finds ready (the runtime's blocking threads, the page cache).
    let mut warm_up = Measured::default();
    for (backend, sessions, path) in &stores {
        open_once(*backend, path, *sessions, 0, args.rows, &mut warm_up).await;
    }
    // Round robin over the stores, so that noise from other work falls on all alike.
    for run in 0..args.runs {
        for ((backend, sessions, path), into) in stores.iter().zip(&mut measured) {
            open_once(*backend, path, *sessions, run, args.rows, into).await;
        }
    }
    if args.verify {
        for ((backend, sessions, path), into) in stores.iter().zip(&mut measured) {
            into.verify = Some(time_verify(*backend, path, *sessions).await);
        }
    }
    let table: Vec<_> = stores
        .iter()
        .zip(measured)
        .map(|((backend, sessions, path), m)| {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            (*backend, *sessions, size, m)
        })
        .collect();
    println!(
        "\nopen = open the closed store in-process; lookup = its first session() (a different \
         session each run); {} runs each, warm page cache\n",
        args.runs
    );
    let verify_header = if args.verify { " verify s |" } else { "" };
    println!(
        "| backend | sessions x rows | file MB | open min ms | open median ms | open max ms | lookup median ms |{verify_header}"
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|{}",
        if args.verify { "---:|" } else { "" }
    );
    for (backend, sessions, size, m) in &table {
        let verify = m
            .verify
            .map(|d| format!(" {:.1} |", d.as_secs_f64()))
            .unwrap_or_default();
        println!(
            "| {} | {sessions} x {} | {:.1} | {} | {} | {} | {} |{verify}",
            backend.name(),
            args.rows,
            *size as f64 / 1e6,
            ms(min(&m.open)),
            ms(median(&m.open)),
            ms(max(&m.open)),
            ms(median(&m.lookup)),
        );
    }
    println!();
    for backend in [Backend::Redb, Backend::Sqlite] {
        let rows: Vec<_> = table.iter().filter(|r| r.0 == backend).collect();
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            continue;
        };
        let (small, large) = (median(&first.3.open), median(&last.3.open));
        let ratio = large.as_secs_f64() / small.as_secs_f64().max(1e-9);
        println!(
            "{}: {} sessions open in {} ms, {:.2}x the {} sessions' {} ms (goal: within 2x, under 20 ms): {}",
            backend.name(),
            last.1,
            ms(large),
            ratio,
            first.1,
            ms(small),
            if ratio <= 2.0 && large < Duration::from_millis(20) {
                "met"
            } else {
                "missed"
            }
        );
    }
}
