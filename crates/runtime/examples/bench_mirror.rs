//! `cargo xtask bench mirror`: what the rollout mirror costs, in one run (`docs/benchmarks.md`).
//!
//! 1. A turn's commit (`binding::commit_turn`, durable) with and without the mirror, by what
//!    the rollout grew by (5 KB, 100 KB, 1 MB): each commit first appends that many bytes of
//!    JSON lines to a real rollout file, then commits two rows; with the mirror the commit also
//!    reads the new bytes and stores them in the same transaction. The two kinds alternate
//!    commit by commit so that noise falls on both; p50 and p99 of each, and what the mirror
//!    adds.
//! 2. Restoring a rollout of 100, 1,000 and 5,000 turns (a 21 KB first line, then 5.3 KB per
//!    turn, as 0.171.0 writes a paginated thread's short turns) into a home that lacks it
//!    (`RolloutMirror::restore`: the record, every chunk, a temp file and a rename), beside a
//!    plain copy of the same file (`std::fs::copy`), median of the samples.
//!
//! 3. A thread of `--big-mib N` MiB (default 512; 0 skips it) of codex-shaped JSONL
//!    (`rethread_testkit::rollout`: tool output, prose, reasoning items with incompressible
//!    `encrypted_content`, seeded), mirrored under the default cap: the store's bytes as a
//!    share of the rollout's, the commit p50 of a 5 KB turn on it beside the same on a 1 MB
//!    thread (alternating), and its restore into an empty home: time, and peak resident memory
//!    above the process's baseline (`VmHWM` after `clear_refs` 5, minus `VmRSS` before).
//!
//! Every rollout byte appended is codex-shaped JSONL cut at a line end, never a repeated byte
//! (the store compresses what it keeps: a repeated byte would cost nothing).
//!
//! Backends: SQLite and redb in a temp dir (`--dir PATH` to measure another filesystem), and
//! PostgreSQL with `--postgres URL` (or `RETHREAD_BENCH_POSTGRES_URL`,
//! `RETHREAD_TEST_POSTGRES_URL`). Flags: `--commits N` (per kind and size, default 200),
//! `--samples N` (restores, default 7), `--turns 100,1000,5000`, `--restores-only`,
//! `--big-mib N`, `--big-only` (part 3 alone).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rethread_runtime::binding::{commit_turn, TurnRows};
use rethread_runtime::{RolloutMirror, Transcript};
use rethread_store::{
    open_url, BindingStore, Durability, MirrorAppend, MirrorUpdate, OpenOptions, StoreKey,
    TurnCommit,
};
use serde_json::json;

