//! Writes the seed corpora of every target under `fuzz/corpus/<target>/`, from real traffic:
//! the lines the fake app-server (and the real codex, when installed) sends during turns,
//! the requests the runtime sends, and the files the store backends write.
//!
//! Run by `cargo xtask fuzz` (or by hand: `cargo run --manifest-path fuzz/Cargo.toml --bin
//! seed-corpus -- [CORPUS_DIR]`).

use std::path::{Path, PathBuf};

use rethread_fake_appserver::{FakeAppServer, Profile};
use rethread_runtime::{AppServerClient, SessionBinder, StatusRail};
use rethread_store::BindingStore;
use rethread_testkit::fuzz::input::Encoder;
use rethread_testkit::fuzz::{runtime_hostile, store_files};
use rethread_testkit::real::{codex_or_skip, AppServerProcess, CodexHome, WirePeer};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;
use serde_json::{json, Value};

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("corpus dir");
    std::fs::write(dir.join(name), bytes).expect("write seed");
}

/// The lines a server sends during: handshake, thread/start, a turn, read, list, an unknown
/// resume, and a resume after a restart.
async fn fake_traffic(profile: Profile) -> Vec<Value> {
    let (stream, handle) = FakeAppServer::builder()
        .profile(profile)
        .spawn_in_process()
        .expect("fake");
    let (read, write) = tokio::io::split(stream);
    let mut peer = WirePeer::new(read, write);
    peer.initialize(true).await.expect("initialize");
    let started = peer
        .request("thread/start", Some(json!({"cwd": "/tmp"})))
        .await
        .expect("thread/start");
    let id = started["result"]["thread"]["id"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let _ = peer.run_turn(&id, "remember zebra", None).await;
    let _ = peer
        .request(
            "thread/read",
            Some(json!({"threadId": id, "includeTurns": true})),
        )
        .await;
    let _ = peer.request("thread/list", Some(json!({}))).await;
    let _ = peer
        .request(
            "thread/resume",
            Some(json!({"threadId": "0199a213-81c0-7800-8aa1-bbab2a035a53"})),
        )
        .await;
    let mut log = peer.log.clone();
    let (read, write) = tokio::io::split(handle.restart().await.expect("restart"));
    let mut peer = WirePeer::new(read, write);
    peer.initialize(true).await.expect("initialize");
    let _ = peer
        .request(
            "thread/resume",
            Some(json!({"threadId": id, "excludeTurns": true})),
        )
        .await;
    let _ = peer.run_turn(&id, "what did I say?", None).await;
    log.extend(peer.log.clone());
    log
}

/// The same from the real codex, when the pinned binary is installed.
async fn real_traffic() -> Vec<Value> {
    let Some(codex) = codex_or_skip(CURRENT) else {
        eprintln!("seed-corpus: real codex {CURRENT} not installed; fake traffic only");
        return Vec::new();
    };
    let Ok(model) = ResponsesStandIn::start() else {
        return Vec::new();
    };
    let Ok(home) = CodexHome::new(&model) else {
        return Vec::new();
    };
    let Ok(mut server) = AppServerProcess::spawn(&codex, home.path()).await else {
        return Vec::new();
    };
    if server.peer.initialize(true).await.is_err() {
        return Vec::new();
    }
    if let Ok(started) = server
        .peer
        .request("thread/start", Some(json!({"cwd": "/tmp"})))
        .await
    {
        let id = started["result"]["thread"]["id"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let _ = server.peer.run_turn(&id, "remember zebra", None).await;
        let _ = server
            .peer
            .request(
                "thread/resume",
                Some(json!({"threadId": "0199a213-81c0-7800-8aa1-bbab2a035a53"})),
            )
            .await;
    }
    let log = server.peer.log.clone();
    let _ = server.shutdown(std::time::Duration::from_secs(5)).await;
    log
}

/// The requests the runtime sends while an agent resumes and runs turns on the fake.
async fn runtime_requests() -> Vec<Value> {
    let (stream, handle) = FakeAppServer::builder().spawn_in_process().expect("fake");
    let (read, write) = tokio::io::split(stream);
    let client = AppServerClient::builder()
        .connect(read, write)
        .await
        .expect("connect");
    let store: BindingStore = BindingStore::memory();
    let mut agent = SessionBinder::new("seed", store.clone(), StatusRail::default());
    if let Ok(mut session) = agent.open(&client).await {
        let _ = session.run_turn("remember zebra").await;
    }
    // The binder frees the session's lease for the next one.
    let _ = agent.close().await;
    // A rebuilt binder resumes the binding.
    let mut agent = SessionBinder::new("seed", store, StatusRail::default());
    if let Ok(mut session) = agent.open(&client).await {
        let _ = session.run_turn("what did I say?").await;
    }
    handle
        .requests()
        .into_iter()
        .map(|r| {
            let mut v = json!({"id": r.id, "method": r.method});
            if let Some(p) = r.params {
                v["params"] = p;
            }
            v
        })
        .collect()
}

fn main() {
    let root = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (server_lines, client_lines) = runtime.block_on(async {
        let mut lines = Vec::new();
        for profile in Profile::ALL {
            lines.extend(fake_traffic(profile).await);
        }
        lines.extend(real_traffic().await);
        (lines, runtime_requests().await)
    });
    let server_text: Vec<String> = server_lines.iter().map(Value::to_string).collect();
    let client_text: Vec<String> = client_lines.iter().map(Value::to_string).collect();

    // framing: each line alone (default limit, whole), and the whole transcript in chunks
    // under small limits.
    let dir = root.join("framing");
    for (i, line) in server_text.iter().chain(&client_text).enumerate() {
        let mut seed = vec![255, 0];
        seed.extend_from_slice(line.as_bytes());
        write(&dir, &format!("line-{i:03}"), &seed);
    }
    let transcript = server_text.join("\n") + "\n";
    for (limit, chunks) in [(255u8, 7u8), (95, 3), (40, 11), (255, 0)] {
        let mut seed = vec![limit, chunks];
        seed.extend_from_slice(transcript.replace("\n", "\r\n").as_bytes());
        if transcript.len() < 64 * 1024 {
            write(&dir, &format!("transcript-{limit}-{chunks}"), &seed);
        }
    }

    // proxy_routing: the traffic's lines (up to 160 bytes) as raw client lines (tag 0), a
    // dozen to an input, under the default limit and a small one.
    let dir = root.join("proxy_routing");
    let short: Vec<&String> = client_text
        .iter()
        .chain(&server_text)
        .filter(|line| line.len() <= 160)
        .collect();
    for (i, group) in short.chunks(12).enumerate() {
        for (limit, name) in [(0u8, "default"), (200, "small")] {
            let mut e = Encoder::default();
            e.byte(limit);
            for line in group {
                e.byte(0).chunk(line.as_bytes(), 160);
            }
            write(&dir, &format!("traffic-{i:03}-{name}"), &e.out);
        }
    }

    // merge_patch: the JSON objects of real traffic as patches (op 2 = raw JSON text).
    let dir = root.join("merge_patch");
    let mut objects: Vec<Value> = Vec::new();
    for v in server_lines.iter().chain(&client_lines) {
        for part in [v.get("params"), v.get("result")].into_iter().flatten() {
            if part.is_object() {
                objects.push(part.clone());
            }
        }
    }
    for (i, chunk) in objects.chunks(3).enumerate() {
        let mut e = Encoder::default();
        e.byte((i % 2) as u8);
        for (j, obj) in chunk.iter().enumerate() {
            let text = obj.to_string();
            if text.len() > 200 {
                continue;
            }
            e.byte((j % 2) as u8).byte(2).chunk(text.as_bytes(), 200);
            // A commit between patches.
            e.byte(0).byte(3).byte((j % 3) as u8).byte(2);
        }
        write(&dir, &format!("traffic-{i:03}"), &e.out);
    }

    // fake_appserver: the runtime's own requests, replayed as raw lines (op 4).
    let dir = root.join("fake_appserver");
    for profile in 0..3u8 {
        let mut e = Encoder::default();
        e.byte(profile).byte(7);
        for line in &client_text {
            if line.len() <= 300 {
                e.byte(4).chunk(line.as_bytes(), 300);
            }
        }
        write(&dir, &format!("runtime-requests-{profile}"), &e.out);
    }

    // runtime_hostile: honest servers, with the agent's reply taken from real traffic.
    let dir = root.join("runtime_hostile");
    let replies: Vec<String> = server_lines
        .iter()
        .filter_map(|v| v.pointer("/params/item/text").and_then(Value::as_str))
        .map(|t| t.chars().take(40).collect())
        .collect();
    let reply = replies
        .first()
        .cloned()
        .unwrap_or_else(|| "echo: hi".to_string());
    let reply = &reply.as_bytes()[..reply.len().min(40)];
    for (bound, gone) in [(false, false), (true, false), (true, true)] {
        write(
            &dir,
            &format!("honest-bound{}-gone{}", bound as u8, gone as u8),
            &runtime_hostile::honest_script(bound, gone, reply),
        );
    }

    // store_files: single flips spread over the files the backends wrote.
    let dir = root.join("store_files");
    for (b, backend) in [store_files::Backend::Redb, store_files::Backend::Sqlite]
        .into_iter()
        .enumerate()
    {
        let len = store_files::pristine_bytes(backend).len();
        let step = (len / 48).max(1);
        for (i, at) in (0..len).step_by(step).enumerate() {
            let mut e = Encoder::default();
            e.byte(b as u8).byte(0).byte(0).u32(at as u32).byte(0x01);
            write(&dir, &format!("flip-{b}-{i:03}"), &e.out);
        }
        let mut e = Encoder::default();
        e.byte(b as u8).byte(3).u32((len / 2) as u32);
        write(&dir, &format!("truncate-{b}"), &e.out);
    }
    println!(
        "seed-corpus: {} server lines, {} client requests -> {}",
        server_lines.len(),
        client_lines.len(),
        root.display()
    );
}
