//! The Responses-API stand-in as a process, for tests written in other languages (the
//! Python SDK tests under `tests/python/`).
//!
//! ```text
//! responses_stand_in [--codex-home DIR]... [--log FILE]
//! ```
//!
//! Prints one JSON line `{"base_url": "http://127.0.0.1:<port>/v1"}` on stdout once it
//! listens; writes the offline `config.toml` into each `--codex-home` directory (creating it);
//! appends one JSON line per model request to `--log` (`{"conversation": [{"role", "text"},
//! ...]}`, the conversation the model saw); and runs until its stdin closes.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

use rethread_testkit::real::write_offline_config;
use rethread_testkit::responses::ResponsesStandIn;

fn main() -> Result<(), String> {
    let mut homes = Vec::new();
    let mut log: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--codex-home" => homes.push(PathBuf::from(args.next().ok_or("--codex-home DIR")?)),
            "--log" => log = Some(PathBuf::from(args.next().ok_or("--log FILE")?)),
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    let server = ResponsesStandIn::start().map_err(|e| format!("cannot listen: {e}"))?;
    for home in &homes {
        write_offline_config(home, &server.base_url())
            .map_err(|e| format!("cannot write {}: {e}", home.display()))?;
    }
    println!("{}", serde_json::json!({"base_url": server.base_url()}));
    std::io::stdout().flush().map_err(|e| e.to_string())?;

    // Runs until stdin closes (the test that started it ends), logging model requests.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        for _ in std::io::stdin().lock().lines() {}
        let _ = done_tx.send(());
    });
    let mut logged = 0;
    loop {
        let requests = server.model_requests();
        if let Some(path) = &log {
            if requests.len() > logged {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                for request in &requests[logged..] {
                    let line = serde_json::json!({"conversation": request.conversation()});
                    writeln!(file, "{line}").map_err(|e| e.to_string())?;
                }
                logged = requests.len();
            }
        }
        if done_rx.recv_timeout(Duration::from_millis(20)).is_ok() {
            return Ok(());
        }
    }
}