struct Args {
    commits: usize,
    samples: usize,
    turns: Vec<usize>,
    dir: Option<PathBuf>,
    postgres: Option<String>,
    restores_only: bool,
    big_mib: usize,
    big_only: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        commits: 200,
        samples: 7,
        turns: vec![100, 1000, 5000],
        dir: None,
        restores_only: false,
        big_mib: 512,
        big_only: false,
        postgres: std::env::var("RETHREAD_BENCH_POSTGRES_URL")
            .or_else(|_| std::env::var("RETHREAD_TEST_POSTGRES_URL"))
            .ok(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--commits" => args.commits = value().parse().expect("--commits N"),
            "--samples" => args.samples = value().parse().expect("--samples N"),
            "--turns" => {
                args.turns = value()
                    .split(',')
                    .map(|t| t.parse().expect("a number of turns"))
                    .collect()
            }
            "--dir" => args.dir = Some(PathBuf::from(value())),
            "--postgres" => args.postgres = Some(value()),
            "--restores-only" => args.restores_only = true,
            "--big-mib" => args.big_mib = value().parse().expect("--big-mib N"),
            "--big-only" => args.big_only = true,
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// Codex-shaped JSONL (`rethread_testkit::rollout`), handed out in pieces cut at line ends;
/// 64 MiB generated once from a seed and reused from the start when used up (each piece is
/// compressed on its own or with its neighbours, never with bytes 64 MiB away).
struct Jsonl {
    bytes: Vec<u8>,
    at: usize,
}

impl Jsonl {
    fn new(seed: u64) -> Self {
        let mut rollout = rethread_testkit::rollout::Rollout::new(seed);
        let mut bytes = rollout.meta();
        while bytes.len() < 64 << 20 {
            let size = 5_000 + (bytes.len() * 7919) % 55_000;
            bytes.extend_from_slice(&rollout.turn(size));
        }
        Jsonl { bytes, at: 0 }
    }

    /// The next whole lines of at least `size` bytes.
    fn next(&mut self, size: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(size + 16_384);
        while out.len() < size {
            if self.at >= self.bytes.len() {
                self.at = 0;
            }
            let want = (self.at + size - out.len()).min(self.bytes.len());
            let end = match self.bytes[want..].iter().position(|&b| b == b'\n') {
                Some(nl) => want + nl + 1,
                None => self.bytes.len(),
            };
            out.extend_from_slice(&self.bytes[self.at..end]);
            self.at = end;
        }
        out
    }
}

fn append(path: &Path, bytes: &[u8]) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(bytes).unwrap();
}

/// Where codex keeps `thread`'s rollout under `home`.
fn rollout_path(home: &Path, thread: &str) -> PathBuf {
    home.join("sessions/2026/12/01")
        .join(format!("rollout-2026-12-01T10-00-00-{thread}.jsonl"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn open(url: &str, durability: Durability) -> BindingStore {
    open_url(url, OpenOptions::default().durability(durability))
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Part 1 on one backend: the commit with and without the mirror, per delta size.
async fn commits(name: &str, url: &str, args: &Args, jsonl: &mut Jsonl) {
    let store = open(url, Durability::Durable).await;
    println!(
        "\n### {name}: a turn's commit, with and without the mirror ({} commits each)\n",
        args.commits
    );
    println!("| rollout grew by | without p50 | without p99 | with p50 | with p99 | added p50 | added p99 |");
    println!("|---|---|---|---|---|---|---|");
    for (label, size) in [("5 KB", 5_000), ("100 KB", 100_000), ("1 MB", 1_000_000)] {
        let home = tempfile::tempdir().unwrap();
        let session = format!("bench-{name}-{size}-{}", std::process::id());
        let thread = format!("{session}-thread");
        let path = rollout_path(home.path(), &thread);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        append(&path, &jsonl.next(21_000));
        // The unmirrored session's thread writes its rollout too (codex does either way).
        let plain_path = home.path().join("sessions/plain-rollout.jsonl");
        let mirror = RolloutMirror::with_cap(home.path(), u64::MAX);
        let rows = [
            json!({"role": "user", "text": "hello"}),
            json!({"role": "assistant", "text": "hi"}),
        ];
        let (mut with, mut without) = (Vec::new(), Vec::new());
        // A first commit mirrors the whole file; the measured ones mirror what it grew by.
        commit_turn(
            &store,
            &Transcript::Store,
            None,
            TurnRows::new(&session, &thread, &rows).mirror(Some(&mirror)),
        )
        .await
        .unwrap();
        let other = format!("{session}-plain");
        let other_thread = format!("{other}-thread");
        // The two kinds alternate commit by commit (each goes first half the time), so that
        // the machine's noise falls on both alike.
        for i in 0..args.commits * 2 {
            let mirrored = (i % 2 == 0) == (i % 4 < 2);
            append(
                if mirrored { &path } else { &plain_path },
                &jsonl.next(size),
            );
            let (turn, out) = if mirrored {
                (
                    TurnRows::new(&session, &thread, &rows).mirror(Some(&mirror)),
                    &mut with,
                )
            } else {
                (TurnRows::new(&other, &other_thread, &rows), &mut without)
            };
            let started = Instant::now();
            let committed = commit_turn(&store, &Transcript::Store, None, turn)
                .await
                .unwrap();
            out.push(started.elapsed());
            if mirrored {
                assert_eq!(committed.mirror, rethread_runtime::MirrorReport::Written);
            }
        }
        with.sort();
        without.sort();
        let (w50, w99) = (percentile(&with, 0.5), percentile(&with, 0.99));
        let (o50, o99) = (percentile(&without, 0.5), percentile(&without, 0.99));
        println!(
            "| {label} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:+.2} ms | {:+.2} ms |",
            ms(o50),
            ms(o99),
            ms(w50),
            ms(w99),
            ms(w50) - ms(o50),
            ms(w99) - ms(o99)
        );
    }
}

/// Writes every dirty page out (`sync`), outside the timings: each restore and each copy
/// starts with no writeback of the previous sample's files under way, whose throttling
/// otherwise makes a sample of 28 MB take 2-8x its time.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

/// `work` timed, after a [`settle`].
async fn timed<T>(work: impl std::future::Future<Output = T>) -> (Duration, T) {
    settle();
    let started = Instant::now();
    let done = work.await;
    (started.elapsed(), done)
}

/// The median of `samples`.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    percentile(&samples, 0.5)
}

/// Part 2 on one backend: restoring rollouts of each length, beside a plain copy.
async fn restores(name: &str, url: &str, args: &Args, jsonl: &mut Jsonl, key: Option<StoreKey>) {
    // Built relaxed (the commits themselves are part 1's); read back as any store is. With
    // `key`, the store is sealed (issue 43).
    let options = OpenOptions::default()
        .durability(Durability::Relaxed)
        .key(key);
    let store = open_url(url, options)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    println!(
        "\n### {name}: restoring a rollout into a home that lacks it (median of {})\n",
        args.samples
    );
    println!("| turns | bytes | chunks | restore | with its own record read | of which reading the store | plain copy | restore / copy | open, home holds it |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &turns in &args.turns {
        let home = tempfile::tempdir().unwrap();
        let session = format!("restore-{name}-{turns}-{}", std::process::id());
        let thread = format!("{session}-thread");
        let path = rollout_path(home.path(), &thread);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mirror = RolloutMirror::with_cap(home.path(), u64::MAX);
        let rows = [json!({"role": "user", "text": "hello"})];
        append(&path, &jsonl.next(21_000));
        for _ in 0..turns {
            append(&path, &jsonl.next(5_300));
            commit_turn(
                &store,
                &Transcript::Store,
                None,
                TurnRows::new(&session, &thread, &rows).mirror(Some(&mirror)),
            )
            .await
            .unwrap();
        }
        let bytes = std::fs::metadata(&path).unwrap().len();
        let record = store.session(&session).await.unwrap().unwrap();
        let chunks: u64 = record.mirror.files.iter().map(|f| f.chunks()).sum();
        let (mut restore, mut copy, mut read) = (Vec::new(), Vec::new(), Vec::new());
        let (mut own_read, mut holds) = (Vec::new(), Vec::new());
        let file_path = record.mirror.files[0].path.clone();
        for _ in 0..args.samples {
            // As a driver's open restores: from the record its `ReadSession` read.
            let target = tempfile::tempdir().unwrap();
            let mirror = RolloutMirror::new(target.path());
            let (took, restored) = timed(mirror.restore_from(&store, &record, &thread)).await;
            restore.push(took);
            assert_eq!(restored.unwrap().written.len(), 1);
            // Reading the record first, as `RolloutMirror::restore` does.
            let own = tempfile::tempdir().unwrap();
            let mirror = RolloutMirror::new(own.path());
            let (took, restored) = timed(mirror.restore(&store, &session, &thread)).await;
            own_read.push(took);
            assert_eq!(restored.unwrap().written.len(), 1);
            let (took, held) = timed(store.mirror_file(&session, &thread, &file_path)).await;
            read.push(took);
            assert_eq!(held.unwrap().map(|b| b.len() as u64), Some(bytes));
            // What every open pays where the home already holds the rollout (a new process:
            // no file known yet): the local check finds it whole and writes nothing.
            let mirror = RolloutMirror::new(home.path());
            let (took, restored) = timed(mirror.restore_from(&store, &record, &thread)).await;
            holds.push(took);
            assert!(restored.unwrap().written.is_empty());
            let plain = tempfile::tempdir().unwrap();
            let to = rollout_path(plain.path(), &thread);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            let (took, copied) = timed(async { std::fs::copy(&path, &to) }).await;
            copy.push(took);
            copied.unwrap();
            assert_eq!(
                std::fs::read(rollout_path(target.path(), &thread)).unwrap(),
                std::fs::read(&to).unwrap()
            );
        }
        let (r, c) = (median(restore), median(copy));
        println!(
            "| {turns} | {:.1} MB | {chunks} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2}x | {:.2} ms |",
            bytes as f64 / 1e6,
            ms(r),
            ms(median(own_read)),
            ms(median(read)),
            ms(c),
            r.as_secs_f64() / c.as_secs_f64(),
            ms(median(holds))
        );
    }
}

/// A `/proc/self/status` figure in KiB (`VmRSS`, `VmHWM`); 0 where there is none.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets the peak resident memory (`VmHWM`) to the current; whether the kernel allowed it.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Part 3 on one backend: a thread of `args.big_mib` MiB.
async fn big(name: &str, url: &str, args: &Args, jsonl: &mut Jsonl) {
    let store = open(url, Durability::Durable).await;
    let home = tempfile::tempdir().unwrap();
    let session = format!("big-{name}-{}", std::process::id());
    let thread = format!("{session}-thread");
    let path = rollout_path(home.path(), &thread);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let target = (args.big_mib as u64) << 20;
    let mut written = 0u64;
    append(&path, &jsonl.next(21_000));
    while written < target {
        let piece = jsonl.next(8 << 20);
        written += piece.len() as u64;
        append(&path, &piece);
    }
    let bytes = std::fs::metadata(&path).unwrap().len();
    // The default cap: a thread of this size is mirrored whole.
    let mirror = RolloutMirror::new(home.path());
    let rows = [json!({"role": "user", "text": "hello"})];
    let started = Instant::now();
    let committed = commit_turn(
        &store,
        &Transcript::Store,
        None,
        commit_turn_rows(&session, &thread, &rows, &mirror),
    )
    .await
    .unwrap();
    let first = started.elapsed();
    assert_eq!(committed.mirror, rethread_runtime::MirrorReport::Written);
    let record = store.session(&session).await.unwrap().unwrap();
    let file_path = record.mirror.files[0].path.clone();
    let stored =
        rethread_store::conformance::stored_mirror_bytes(&store, &session, &thread, &file_path)
            .await;

    // A 1 MB thread beside it, its 5 KB turns alternating with the big thread's.
    let small_home = tempfile::tempdir().unwrap();
    let small = format!("{session}-1mb");
    let small_thread = format!("{small}-thread");
    let small_path = rollout_path(small_home.path(), &small_thread);
    std::fs::create_dir_all(small_path.parent().unwrap()).unwrap();
    append(&small_path, &jsonl.next(1_000_000));
    let small_mirror = RolloutMirror::new(small_home.path());
    commit_turn(
        &store,
        &Transcript::Store,
        None,
        commit_turn_rows(&small, &small_thread, &rows, &small_mirror),
    )
    .await
    .unwrap();
    let (mut on_big, mut on_small) = (Vec::new(), Vec::new());
    for i in 0..args.commits * 2 {
        let is_big = (i % 2 == 0) == (i % 4 < 2);
        let (p, s, t, m, out) = match is_big {
            true => (&path, &session, &thread, &mirror, &mut on_big),
            false => (
                &small_path,
                &small,
                &small_thread,
                &small_mirror,
                &mut on_small,
            ),
        };
        append(p, &jsonl.next(5_000));
        let started = Instant::now();
        let committed = commit_turn(
            &store,
            &Transcript::Store,
            None,
            commit_turn_rows(s, t, &rows, m),
        )
        .await
        .unwrap();
        out.push(started.elapsed());
        assert_eq!(committed.mirror, rethread_runtime::MirrorReport::Written);
    }
    on_big.sort();
    on_small.sort();
    let (b50, s50) = (percentile(&on_big, 0.5), percentile(&on_small, 0.5));
    // The store's part alone: the same appends as `BindingStore::commit_turn` calls, without
    // the runtime's check of the local file (which sums the file's mirrored start).
    let (store_big, store_small) = store_commits(
        &store,
        [(&session, &thread), (&small, &small_thread)],
        args,
        jsonl,
    )
    .await;

    // Restores into empty homes, from the record an open has read.
    let record = store.session(&session).await.unwrap().unwrap();
    let bytes_now = record.mirror.files[0].len;
    let mut times = Vec::new();
    let mut peaks = Vec::new();
    let mut peak_reset = true;
    for _ in 0..args.samples.clamp(1, 3) {
        let target = tempfile::tempdir().unwrap();
        let restorer = RolloutMirror::new(target.path());
        settle();
        let baseline = status_kib("VmRSS");
        peak_reset &= reset_peak();
        let started = Instant::now();
        let restored = restorer
            .restore_from(&store, &record, &thread)
            .await
            .unwrap();
        times.push(started.elapsed());
        peaks.push(status_kib("VmHWM").saturating_sub(baseline));
        assert_eq!(restored.written.len(), 1);
        let restored = rollout_path(target.path(), &thread);
        assert_eq!(std::fs::metadata(&restored).unwrap().len(), bytes_now);
    }
    let peak = peaks.iter().max().copied().unwrap_or(0);
    println!(
        "| {name} | {:.1} MiB | {:.1} MiB ({:.1}%) | {:.1} s | {:.2} / {:.2} ms ({:+.2}) | {:.2} / {:.2} ms ({:+.2}) | {:.2} s | {:.1} MiB{} |",
        bytes as f64 / 1048576.0,
        stored as f64 / 1048576.0,
        stored as f64 * 100.0 / bytes as f64,
        first.as_secs_f64(),
        ms(b50),
        ms(s50),
        ms(b50) - ms(s50),
        ms(store_big),
        ms(store_small),
        ms(store_big) - ms(store_small),
        median(times).as_secs_f64(),
        peak as f64 / 1024.0,
        if peak_reset { "" } else { " (VmHWM not reset: peak since start)" }
    );
    store.close().await;
}

/// `args.commits` 5 KB appends to each of two mirrored sessions, alternating, committed
/// straight through the store; the p50 of each.
async fn store_commits(
    store: &BindingStore,
    sessions: [(&str, &str); 2],
    args: &Args,
    jsonl: &mut Jsonl,
) -> (Duration, Duration) {
    let mut files = Vec::new();
    for (session, thread) in sessions {
        let record = store.session(session).await.unwrap().unwrap();
        let file = record.mirror.files_of(thread).next().unwrap().clone();
        files.push((session, thread, file.path, file.len, file.crc32, Vec::new()));
    }
    let rows = [json!({"role": "user", "text": "hello"})];
    for i in 0..args.commits * 2 {
        let which = usize::from((i % 2 == 0) != (i % 4 < 2));
        let (session, thread, path, len, crc, times) = &mut files[which];
        let delta = jsonl.next(5_000);
        let (new_len, new_crc) = (
            *len + delta.len() as u64,
            rethread_store::crc32_extend(*crc, *len, &delta),
        );
        let append = MirrorAppend::extend(path.clone(), *len, *crc, delta);
        let commit = TurnCommit::new(*session, *thread, rows.to_vec())
            .mirror(Some(MirrorUpdate::new(vec![append])));
        let started = Instant::now();
        store.commit_turn(commit).await.unwrap();
        times.push(started.elapsed());
        (*len, *crc) = (new_len, new_crc);
    }
    let mut p50 = files.into_iter().map(|f| {
        let mut times = f.5;
        times.sort();
        percentile(&times, 0.5)
    });
    (p50.next().unwrap(), p50.next().unwrap())
}

/// A turn's two rows, mirrored by `mirror`.
fn commit_turn_rows<'a>(
    session: &'a str,
    thread: &'a str,
    rows: &'a [serde_json::Value],
    mirror: &'a RolloutMirror,
) -> TurnRows<'a> {
    TurnRows::new(session, thread, rows).mirror(Some(mirror))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    let dir = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let mut backends = vec![
        (
            "SQLite".to_string(),
            format!("sqlite:{}", dir.path().join("bench.sqlite").display()),
        ),
        (
            "redb".to_string(),
            format!("redb:{}", dir.path().join("bench.redb").display()),
        ),
    ];
    if let Some(url) = &args.postgres {
        let sep = if url.contains('?') { '&' } else { '?' };
        backends.push((
            "PostgreSQL".to_string(),
            format!("{url}{sep}schema=bench_mirror_{}", std::process::id()),
        ));
    }
    println!(
        "rethread bench mirror: durable commits; stores under {}",
        dir.path().display()
    );
    let mut jsonl = Jsonl::new(39);
    if !args.restores_only && !args.big_only {
        for (name, url) in &backends {
            commits(name, url, &args, &mut jsonl).await;
        }
    }
    if args.big_mib > 0 && !args.restores_only {
        println!(
            "\n### A thread of {} MiB of codex-shaped JSONL ({} 5 KB turns on it and on a 1 MB thread, alternating)\n",
            args.big_mib, args.commits
        );
        println!("| backend | rollout | stored | first commit (whole file) | 5 KB turn p50 through the runtime, big / 1 MB thread (difference) | the store alone, big / 1 MB (difference) | restore (median) | restore peak RSS above baseline |");
        println!("|---|---|---|---|---|---|---|---|");
        for (name, url) in &backends {
            let big_url = url.replace("bench.", "big.");
            let big_url = if name == "PostgreSQL" {
                format!("{big_url}_big")
            } else {
                big_url
            };
            big(name, &big_url, &args, &mut jsonl).await;
        }
    }
    if args.big_only {
        return;
    }
    for (name, url) in &backends {
        let restore_url = url.replace("bench.", "restore.");
        let restore_url = if name == "PostgreSQL" {
            format!("{restore_url}_restore")
        } else {
            restore_url
        };
        restores(name, &restore_url, &args, &mut jsonl, None).await;
        // The same, sealed (issue 43: a sealed restore at most 1.2x the unsealed one).
        if name != "PostgreSQL" {
            let sealed_url = restore_url.replace("restore.", "sealed.");
            let key = Some(StoreKey::generate().unwrap());
            restores(
                &format!("{name} sealed"),
                &sealed_url,
                &args,
                &mut jsonl,
                key,
            )
            .await;
        }
    }
}
