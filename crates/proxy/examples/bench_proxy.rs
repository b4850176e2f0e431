//! `cargo xtask bench proxy`: what `rethread app-server` adds in front of codex.
//!
//! ```text
//! bench_proxy --rethread PATH --fake PATH [--rounds N] [--turns N] [--large-kib K]
//! ```
//!
//! Three processes are driven the same way over pipes, in alternating blocks so that noise
//! from the rest of the machine falls on all: `fake-codex app-server` directly,
//! `rethread --codex-bin fake-codex app-server` (the pass-through), and the same with a
//! session (`--session bench --store redb:<temp>`: the session hooks follow every turn and
//! commit each completed one to the store before `turn/completed` is passed on). Measured per
//! arm:
//! - a request/response round trip (`thread/read` of a loaded thread), p50 and p99;
//! - a turn: `turn/start` sent until `turn/completed` read (the whole notification stream);
//! - a turn whose input is `--large-kib` KiB, so that several lines of that size cross the
//!   proxy both ways.
//!
//! Then, in process, the forwarder against two floors on the same large lines:
//! `tokio::io::copy` (bytes moved from one pipe to another, one copy in and one out, no
//! framing) and a bare line relay (split at newlines without a copy, write each line: what
//! any line-based relay must do at least). A forwarder that copied or re-serialised lines
//! would fall well behind the bare relay.
//!
//! The client is deliberately raw (lines written pre-serialized, answers found by their id
//! prefix) so that it costs the same on both arms and little on either.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rethread_proxy::{forward, ProxyOptions, SessionHooks};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_util::codec::{Decoder, FramedRead};

struct Args {
    rethread: PathBuf,
    fake: PathBuf,
    rounds: usize,
    turns: usize,
    large_kib: usize,
    skip_processes: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        rethread: PathBuf::new(),
        fake: PathBuf::new(),
        rounds: 4000,
        turns: 200,
        large_kib: 1024,
        skip_processes: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--rethread" => args.rethread = PathBuf::from(value()?),
            "--fake" => args.fake = PathBuf::from(value()?),
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("{e}"))?,
            "--turns" => args.turns = value()?.parse().map_err(|e| format!("{e}"))?,
            "--large-kib" => args.large_kib = value()?.parse().map_err(|e| format!("{e}"))?,
            "--in-process-only" => args.skip_processes = true,
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    if !args.rethread.is_file() || !args.fake.is_file() {
        return Err("usage: bench_proxy --rethread PATH --fake PATH [--rounds N] [--turns N] [--large-kib K]".into());
    }
    Ok(args)
}

/// One app-server process and a raw line client.
struct Peer {
    _child: Child,
    _home: tempfile::TempDir,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: String,
    next_id: u64,
    thread: String,
    /// A thread with one small turn, read by the round trips.
    read_thread: String,
}

