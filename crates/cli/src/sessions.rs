//! `rethread sessions list | show [--rows] | forget`.

use comfy_table::{Cell, CellAlignment, ColumnConstraint, Width};
use rethread_store::{redact_url, BindingStore, SessionRecord, StoredBytes};
use serde_json::{json, Value};

use crate::output::{self, for_people, out, outln};
use crate::{open_store, Access, CliResult, StoreArg};

mod prune;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum SessionsCommand {
    /// List sessions in session-id order, page by page (the store is never loaded whole).
    List(ListArgs),
    /// Show one session; with `--rows`, its transcript, page by page.
    Show(ShowArgs),
    /// Delete a session, its transcript and its binding.
    Forget {
        #[command(flatten)]
        store: StoreArg,
        /// The session id.
        id: String,
        /// Print one JSON object: `{"forgot": ID}`; on failure
        /// `{"session", "error": {"kind", "message"}}`.
        #[arg(long)]
        json: bool,
    },
    /// Remove every session idle for DURATION (last written that long ago): its record,
    /// transcript, binding, mirror and lease; never one a live host holds.
    Prune(prune::PruneArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Print one JSON object: `{"sessions": [...], "next_after": ID or null}`, each session
    /// as `sessions show --json` prints it.
    #[arg(long)]
    json: bool,
    /// List at most N sessions (default: all); when more may follow, say the next `--after`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit: Option<u32>,
    /// Start after this session id (the `next_after` of the previous page).
    #[arg(long, value_name = "ID")]
    after: Option<String>,
    /// Order: `id` (the default, page by page) or `bytes` (most stored first; reads every
    /// session's size before printing).
    #[arg(long, value_enum, default_value_t = Sort::Id, conflicts_with = "after")]
    sort: Sort,
}

/// The order of `sessions list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Sort {
    /// Session id.
    Id,
    /// Bytes stored, most first.
    Bytes,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    store: StoreArg,
    /// The session id.
    id: String,
    /// Print one JSON object: `session`, `thread_id`, `codex_home`, `bound_at_ms`,
    /// `row_count`, `retired_threads`, `created_at_ms`, `updated_at_ms`, `model_config`,
    /// `last_fallback`, `stored_bytes` (its `row_bytes` plus its `mirror_bytes`). With
    /// `--rows`: `{"session", "rows": [{"seq", "row"}], "next_after"}`, each row as stored.
    /// On failure `{"session", "error": {"kind", "message"}}`.
    #[arg(long)]
    json: bool,
    /// Print the transcript: each row's role and text (escaped), in order.
    #[arg(long)]
    rows: bool,
    /// With `--rows`: at most N rows (default: all); when more may follow, say the next
    /// `--after`.
    #[arg(long, value_name = "N", requires = "rows",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit: Option<u32>,
    /// With `--rows`: start after this row (the `next_after` of the previous page).
    #[arg(long, value_name = "SEQ", requires = "rows")]
    after: Option<u64>,
}

impl SessionsCommand {
    /// Reads each session id given as the record it names: a kept thread's in any spelling
    /// of its id ([`rethread_runtime::kept::record_key`]).
    fn read_ids_as_record_keys(&mut self) {
        use rethread_runtime::kept::record_key;
        match self {
            SessionsCommand::List(args) => args.after = args.after.as_deref().map(record_key),
            SessionsCommand::Show(args) => args.id = record_key(&args.id),
            SessionsCommand::Forget { id, .. } => *id = record_key(id),
            SessionsCommand::Prune(_) => {}
        }
    }

    pub(crate) fn store(&mut self) -> &mut StoreArg {
        match self {
            SessionsCommand::List(ListArgs { store, .. })
            | SessionsCommand::Show(ShowArgs { store, .. })
            | SessionsCommand::Forget { store, .. }
            | SessionsCommand::Prune(prune::PruneArgs { store, .. }) => store,
        }
    }
}

