//! Throughput of the in-process fake: sequential request/response round trips through the
//! duplex pipe on a single-threaded tokio runtime (client and server share one core).
//!
//! `cargo xtask bench fake [--seconds S]` runs this in release mode. Each round trip is a
//! full JSON-RPC exchange: the client serializes a request line, the fake decodes it, answers
//! (a `thread/read` of a loaded thread, or a `thread/list` over a small store), and the client
//! parses the response line.

use std::time::{Duration, Instant};

use rethread_fake_appserver::FakeAppServer;
use rethread_testkit::real::WirePeer;
use serde_json::json;

fn main() {
    let mut seconds = 2.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds S")
            }
            other => panic!("unexpected argument `{other}`"),
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (stream, _handle) = FakeAppServer::builder().spawn_in_process().unwrap();
        let (read, write) = tokio::io::split(stream);
        let mut peer = WirePeer::new(read, write);
        peer.initialize(false).await.unwrap();
        let mut ids = Vec::new();
        for i in 0..4 {
            let started = peer.request("thread/start", Some(json!({"cwd": "/tmp"}))).await.unwrap();
            let id = started["result"]["thread"]["id"].as_str().unwrap().to_string();
            peer.run_turn(&id, &format!("turn {i}"), None).await.unwrap();
            ids.push(id);
        }
        println!("fake app-server, in-process duplex, current-thread runtime (one core)");
        for (label, method, params) in [
            ("thread/read (loaded thread, includeTurns)", "thread/read", json!({"threadId": ids[0], "includeTurns": true})),
            ("thread/read (loaded thread)", "thread/read", json!({"threadId": ids[0]})),
            ("thread/list (4 threads, reads 4 rollouts)", "thread/list", json!({})),
        ] {
            // Warm up, then measure for the given time.
            for _ in 0..1000 {
                peer.request(method, Some(params.clone())).await.unwrap();
            }
            peer.log.clear();
            peer.sent.clear();
            peer.drain_queued();
            let budget = Duration::from_secs_f64(seconds);
            let cpu_start = thread_cpu_ns();
            let start = Instant::now();
            let mut count = 0u64;
            while start.elapsed() < budget {
                for _ in 0..256 {
                    let response = peer.request(method, Some(params.clone())).await.unwrap();
                    assert!(response.get("result").is_some(), "{response}");
                }
                count += 256;
                // The peer keeps a log of everything; do not let it grow without bound.
                peer.log.clear();
                peer.sent.clear();
                peer.drain_queued();
            }
            let elapsed = start.elapsed().as_secs_f64();
            let cpu = match (cpu_start, thread_cpu_ns()) {
                (Some(a), Some(b)) => format!("{:>9.0} per CPU-second", count as f64 / ((b - a) as f64 / 1e9)),
                _ => "CPU time unavailable".to_string(),
            };
            println!(
                "{label:<44} {:>9.0} requests/s wall, {cpu}  ({count} round trips in {elapsed:.2} s)",
                count as f64 / elapsed,
            );
        }
    });
}

/// Nanoseconds this thread has spent on a CPU (Linux `schedstat`), so the figure is per core
/// even when other processes compete for it.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}
