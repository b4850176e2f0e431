//! `rethread sessions list | show | forget`.

use std::sync::Arc;

use rethread_store::{BindingStore, BindingStoreExt, SessionRecord};
use serde_json::{json, Value};

use crate::CliResult;

fn to_json(record: &SessionRecord) -> Value {
    let binding = record.binding.as_ref();
    json!({
        "session": record.session_id,
        "thread_id": binding.map(|b| b.thread_id.clone()),
        "codex_home": binding.and_then(|b| b.codex_home.clone()),
        "bound_at_ms": binding.map(|b| b.bound_at_ms),
        "row_count": record.row_count,
        "retired_threads": record.retired_threads,
        "created_at_ms": record.created_at_ms,
        "updated_at_ms": record.updated_at_ms,
        "model_config": record.model_config,
    })
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn format_ms(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(at) => at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

pub(crate) async fn list(store: Arc<dyn BindingStore>, json: bool) -> CliResult {
    let sessions = store.all_sessions().await?;
    if json {
        println!("{}", Value::Array(sessions.iter().map(to_json).collect()));
        return Ok(());
    }
    if sessions.is_empty() {
        println!("no sessions");
        return Ok(());
    }
    println!("{:<24} {:<38} {:>6}  BOUND AT", "SESSION", "THREAD", "ROWS");
    for record in &sessions {
        let (thread, bound) = match &record.binding {
            Some(b) => (b.thread_id.as_str(), format_ms(b.bound_at_ms)),
            None => ("-", "-".to_string()),
        };
        println!(
            "{:<24} {:<38} {:>6}  {bound}",
            record.session_id, thread, record.row_count
        );
    }
    Ok(())
}

pub(crate) async fn show(store: Arc<dyn BindingStore>, id: &str, json: bool) -> CliResult {
    let record = store
        .session(id)
        .await?
        .ok_or_else(|| format!("no session {id}"))?;
    if json {
        println!("{}", to_json(&record));
        return Ok(());
    }
    println!("session:         {}", record.session_id);
    match &record.binding {
        Some(b) => {
            println!("thread:          {}", b.thread_id);
            println!("bound at:        {}", format_ms(b.bound_at_ms));
            println!(
                "codex home:      {}",
                b.codex_home.as_deref().unwrap_or("(not recorded)")
            );
        }
        None => println!("thread:          (none)"),
    }
    println!("rows:            {}", record.row_count);
    let retired = if record.retired_threads.is_empty() {
        "(none)".to_string()
    } else {
        record.retired_threads.join(", ")
    };
    println!("retired threads: {retired}");
    println!("created:         {}", format_ms(record.created_at_ms));
    println!("updated:         {}", format_ms(record.updated_at_ms));
    Ok(())
}

pub(crate) async fn forget(store: Arc<dyn BindingStore>, id: &str) -> CliResult {
    if store.delete_session(id).await? {
        println!("forgot session {id}");
        Ok(())
    } else {
        Err(format!("no session {id}").into())
    }
}

#[cfg(test)]
mod tests {
    use super::format_ms;

    #[test]
    fn formats_epoch_milliseconds_as_utc() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_ms(1_798_675_200_000), "2026-12-31 00:00:00 UTC");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