/// Runs `sessions ...` on the store, which it only reads (a missing one is nothing stored
/// yet), or for `forget` changes where it exists, or for `prune` removes from where it exists
/// (a missing one holds nothing to remove): a missing store is not created. A failed `show`
/// or `forget` under `--json` prints `{"session", "error": {"kind", "message"}}`, as `chat
/// --json` does; a failed `prune`, `{"dry_run", "idle_secs", "error"}`.
pub(crate) async fn run(mut command: SessionsCommand) -> CliResult {
    command.read_ids_as_record_keys();
    let json_failure = match &command {
        SessionsCommand::Show(args) if args.json => Some(json!({"session": args.id})),
        SessionsCommand::Forget { id, json: true, .. } => Some(json!({"session": id})),
        SessionsCommand::Prune(args) => args.json_failure(),
        _ => None,
    };
    let result = run_command(command).await;
    if let (Err(error), Some(mut object)) = (&result, json_failure) {
        object["error"] = output::error_json(&**error);
        outln!("{object}");
    }
    result
}

async fn run_command(mut command: SessionsCommand) -> CliResult {
    let url = command.store().url.take();
    let access = match command {
        SessionsCommand::Forget { .. } => Access::Existing,
        SessionsCommand::Prune(_) => Access::Tidy,
        _ => Access::Inspect,
    };
    let store = open_store(url.as_deref(), access).await?;
    let url = url.as_deref();
    match command {
        SessionsCommand::List(args) => list(store, url, args).await,
        SessionsCommand::Show(args) if args.rows => show_rows(store, url, args).await,
        SessionsCommand::Show(args) => show(store, &args.id, args.json).await,
        SessionsCommand::Forget { id, json, .. } => forget(store, &id, json).await,
        SessionsCommand::Prune(args) => prune::run(store, args).await,
    }
}

/// A session as `--json` prints it, with what it holds in the store (`stored_bytes`: its rows'
/// `row_bytes` and its mirror's `mirror_bytes`).
fn to_json((record, bytes): &(SessionRecord, StoredBytes)) -> Value {
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
        "stored_bytes": bytes.total(),
        "row_bytes": bytes.rows,
        "mirror_bytes": bytes.mirror,
    })
}

