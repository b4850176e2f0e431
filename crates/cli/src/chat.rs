//! `rethread chat`: one turn, resumed across invocations.

use std::path::Path;
use std::sync::Arc;

use rethread_runtime::{
    Agent, AgentOptions, AppServerClient, CodexCommand, OpenOutcome, StatusKind, StatusRail,
};
use rethread_store::BindingStore;
use serde_json::json;

use crate::{output, CliResult};

pub(crate) async fn run(
    store: Arc<dyn BindingStore>,
    codex: &Path,
    session: &str,
    message: &str,
    json: bool,
) -> CliResult {
    let (rail, recorded) = StatusRail::recording();
    let client = AppServerClient::builder()
        .rail(rail.clone())
        .spawn(&CodexCommand::new(codex))
        .await?;
    let mut agent = Agent::new(session, store, rail).with_options(AgentOptions::default());
    let result = async {
        // A session whose lease another host holds fails here with `SessionBusy`, whose
        // one-line message names the holder (host, pid, since).
        let mut codex_session = agent.open(&client).await?;
        let report = codex_session.run_turn(message).await;
        let outcome = codex_session.outcome().clone();
        // Release the session lease now rather than leave it to expire after this process.
        let closed = codex_session.close().await;
        let report = report?;
        closed?;
        Ok::<_, rethread_runtime::RuntimeError>((outcome, report))
    }
    .await;
    client.shutdown().await;
    rethread_runtime::flush_lease_releases().await;
    let events = recorded.take();
    let notices: Vec<String> = events
        .iter()
        .filter(|e| e.kind == StatusKind::Lifecycle)
        .map(|e| e.message.clone())
        .collect();
    if !json {
        for event in &events {
            match event.kind {
                StatusKind::Lifecycle => output::notice(&event.message),
                StatusKind::Warn => output::warning(&event.message),
                _ => {}
            }
        }
    }
    let (outcome, report) = result?;
    if json {
        let mut object = json!({
            "session": session,
            "thread_id": report.thread_id,
            "outcome": outcome.as_str(),
            "notices": notices,
            "reply": report.reply,
        });
        if let OpenOutcome::FellBack { reason, .. } = &outcome {
            object["reason"] = json!(reason.as_str());
        }
        println!("{object}");
    } else {
        println!("{}", report.reply);
    }
    Ok(())
}