impl Peer {
    async fn spawn(program: &PathBuf, pre: &[&str]) -> Peer {
        let home = tempfile::tempdir().unwrap();
        let mut child = Command::new(program)
            .args(pre)
            .arg("app-server")
            .env("CODEX_HOME", home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut peer = Peer {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::with_capacity(1 << 20, child.stdout.take().unwrap()),
            _child: child,
            _home: home,
            line: String::new(),
            next_id: 0,
            thread: String::new(),
            read_thread: String::new(),
        };
        peer.call(
            "initialize",
            r#"{"clientInfo":{"name":"bench","version":"0"}}"#,
        )
        .await;
        peer.send(b"{\"method\":\"initialized\"}\n").await;
        peer.new_thread().await;
        peer.turn("warm up").await;
        peer.read_thread = peer.thread.clone();
        peer
    }

    /// Starts a thread and makes it the one turns run on (the fake's model reads the whole
    /// conversation, so a long one would slow later turns of both arms alike).
    async fn new_thread(&mut self) {
        let started = self.call("thread/start", r#"{"cwd":"/tmp"}"#).await;
        let value: serde_json::Value = serde_json::from_str(&started).unwrap();
        self.thread = value["result"]["thread"]["id"]
            .as_str()
            .unwrap()
            .to_string();
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Reads lines until one satisfies `done`; returns it.
    async fn read_until(&mut self, done: impl Fn(&str) -> bool) -> String {
        loop {
            self.line.clear();
            let n = self.stdout.read_line(&mut self.line).await.unwrap();
            assert!(n > 0, "the app-server closed its output");
            if done(&self.line) {
                return std::mem::take(&mut self.line);
            }
        }
    }

    async fn call(&mut self, method: &str, params: &str) -> String {
        self.next_id += 1;
        let id = self.next_id;
        let request = format!("{{\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}\n");
        self.send(request.as_bytes()).await;
        let prefix = format!("{{\"id\":{id},");
        self.read_until(|line| line.starts_with(&prefix)).await
    }

    /// One `thread/read` round trip.
    async fn round_trip(&mut self) -> Duration {
        let params = format!("{{\"threadId\":\"{}\"}}", self.read_thread);
        let start = Instant::now();
        self.call("thread/read", &params).await;
        start.elapsed()
    }

    /// One turn: `turn/start` sent until `turn/completed` read.
    async fn turn(&mut self, text: &str) -> Duration {
        let params = serde_json::json!({
            "threadId": self.thread,
            "input": [{"type": "text", "text": text}],
        })
        .to_string();
        let start = Instant::now();
        self.call("turn/start", &params).await;
        self.read_until(|line| line.starts_with("{\"method\":\"turn/completed\""))
            .await;
        start.elapsed()
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn row(what: &str, direct: &mut [Duration], proxied: &mut [Duration], session: &mut [Duration]) {
    let (d50, d99) = (percentile(direct, 0.5), percentile(direct, 0.99));
    let (p50, p99) = (percentile(proxied, 0.5), percentile(proxied, 0.99));
    let (s50, s99) = (percentile(session, 0.5), percentile(session, 0.99));
    println!(
        "| {what} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        direct.len(),
        ms(d50),
        ms(p50),
        ms(s50),
        ms(p50.saturating_sub(d50)),
        ms(s50.saturating_sub(d50)),
        ms(d99),
        ms(p99),
        ms(s99),
    );
}

#[derive(Debug)]
struct Transparent;

impl SessionHooks for Transparent {}

/// Moves `count` lines of `size` bytes from a producer to a consumer through `relay`, which is
/// given the reading end of the producer's pipe and the writing end of the consumer's pipe;
/// returns the time from the first byte written to the last byte read.
async fn relay_time<F, Fut>(count: usize, size: usize, relay: F) -> Duration
where
    F: FnOnce(tokio::io::DuplexStream, tokio::io::DuplexStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut line = String::from(r#"{"method":"item/completed","params":{"text":""#);
    line.push_str(&"x".repeat(size));
    line.push_str("\"}}\n");
    let (mut producer, relay_in) = tokio::io::duplex(256 * 1024);
    let (relay_out, mut consumer) = tokio::io::duplex(256 * 1024);
    let relayed = tokio::spawn(relay(relay_in, relay_out));
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        for _ in 0..count {
            producer.write_all(line.as_bytes()).await.unwrap();
        }
        producer.shutdown().await.unwrap();
        producer
    });
    let mut total = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = tokio::io::AsyncReadExt::read(&mut consumer, &mut buf)
            .await
            .unwrap();
        if n == 0 {
            break;
        }
        total += n;
    }
    let elapsed = start.elapsed();
    let _ = writer.await;
    let _ = relayed.await;
    assert!(total >= count * size);
    elapsed
}

/// The least a line relay does: split at newlines (no copy), write each line.
#[derive(Debug, Default)]
struct NewlineSplitter {
    scanned: usize,
}

impl Decoder for NewlineSplitter {
    type Item = bytes::Bytes;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut bytes::BytesMut) -> std::io::Result<Option<bytes::Bytes>> {
        match memchr::memchr(b'\n', &buf[self.scanned..]) {
            Some(offset) => {
                let end = self.scanned + offset + 1;
                self.scanned = 0;
                Ok(Some(buf.split_to(end).freeze()))
            }
            None => {
                self.scanned = buf.len();
                Ok(None)
            }
        }
    }
}

async fn in_process(large_kib: usize) {
    let (count, size) = (64, large_kib * 1024);
    println!();
    println!(
        "In process, {count} lines of {large_kib} KiB from a producer pipe to a consumer pipe \
         (5 runs each, best):"
    );
    println!();
    println!("| relay | MiB/s |");
    println!("|---|---:|");
    let mut best_copy = Duration::MAX;
    let mut best_lines = Duration::MAX;
    let mut best_forward = Duration::MAX;
    for _ in 0..5 {
        let lines = relay_time(count, size, |from, mut to| async move {
            let mut lines = FramedRead::new(from, NewlineSplitter::default());
            while let Some(Ok(line)) = lines.next().await {
                to.write_all(&line).await.unwrap();
            }
            to.shutdown().await.unwrap();
        })
        .await;
        best_lines = best_lines.min(lines);
        let copy = relay_time(count, size, |mut from, mut to| async move {
            tokio::io::copy(&mut from, &mut to).await.unwrap();
            to.shutdown().await.unwrap();
        })
        .await;
        best_copy = best_copy.min(copy);
        let forwarded = relay_time(count, size, |from, to| async move {
            // codex -> client direction: the producer plays codex, the consumer the client.
            let (idle_client_in, _keep) = tokio::io::duplex(64);
            let mut options = ProxyOptions::default();
            options.max_line_length = 64 * 1024 * 1024;
            let _ = forward(
                &Transparent,
                &options,
                idle_client_in,
                to,
                from,
                tokio::io::sink(),
                std::future::pending(),
            )
            .await;
        })
        .await;
        best_forward = best_forward.min(forwarded);
    }
    let mib = (count * size) as f64 / (1024.0 * 1024.0);
    println!(
        "| `tokio::io::copy` (the floor) | {:.0} |",
        mib / best_copy.as_secs_f64()
    );
    println!(
        "| a bare line relay (split at newlines, write each line) | {:.0} |",
        mib / best_lines.as_secs_f64()
    );
    println!(
        "| `rethread_proxy::forward` | {:.0} |",
        mib / best_forward.as_secs_f64()
    );
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        if args.skip_processes {
            return in_process(args.large_kib).await;
        }
        let codex_bin = args.fake.to_str().unwrap().to_string();
        let store_dir = tempfile::tempdir().unwrap();
        let store = format!("redb:{}", store_dir.path().join("bench.redb").display());
        let mut direct = Peer::spawn(&args.fake, &[]).await;
        let mut proxied = Peer::spawn(&args.rethread, &["--codex-bin", &codex_bin]).await;
        let mut session = Peer::spawn(
            &args.rethread,
            &[
                "--codex-bin",
                &codex_bin,
                "--store",
                &store,
                "--session",
                "bench",
            ],
        )
        .await;
        let blocks = 10;
        let mut rt = [Vec::new(), Vec::new(), Vec::new()];
        let mut turns = [Vec::new(), Vec::new(), Vec::new()];
        let mut large_turns = [Vec::new(), Vec::new(), Vec::new()];
        let large = "y".repeat(args.large_kib * 1024);
        let large_count = (args.turns / 10).max(5);
        for _ in 0..blocks {
            for (arm, peer) in [&mut direct, &mut proxied, &mut session]
                .into_iter()
                .enumerate()
            {
                for _ in 0..args.rounds / blocks {
                    rt[arm].push(peer.round_trip().await);
                }
            }
            for (arm, peer) in [&mut direct, &mut proxied, &mut session]
                .into_iter()
                .enumerate()
            {
                peer.new_thread().await;
                for _ in 0..args.turns / blocks {
                    turns[arm].push(peer.turn("hello").await);
                }
            }
            for _ in 0..large_count / blocks.min(large_count) {
                for (arm, peer) in [&mut direct, &mut proxied, &mut session]
                    .into_iter()
                    .enumerate()
                {
                    peer.new_thread().await;
                    large_turns[arm].push(peer.turn(&large).await);
                }
            }
        }
        println!(
            "`fake-codex app-server` directly vs through `rethread app-server`, without and with \
             a session (ms):"
        );
        println!();
        println!(
            "| measurement | samples | direct p50 | proxy p50 | session p50 | added p50 (proxy) | \
             added p50 (session) | direct p99 | proxy p99 | session p99 |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let [a, b, c] = &mut rt;
        row("`thread/read` round trip", a, b, c);
        let [a, b, c] = &mut turns;
        row("turn, `turn/start` to `turn/completed`", a, b, c);
        let [a, b, c] = &mut large_turns;
        row(
            &format!("turn with a {} KiB input", args.large_kib),
            a,
            b,
            c,
        );
        in_process(args.large_kib).await;
    });
    Ok(())
}
