//! `rethread doctor`: probe each binding without resuming it ([`probe_thread`]: `thread/read`
//! only, classified by the same rule as a failed resume).

use std::path::Path;
use std::sync::Arc;

use rethread_runtime::{probe_thread, AppServerClient, CodexCommand, StatusRail, ThreadHealth};
use rethread_store::{BindingStore, BindingStoreExt};
use serde_json::json;

use crate::{output, CliResult};

pub(crate) async fn run(store: Arc<dyn BindingStore>, codex: &Path, json: bool) -> CliResult {
    let bound: Vec<_> = store
        .all_sessions()
        .await?
        .into_iter()
        .filter_map(|s| s.binding.map(|b| (s.session_id, b)))
        .collect();
    let client = AppServerClient::builder()
        .rail(StatusRail::tracing())
        .spawn(&CodexCommand::new(codex))
        .await?;
    let bar = output::progress(bound.len() as u64, "probing");
    let mut results = Vec::new();
    for (session, binding) in &bound {
        let probe = probe_thread(&client, &binding.thread_id).await?;
        results.push((session, binding, probe.health, probe.detail));
        bar.inc(1);
    }
    bar.finish_and_clear();
    client.shutdown().await;
    let count = |h: ThreadHealth| results.iter().filter(|r| r.2 == h).count();
    let all = ThreadHealth::ALL;
    if json {
        let bindings: Vec<_> = results
            .iter()
            .map(|(session, binding, health, detail)| {
                json!({"session": session, "thread_id": binding.thread_id, "codex_home": binding.codex_home,
                       "status": health.as_str(), "detail": detail})
            })
            .collect();
        let summary: serde_json::Map<_, _> = all
            .iter()
            .map(|h| (h.as_str().to_string(), json!(count(*h))))
            .collect();
        println!(
            "{}",
            json!({"bindings": bindings, "total": results.len(), "summary": summary})
        );
        return Ok(());
    }
    for (session, binding, health, detail) in &results {
        let status = match health {
            ThreadHealth::Live => output::paint("32", health.as_str()),
            _ => output::paint("31", health.as_str()),
        };
        println!(
            "{session:<24} {:<38} {status:<12} {detail}",
            binding.thread_id
        );
    }
    let parts: Vec<String> = all
        .iter()
        .filter(|h| count(**h) > 0)
        .map(|h| format!("{} {}", count(*h), h.as_str()))
        .collect();
    let parts = if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    };
    println!("{} binding(s){parts}", results.len());
    Ok(())
}
