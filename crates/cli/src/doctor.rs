//! `rethread doctor`: probe each binding without resuming it.
//!
//! A probe is `thread/read` without turns: side-effect free, and it succeeds for a paginated
//! thread even on a codex that cannot resume it. So a thread whose history is not legacy
//! gets one more read with turns, which such a codex refuses the same way it refuses resume
//! (`paginated_threads is not supported yet`): that is how "incompatible" is told from "live"
//! without resuming anything.

use std::path::Path;
use std::sync::Arc;

use rethread_protocol::messages::{ThreadRead, ThreadReadParams};
use rethread_protocol::{classify_resume_error, HistoryMode, ResumeFailure};
use rethread_runtime::{AppServerClient, ClientError, CodexCommand, StatusRail};
use rethread_store::{BindingStore, BindingStoreExt};
use serde_json::json;

use crate::{output, CliResult};

/// What a probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Live,
    Gone,
    Incompatible,
    Unreadable,
    Busy,
    Error,
}

impl Health {
    fn as_str(self) -> &'static str {
        match self {
            Health::Live => "live",
            Health::Gone => "gone",
            Health::Incompatible => "incompatible",
            Health::Unreadable => "unreadable",
            Health::Busy => "busy",
            Health::Error => "error",
        }
    }

    fn from_failure(failure: ResumeFailure) -> Self {
        match failure {
            ResumeFailure::Gone => Health::Gone,
            ResumeFailure::Incompatible => Health::Incompatible,
            ResumeFailure::Unreadable => Health::Unreadable,
            ResumeFailure::Busy => Health::Busy,
            _ => Health::Error,
        }
    }
}

async fn read(
    client: &AppServerClient,
    thread_id: &str,
    include_turns: bool,
) -> Result<HistoryMode, ClientError> {
    let params = ThreadReadParams {
        thread_id: thread_id.to_string(),
        include_turns,
    };
    Ok(client
        .request::<ThreadRead>(&params)
        .await?
        .thread
        .history_mode)
}

async fn probe(client: &AppServerClient, thread_id: &str) -> Result<(Health, String), ClientError> {
    let classify = |error: ClientError| match error.rpc_error() {
        Some(rpc) => Ok((
            Health::from_failure(classify_resume_error(rpc)),
            rpc.message.clone(),
        )),
        None => Err(error),
    };
    let mode = match read(client, thread_id, false).await {
        Ok(mode) => mode,
        Err(error) => return classify(error),
    };
    if mode.is_legacy() {
        return Ok((Health::Live, format!("historyMode {mode}")));
    }
    match read(client, thread_id, true).await {
        Ok(_) => Ok((Health::Live, format!("historyMode {mode}"))),
        Err(error) => classify(error),
    }
}

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
        let (health, detail) = probe(&client, &binding.thread_id).await?;
        results.push((session, binding, health, detail));
        bar.inc(1);
    }
    bar.finish_and_clear();
    client.shutdown().await;
    let count = |h: Health| results.iter().filter(|r| r.2 == h).count();
    let all = [
        Health::Live,
        Health::Gone,
        Health::Incompatible,
        Health::Unreadable,
        Health::Busy,
        Health::Error,
    ];
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
            Health::Live => output::paint("32", health.as_str()),
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