/// The session's last fallback: the thread lost, why, when, and whether its notice is still
/// owed (`pending`); `null` when the session never fell back since its binding was made. The
/// way for a client whose SDK shows no notice (the Python SDK) to learn of it.
fn last_fallback(record: &SessionRecord) -> Value {
    let fell_back = record.binding().and_then(|b| b.fell_back_from.as_ref());
    let (thread_id, reason, at_ms, pending) = match (record.given_up(), fell_back) {
        (Some(given_up), _) => (
            &given_up.thread_id,
            &given_up.reason,
            given_up.at_ms,
            !given_up.notice_delivered,
        ),
        (None, Some(from)) => (&from.thread_id, &from.reason, from.at_ms, false),
        (None, None) => return Value::Null,
    };
    json!({"thread_id": thread_id, "reason": reason, "at_ms": at_ms, "pending": pending})
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn format_ms(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(at) => at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

/// How many sessions or rows one store call reads.
const PAGE: usize = 256;

/// A listing printed page by page as the pages are read, so that memory does not grow with
/// the store: under `--json` the items of one array, else tables (the first with its header)
/// whose columns never narrow from one page to the next.
struct Listing {
    json: bool,
    printed: usize,
    widths: Vec<u16>,
}

impl Listing {
    /// Under `--json`, prints `opening`, the object up to its array.
    fn start(json: bool, opening: &str) -> Listing {
        if json {
            out!("{opening}");
        }
        let widths = Vec::new();
        Listing {
            json,
            printed: 0,
            widths,
        }
    }

    /// Prints one page: each item as `to_json` gives it, or as a table `row` under `header`.
    fn page<T, const N: usize>(
        &mut self,
        items: &[T],
        header: [&str; N],
        to_json: impl Fn(&T) -> Value,
        row: impl Fn(&T) -> [Cell; N],
    ) {
        if self.json {
            for item in items {
                let comma = if self.printed == 0 { "" } else { "," };
                out!("{comma}{}", to_json(item));
                self.printed += 1;
            }
            return;
        }
        if items.is_empty() {
            return;
        }
        let mut table = output::table();
        if self.printed == 0 {
            table.set_header(header);
        }
        table.add_rows(items.iter().map(row));
        let at_least =
            |w: &u16| ColumnConstraint::LowerBoundary(Width::Fixed(w + output::COLUMN_GAP));
        table.set_constraints(self.widths.iter().map(at_least));
        let page_widths = table.column_max_content_widths();
        self.widths.resize(page_widths.len(), 0);
        for (width, page) in self.widths.iter_mut().zip(page_widths) {
            *width = (*width).max(page);
        }
        output::print_table(&mut table);
        self.printed += items.len();
    }

    /// Ends the listing: under `--json` the object, with `next_after`; else `nothing` when it
    /// was empty, and the `hint` at the next page on stderr.
    fn end(self, next_after: Value, nothing: &str, hint: Option<String>) {
        if self.json {
            outln!("],\"next_after\":{next_after}}}");
            return;
        }
        if self.printed == 0 {
            outln!("{nothing}");
        }
        if let Some(hint) = hint {
            eprintln!("{hint}");
        }
    }
}

/// Lists sessions ([`Listing`]): with a limit, one page; when more may follow, a hint on
/// stderr names the next `--after` (in JSON: `next_after`), on the store `url` given.
async fn list(store: BindingStore, url: Option<&str>, args: ListArgs) -> CliResult {
    let (limit, mut after) = (args.limit.map(|n| n as usize), args.after);
    let mut listing = Listing::start(args.json, "{\"sessions\":[");
    if args.sort == Sort::Bytes {
        let mut all = Vec::new();
        loop {
            let page = store.list_sessions(after.as_deref(), PAGE).await?;
            all.extend(with_bytes(&store, page.sessions).await?);
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        all.sort_by_key(|(_, bytes)| std::cmp::Reverse(bytes.total()));
        all.truncate(limit.unwrap_or(usize::MAX));
        listing.page(&all, HEADER, to_json, row);
        listing.end(Value::Null, "no sessions", None);
        return Ok(());
    }
    let next_after = loop {
        let want = limit.map_or(PAGE, |limit| (limit - listing.printed).min(PAGE));
        let page = store.list_sessions(after.as_deref(), want).await?;
        let sessions = with_bytes(&store, page.sessions).await?;
        listing.page(&sessions, HEADER, to_json, row);
        match page.next_after {
            Some(next) if limit.is_some_and(|limit| listing.printed >= limit) => break Some(next),
            Some(next) => after = Some(next),
            None => break None,
        }
    };
    let hint = next_after.as_deref().map(|next| {
        let (store, limit) = (store_words(url), limit.unwrap_or(PAGE));
        let next = for_people(&shell_word(next)).into_owned();
        format!(
            "more sessions may follow: rethread sessions list{store} --limit {limit} --after \
             {next}"
        )
    });
    listing.end(json!(next_after), "no sessions", hint);
    Ok(())
}

const HEADER: [&str; 5] = ["SESSION", "THREAD", "ROWS", "BYTES", "BOUND AT"];

/// The sessions of a page with what each holds in the store (one read).
async fn with_bytes(
    store: &BindingStore,
    sessions: Vec<SessionRecord>,
) -> CliResult<Vec<(SessionRecord, StoredBytes)>> {
    let ids: Vec<String> = sessions.iter().map(|s| s.session_id.clone()).collect();
    let bytes = store.session_bytes(&ids).await?;
    Ok(sessions.into_iter().zip(bytes).collect())
}

/// A session's row of the `sessions list` table.
fn row((record, bytes): &(SessionRecord, StoredBytes)) -> [Cell; 5] {
    let (thread, bound) = match record.binding() {
        Some(b) => (
            for_people(&b.thread_id).into_owned(),
            format_ms(b.bound_at_ms),
        ),
        None => ("-".to_string(), "-".to_string()),
    };
    [
        Cell::new(for_people(&record.session_id)),
        Cell::new(thread),
        Cell::new(record.row_count).set_alignment(CellAlignment::Right),
        Cell::new(bytes.total()).set_alignment(CellAlignment::Right),
        Cell::new(bound),
    ]
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

async fn session(store: &BindingStore, id: &str) -> CliResult<SessionRecord> {
    Ok(store
        .session(id)
        .await?
        .ok_or_else(|| format!("no session {id}"))?)
}

async fn show(store: BindingStore, id: &str, json: bool) -> CliResult {
    let record = session(&store, id).await?;
    let bytes = store.session_bytes(&[id.to_string()]).await?;
    let bytes = bytes.first().copied().unwrap_or_default();
    if json {
        outln!("{}", to_json(&(record, bytes)));
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
    outln!(
        "stored bytes:    {} (rows {}, mirror {})",
        bytes.total(),
        bytes.rows,
        bytes.mirror
    );
    let retired = match record.retired_threads.is_empty() {
        true => "(none)".to_string(),
        false => record.retired_threads.join(", "),
    };
    outln!("retired threads: {}", for_people(&retired));
    if let Some(fallback) = last_fallback(&record).as_object() {
        // Why the session's thread was last replaced (`account_mismatch`, `gone`, ...).
        let text = |key: &str| fallback[key].as_str().unwrap_or_default().to_string();
        let at = format_ms(fallback["at_ms"].as_i64().unwrap_or_default());
        let pending = if fallback["pending"] == true {
            ", notice pending"
        } else {
            ""
        };
        let (thread, reason) = (text("thread_id"), text("reason"));
        outln!(
            "last fallback:   {} ({}) at {at}{pending}",
            for_people(&thread),
            for_people(&reason)
        );
    }
    outln!("created:         {}", format_ms(record.created_at_ms));
    outln!("updated:         {}", format_ms(record.updated_at_ms));
    Ok(())
}

/// Prints the transcript of `id` ([`Listing`]): for people `SEQ`, `ROLE` and `TEXT` (escaped;
/// a row without a role or text, as a host may write, shows its JSON); under `--json` the
/// rows as stored. With a limit, when more may follow, a hint on stderr names the next
/// `--after` (in JSON: `next_after`), on the store `url` given.
async fn show_rows(store: BindingStore, url: Option<&str>, args: ShowArgs) -> CliResult {
    let (id, limit) = (args.id.as_str(), args.limit);
    let record = session(&store, id).await?;
    let mut next = args.after.map_or(0, |after| after.saturating_add(1));
    let end = match limit {
        Some(limit) => record.row_count.min(next.saturating_add(limit.into())),
        None => record.row_count,
    };
    let mut listing = Listing::start(
        args.json,
        &format!("{{\"session\":{},\"rows\":[", json!(id)),
    );
    while next < end {
        let rows = store.rows(id, next..end.min(next + PAGE as u64)).await?;
        let Some(last) = rows.last().map(|r| r.seq) else {
            break;
        };
        listing.page(
            &rows,
            ["SEQ", "ROLE", "TEXT"],
            |row| json!({"seq": row.seq, "row": row.body}),
            |row| {
                let role = row.body.get("role").and_then(Value::as_str).unwrap_or("-");
                let text = ["text", "summary"]
                    .iter()
                    .find_map(|key| row.body.get(*key).and_then(Value::as_str))
                    .map_or_else(|| row.body.to_string(), str::to_string);
                [
                    Cell::new(row.seq).set_alignment(CellAlignment::Right),
                    Cell::new(for_people(role)),
                    Cell::new(for_people(&text)),
                ]
            },
        );
        next = last + 1;
    }
    let next_after = (next < record.row_count && next > 0).then(|| next - 1);
    let hint = next_after.zip(limit).map(|(after, limit)| {
        let (id, store) = (for_people(&shell_word(id)).into_owned(), store_words(url));
        format!(
            "more rows may follow: rethread sessions show {id} --rows{store} --limit {limit} \
             --after {after}"
        )
    });
    listing.end(json!(next_after), "no rows", hint);
    Ok(())
}

async fn forget(store: BindingStore, id: &str, json: bool) -> CliResult {
    if !store.delete_session(id).await? {
        return Err(format!("no session {id}").into());
    }
    if json {
        outln!("{}", json!({ "forgot": id }));
    } else {
        outln!("forgot session {}", for_people(id));
    }
    Ok(())
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
