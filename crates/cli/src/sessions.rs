//! `rethread sessions list | show [--rows] | forget`.

use crate::output::{out, outln};
use std::sync::Arc;

use comfy_table::{Cell, CellAlignment, ColumnConstraint, Width};
use rethread_store::{redact_url, BindingStore, SessionRecord};
use serde_json::{json, Value};

use crate::output::{self, for_people};
use crate::CliResult;

fn to_json(record: &SessionRecord) -> Value {
    let binding = record.binding();
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
        "last_fallback": last_fallback(record),
    })
}

/// The session's last fallback: the thread lost, why, when, and whether its notice is still
/// owed (`pending`); `null` when the session never fell back since its binding was made. The
/// way for a client whose SDK shows no notice (the Python SDK) to learn of it.
fn last_fallback(record: &SessionRecord) -> Value {
    if let Some(given_up) = record.given_up() {
        return json!({
            "thread_id": given_up.thread_id,
            "reason": given_up.reason,
            "at_ms": given_up.at_ms,
            "pending": !given_up.notice_delivered,
        });
    }
    match record.binding().and_then(|b| b.fell_back_from.as_ref()) {
        Some(from) => json!({
            "thread_id": from.thread_id,
            "reason": from.reason,
            "at_ms": from.at_ms,
            "pending": false,
        }),
        None => Value::Null,
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn format_ms(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(at) => at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

/// Which sessions `sessions list` prints.
#[derive(Debug, Clone, Default)]
pub(crate) struct Paging {
    /// At most this many (`None`: all, still read page by page).
    pub(crate) limit: Option<usize>,
    /// Only sessions whose id sorts after this one.
    pub(crate) after: Option<String>,
}

/// How many sessions one store call lists when no `--limit` bounds the listing.
const PAGE: usize = 256;

/// Lists sessions page by page and prints each page as it comes: memory does not grow with the
/// store. With a limit, one page; when more may follow, a hint on stderr names the next
/// `--after` (in JSON: `next_after`), on the store `url` given.
pub(crate) async fn list(
    store: Arc<dyn BindingStore>,
    url: Option<&str>,
    json: bool,
    paging: Paging,
) -> CliResult {
    let mut after = paging.after;
    let mut printed = 0usize;
    // The column widths so far: a page's table is never narrower than the pages before it.
    let mut widths: Vec<u16> = Vec::new();
    if json {
        out!("{{\"sessions\":[");
    }
    let next_after = loop {
        let want = paging
            .limit
            .map_or(PAGE, |limit| (limit - printed).min(PAGE));
        let page = store.list_sessions(after.as_deref(), want).await?;
        if json {
            for record in &page.sessions {
                let comma = if printed == 0 { "" } else { "," };
                out!("{comma}{}", to_json(record));
                printed += 1;
            }
        } else if !page.sessions.is_empty() {
            print_page(&page.sessions, printed == 0, &mut widths);
            printed += page.sessions.len();
        }
        match page.next_after {
            Some(next) if paging.limit.is_some_and(|limit| printed >= limit) => break Some(next),
            Some(next) => after = Some(next),
            None => break None,
        }
    };
    if json {
        outln!("],\"next_after\":{}}}", json!(next_after));
        return Ok(());
    }
    if printed == 0 {
        outln!("no sessions");
    }
    if let Some(next) = next_after {
        let limit = paging.limit.unwrap_or(PAGE);
        eprintln!(
            "more sessions may follow: rethread sessions list{} --limit {limit} --after {}",
            store_words(url),
            for_people(&shell_word(&next))
        );
    }
    Ok(())
}

/// One page of `sessions list` as a table (with the header when it is the first), its columns
/// at least `widths` wide; `widths` becomes this page's.
fn print_page(records: &[SessionRecord], first: bool, widths: &mut Vec<u16>) {
    let mut table = output::table();
    if first {
        table.set_header(["SESSION", "THREAD", "ROWS", "BOUND AT"]);
    }
    for record in records {
        let (thread, bound) = match record.binding() {
            Some(b) => (
                for_people(&b.thread_id).into_owned(),
                format_ms(b.bound_at_ms),
            ),
            None => ("-".to_string(), "-".to_string()),
        };
        table.add_row([
            Cell::new(for_people(&record.session_id)),
            Cell::new(thread),
            Cell::new(record.row_count).set_alignment(CellAlignment::Right),
            Cell::new(bound),
        ]);
    }
    print_keeping(&mut table, widths);
}

/// ` --store URL` for a hint's command when a store was given (`--store` or `RETHREAD_STORE`),
/// so that the pasted hint reads that store rather than the default; never with its password.
fn store_words(url: Option<&str>) -> String {
    url.map(|url| format!(" --store {}", for_people(&shell_word(&redact_url(url)))))
        .unwrap_or_default()
}

/// `word` as one shell word: as is when it is plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@+=,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

pub(crate) async fn show(store: Arc<dyn BindingStore>, id: &str, json: bool) -> CliResult {
    let record = store
        .session(id)
        .await?
        .ok_or_else(|| format!("no session {id}"))?;
    if json {
        outln!("{}", to_json(&record));
        return Ok(());
    }
    outln!("session:         {}", for_people(&record.session_id));
    match record.binding() {
        Some(b) => {
            outln!("thread:          {}", for_people(&b.thread_id));
            outln!("bound at:        {}", format_ms(b.bound_at_ms));
            outln!(
                "codex home:      {}",
                for_people(b.codex_home.as_deref().unwrap_or("(not recorded)"))
            );
        }
        None => outln!("thread:          (none)"),
    }
    outln!("rows:            {}", record.row_count);
    let retired = if record.retired_threads.is_empty() {
        "(none)".to_string()
    } else {
        record.retired_threads.join(", ")
    };
    outln!("retired threads: {}", for_people(&retired));
    outln!("created:         {}", format_ms(record.created_at_ms));
    outln!("updated:         {}", format_ms(record.updated_at_ms));
    Ok(())
}

/// Which rows `sessions show --rows` prints.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RowPaging {
    /// At most this many (`None`: all, still read page by page).
    pub(crate) limit: Option<u64>,
    /// Only rows after this `seq`.
    pub(crate) after: Option<u64>,
}

/// Prints the transcript of `id` page by page, as `sessions list` pages sessions: memory does
/// not grow with the transcript. For people a table of `SEQ`, `ROLE` and `TEXT` (escaped; a
/// row without a role or text, as a host may write, shows its JSON); with `json` one object
/// whose `rows` are the rows as stored. With a limit, when more may follow, a hint on stderr
/// names the next `--after` (in JSON: `next_after`), on the store `url` given.
pub(crate) async fn show_rows(
    store: Arc<dyn BindingStore>,
    url: Option<&str>,
    id: &str,
    json: bool,
    paging: RowPaging,
) -> CliResult {
    let record = store
        .session(id)
        .await?
        .ok_or_else(|| format!("no session {id}"))?;
    let mut next = paging.after.map_or(0, |after| after.saturating_add(1));
    let end = match paging.limit {
        Some(limit) => record.row_count.min(next.saturating_add(limit)),
        None => record.row_count,
    };
    let mut widths: Vec<u16> = Vec::new();
    let mut printed = 0usize;
    if json {
        out!("{{\"session\":{},\"rows\":[", json!(id));
    }
    while next < end {
        let rows = store.rows(id, next..end.min(next + PAGE as u64)).await?;
        let Some(last) = rows.last().map(|r| r.seq) else {
            break;
        };
        if json {
            for row in &rows {
                let comma = if printed == 0 { "" } else { "," };
                out!("{comma}{}", json!({"seq": row.seq, "row": row.body}));
                printed += 1;
            }
        } else {
            print_rows(&rows, printed == 0, &mut widths);
            printed += rows.len();
        }
        next = last + 1;
    }
    let next_after = (next < record.row_count && next > 0).then(|| next - 1);
    if json {
        outln!("],\"next_after\":{}}}", json!(next_after));
        return Ok(());
    }
    if printed == 0 {
        outln!("no rows");
    }
    if let (Some(after), Some(limit)) = (next_after, paging.limit) {
        eprintln!(
            "more rows may follow: rethread sessions show {} --rows{} --limit {limit} --after \
             {after}",
            for_people(&shell_word(id)),
            store_words(url)
        );
    }
    Ok(())
}

/// One page of a transcript as a table (with the header when it is the first), its columns at
/// least `widths` wide; `widths` becomes this page's.
fn print_rows(rows: &[rethread_store::TranscriptRow], first: bool, widths: &mut Vec<u16>) {
    let mut table = output::table();
    if first {
        table.set_header(["SEQ", "ROLE", "TEXT"]);
    }
    for row in rows {
        let role = row.body.get("role").and_then(Value::as_str).unwrap_or("-");
        let text = ["text", "summary"]
            .iter()
            .find_map(|key| row.body.get(*key).and_then(Value::as_str))
            .map_or_else(|| row.body.to_string(), str::to_string);
        table.add_row([
            Cell::new(row.seq).set_alignment(CellAlignment::Right),
            Cell::new(for_people(role)),
            Cell::new(for_people(&text)),
        ]);
    }
    print_keeping(&mut table, widths);
}

/// Prints `table` with its columns at least `widths` wide, and widens `widths` to its own.
fn print_keeping(table: &mut comfy_table::Table, widths: &mut Vec<u16>) {
    table.set_constraints(
        widths
            .iter()
            .map(|w| ColumnConstraint::LowerBoundary(Width::Fixed(w + output::COLUMN_GAP))),
    );
    let page_widths = table.column_max_content_widths();
    widths.resize(page_widths.len(), 0);
    for (width, page) in widths.iter_mut().zip(page_widths) {
        *width = (*width).max(page);
    }
    output::print_table(table);
}

pub(crate) async fn forget(store: Arc<dyn BindingStore>, id: &str, json: bool) -> CliResult {
    if store.delete_session(id).await? {
        if json {
            outln!("{}", json!({ "forgot": id }));
        } else {
            outln!("forgot session {}", for_people(id));
        }
        Ok(())
    } else {
        Err(format!("no session {id}").into())
    }
}

#[cfg(test)]
mod tests {
    use super::{format_ms, shell_word, store_words};

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word("session-1"), "session-1");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn a_hints_store_is_one_shell_word_without_its_password() {
        assert_eq!(store_words(None), "");
        assert_eq!(
            store_words(Some("sqlite:/tmp/s.db")),
            " --store sqlite:/tmp/s.db"
        );
        assert_eq!(
            store_words(Some("postgres://alice:s3cret@db/app")),
            " --store 'postgres://alice:***@db/app'"
        );
        assert_eq!(
            store_words(Some("sqlite:/tmp/my store")),
            " --store 'sqlite:/tmp/my store'"
        );
    }

    #[test]
    fn formats_epoch_milliseconds_as_utc() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_ms(1_798_675_200_000), "2026-12-31 00:00:00 UTC");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
