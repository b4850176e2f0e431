//! The guard (`docs/design.md`, "A thread the client names"), read once for the session hooks
//! and the threads kept without a session: which threads a client request names, read whole
//! or refused, and what a listing of threads may show.
//!
//! - A request names a thread by `threadId` or any member ending in `ThreadId`, and, for the
//!   methods where codex opens a rollout by `path` ([`PATH_METHODS`]), by the thread that
//!   rollout holds (codex then ignores `threadId`). A `path` is read to its `session_meta`, in
//!   the home only; a member of another shape, or `params` that are not an object, are
//!   refused: what the guard cannot read whole never reaches codex. (A member named twice in
//!   `params` was refused with the line, by the envelope.)
//! - The answers that list threads ([`LISTING_METHODS`], and `thread/search/partial`
//!   notifications) keep only the threads the client may open.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{BufRead, Read};
use std::path::Path;

use rethread_protocol::{ErrorCode, RequestId, RpcError, ThreadId};
use rethread_runtime::{binding, kept, RuntimeError};
use rethread_store::{BindingStore, Unpoisoned};
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::start::start_refused;
use crate::line::{Line, LineKind};

/// The methods where codex opens the rollout at `path` instead of `threadId`'s.
const PATH_METHODS: [&str; 2] = ["thread/resume", "thread/fork"];

/// The methods whose answers list threads (`result.data`, and `thread/list`'s
/// `result.readStates` keyed by thread).
const LISTING_METHODS: [&str; 5] = [
    "thread/list",
    "thread/search",
    "thread/search/stream",
    "thread/loaded/list",
    "thread/attachmentOwner/list",
];

/// The notification that streams a search's results (`params.data`).
const SEARCH_PARTIAL: &str = "thread/search/partial";

/// A session's first line in a rollout is at most this long (its base instructions included).
const MAX_META_LINE: u64 = 16 << 20;

/// Who the guard keeps threads for: a session, or a client without one (each thread checked
/// under its own key, whether or not it is kept).
#[derive(Clone, Copy)]
pub(crate) enum Viewer<'a> {
    /// The client of session `session_id`.
    Session {
        store: &'a BindingStore,
        session_id: &'a str,
    },
    /// A client without a session.
    Sessionless(&'a BindingStore),
}

impl fmt::Debug for Viewer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Viewer::Session { session_id, .. } => write!(f, "Viewer::Session({session_id})"),
            Viewer::Sessionless(_) => f.write_str("Viewer::Sessionless"),
        }
    }
}

impl Viewer<'_> {
    /// `thread` in its canonical spelling, unless another session owns it
    /// ([`binding::client_thread`], the one rule for every driver).
    ///
    /// # Errors
    /// [`RuntimeError::ThreadTaken`] naming the owner; a store failure.
    pub(crate) async fn check(&self, thread: &str) -> Result<ThreadId, RuntimeError> {
        match self {
            Viewer::Session { store, session_id } => {
                binding::client_thread(store, session_id, Some(thread), false).await
            }
            Viewer::Sessionless(store) => kept::check(store, thread).await,
        }
    }
}

/// The guard of a client without a session (`NoSession` with a store, its threads kept or
/// not): what a request names is checked, listings filtered.
#[derive(Debug)]
pub(crate) struct Sessionless {
    store: BindingStore,
    /// The `CODEX_HOME` a `path` must be in.
    home: Option<String>,
    listings: Listings,
}

impl Sessionless {
    pub(crate) fn new(store: BindingStore, home: Option<String>) -> Self {
        let listings = Listings::default();
        Sessionless {
            store,
            home,
            listings,
        }
    }

    fn viewer(&self) -> Viewer<'_> {
        Viewer::Sessionless(&self.store)
    }

    /// The thread a client request acts on ([`Named::target`]), or the refusal to answer it
    /// with: a session's thread (as on the session path, `sessionId` `null`), or a request
    /// that cannot be read whole.
    pub(crate) async fn check(&self, line: &Line) -> Result<Option<String>, RpcError> {
        let named = named(line, self.home.as_deref()).await?;
        for thread in named.all() {
            if let Err(error) = self.viewer().check(thread.as_str()).await {
                return Err(start_refused(&error, None, Some(thread.as_str())));
            }
        }
        self.listings.on_request(line);
        Ok(named.target().map(|thread| thread.as_str().to_string()))
    }

    /// `line` without the threads the client may not open, when it lists threads.
    pub(crate) async fn filter(&self, line: &Line) -> Option<Line> {
        if !self.listings.concerns(line) {
            return None;
        }
        self.listings.filter(line, self.viewer()).await
    }
}

/// The threads a client request names, read whole.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Named {
    /// `threadId`, then every other `...ThreadId` member, canonical.
    ids: Vec<ThreadId>,
    /// The thread the rollout at `path` holds, for [`PATH_METHODS`].
    path_thread: Option<ThreadId>,
}

impl Named {
    /// The thread the request acts on: the one at `path` (codex then ignores `threadId`),
    /// else `threadId`'s.
    pub(crate) fn target(&self) -> Option<&ThreadId> {
        self.path_thread.as_ref().or(self.ids.first())
    }

    /// Every thread named.
    pub(crate) fn all(&self) -> impl Iterator<Item = &ThreadId> {
        self.ids.iter().chain(&self.path_thread)
    }
}

/// Reads what `line`, a client request, names; `home` is the `CODEX_HOME` a `path` must be in.
///
/// # Errors
/// The `-32600` refusal to answer the request with, saying what could not be read.
pub(crate) async fn named(line: &Line, home: Option<&str>) -> Result<Named, RpcError> {
    let method = line.method().unwrap_or_default();
    let members = match line
        .params_json()
        .map(serde_json::from_slice::<Option<Naming>>)
    {
        None => Vec::new(),
        Some(Ok(naming)) => naming.unwrap_or_default().0,
        Some(Err(_)) => return Err(refusal(method, "its `params` are not an object")),
    };
    let mut named = Named::default();
    let mut path = None;
    for (name, value) in members {
        let text = match value {
            Value::Null => continue,
            Value::String(text) => text,
            _ => return Err(refusal(method, &format!("its `{name}` is not a string"))),
        };
        match name.as_str() {
            "path" if PATH_METHODS.contains(&method) => path = Some(text),
            "path" => {}
            "threadId" => named.ids.insert(0, ThreadId::new(&text)),
            _ => named.ids.push(ThreadId::new(&text)),
        }
    }
    if let Some(path) = path {
        let Some(home) = home.map(str::to_string) else {
            return Err(refusal(
                method,
                "its `path` cannot be checked: no CODEX_HOME",
            ));
        };
        let read = tokio::task::spawn_blocking(move || rollout_thread(Path::new(&home), &path));
        let thread = read
            .await
            .map_err(|error| error.to_string())
            .and_then(|read| read);
        let thread = thread.map_err(|why| refusal(method, &format!("its `path` {why}")))?;
        named.path_thread = Some(thread);
    }
    Ok(named)
}

/// The refusal of a request the guard cannot read whole.
fn refusal(method: &str, what: &str) -> RpcError {
    let message = format!(
        "rethread refused `{method}`: {what}, so it cannot tell which thread the request names"
    );
    RpcError {
        data: Some(serde_json::json!({ "rethread": { "kind": "unreadable_request" } })),
        ..RpcError::new(ErrorCode::INVALID_REQUEST, message)
    }
}

/// The thread whose rollout is at `path` (its `session_meta`'s `payload.id`, what codex
/// reads), when `path` is a file inside `home`.
fn rollout_thread(home: &Path, path: &str) -> Result<ThreadId, String> {
    let given = Path::new(path);
    if !given.is_absolute() {
        return Err("is not an absolute path".into());
    }
    let home = home
        .canonicalize()
        .map_err(|e| format!("cannot be checked: CODEX_HOME cannot be read ({e})"))?;
    let file = given
        .canonicalize()
        .map_err(|e| format!("cannot be read ({e})"))?;
    if !file.starts_with(&home) {
        return Err("is outside CODEX_HOME".into());
    }
    let opened = std::fs::File::open(&file).map_err(|e| format!("cannot be read ({e})"))?;
    let mut first = Vec::new();
    std::io::BufReader::new(opened.take(MAX_META_LINE))
        .read_until(b'\n', &mut first)
        .map_err(|e| format!("cannot be read ({e})"))?;
    #[derive(Deserialize)]
    struct Meta {
        #[serde(rename = "type")]
        kind: String,
        payload: MetaPayload,
    }
    #[derive(Deserialize)]
    struct MetaPayload {
        id: String,
    }
    match serde_json::from_slice::<Meta>(&first) {
        Ok(meta) if meta.kind == "session_meta" => Ok(ThreadId::new(&meta.payload.id)),
        _ => Err("does not start with a thread's session_meta".into()),
    }
}

/// The members of `params` that may name a thread (`path`, `threadId`, `...ThreadId`), kept
/// as values; the others skipped. Anything but an object (or `null`) is an error.
#[derive(Default)]
struct Naming(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Naming {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(NamingVisitor)
    }
}

struct NamingVisitor;

impl<'de> Visitor<'de> for NamingVisitor {
    type Value = Naming;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Naming, A::Error> {
        let mut members = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            if name == "path" || name == "threadId" || name.ends_with("ThreadId") {
                members.push((name, map.next_value::<Value>()?));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Naming(members))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Naming, E> {
        Ok(Naming::default())
    }
}

/// The client's requests whose answers list threads, by id, until answered.
#[derive(Debug, Default)]
pub(crate) struct Listings(std::sync::Mutex<HashSet<RequestId>>);

impl Listings {
    /// Remembers `line`'s id when its answer lists threads.
    pub(crate) fn on_request(&self, line: &Line) {
        let listing = line.method().is_some_and(|m| LISTING_METHODS.contains(&m));
        if let (true, Some(id)) = (listing, line.id()) {
            self.0.lock().unpoisoned().insert(id.clone());
        }
    }

    /// Whether `line`, from codex, may list threads: a search's partial results, or an answer
    /// while a listing is awaited.
    pub(crate) fn concerns(&self, line: &Line) -> bool {
        match line.kind() {
            LineKind::Notification => line.method() == Some(SEARCH_PARTIAL),
            LineKind::Response | LineKind::Error => !self.0.lock().unpoisoned().is_empty(),
            _ => false,
        }
    }

    /// `line` with the threads `viewer` may not open taken out of the list it carries (an
    /// answer to a listing, a search's partial results); `None` when it lists none.
    pub(crate) async fn filter(&self, line: &Line, viewer: Viewer<'_>) -> Option<Line> {
        let member = match (line.kind(), line.method()) {
            (LineKind::Notification, Some(SEARCH_PARTIAL)) => "params",
            (LineKind::Response, _) => {
                let id = line.id()?;
                self.0.lock().unpoisoned().remove(id).then_some(())?;
                "result"
            }
            (LineKind::Error, _) => {
                self.0.lock().unpoisoned().remove(line.id()?);
                return None;
            }
            _ => return None,
        };
        let mut message = line.value().ok()?;
        let listed = message.get_mut(member)?.as_object_mut()?;
        let list = listed.get("data")?.as_array()?;
        // `thread/list` also keys each thread's read state by its id.
        let states = listed.get("readStates").and_then(Value::as_object);
        let named = (list.iter().filter_map(listed_thread)).chain(
            states
                .into_iter()
                .flat_map(|states| states.keys().map(String::as_str)),
        );
        let mut visible = HashMap::new();
        for thread in named {
            if !visible.contains_key(thread) {
                visible.insert(thread.to_string(), viewer.check(thread).await.is_ok());
            }
        }
        let open = |thread: &str| visible.get(thread) == Some(&true);
        // An entry whose thread cannot be read is left out: fail closed.
        if let Some(Value::Array(list)) = listed.get_mut("data") {
            list.retain(|entry| listed_thread(entry).is_some_and(open));
        }
        if let Some(Value::Object(states)) = listed.get_mut("readStates") {
            states.retain(|thread, _| open(thread));
        }
        let mut text = serde_json::to_vec(&message).ok()?;
        text.push(b'\n');
        Some(Line::new(text.into()))
    }
}

/// The thread a listing's entry is: an id, a `Thread` (`id`), a search result (`thread.id`),
/// an owner (`threadId`).
fn listed_thread(entry: &Value) -> Option<&str> {
    match entry {
        Value::String(id) => Some(id),
        Value::Object(object) => object
            .get("threadId")
            .or_else(|| object.get("thread").and_then(|thread| thread.get("id")))
            .or_else(|| object.get("id"))
            .and_then(Value::as_str),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn request(params: &str) -> Line {
        let text = format!(r#"{{"id":1,"method":"thread/resume","params":{params}}}"#);
        Line::from_client(Bytes::from(text)).unwrap()
    }

    #[tokio::test]
    async fn every_member_naming_a_thread_is_read_and_other_shapes_are_refused() {
        let a = "019A0000-0000-7000-8000-00000000000A";
        let params = format!(r#"{{"parentThreadId":"x","threadId":"{a}","cwd":"/"}}"#);
        let read = named(&request(&params), None).await.unwrap();
        let ids: Vec<&str> = read.ids.iter().map(ThreadId::as_str).collect();
        assert_eq!(ids, [a.to_lowercase().as_str(), "x"]);
        assert!(read.path_thread.is_none());
        assert_eq!(
            named(&request("null"), None).await.unwrap(),
            Named::default()
        );
        for params in [
            r#"[1]"#,
            r#""text""#,
            r#"{"threadId":7}"#,
            r#"{"threadId":{"id":"a"}}"#,
        ] {
            let refused = named(&request(params), None).await.unwrap_err();
            assert_eq!(refused.code, ErrorCode::INVALID_REQUEST, "{params}");
        }
        // A path cannot be checked without a home.
        let path = named(&request(r#"{"threadId":"x","path":"/tmp/r.jsonl"}"#), None).await;
        assert!(path.unwrap_err().message.contains("no CODEX_HOME"));
    }

    #[test]
    fn a_path_is_the_thread_its_rollout_holds_inside_the_home_only() {
        let home = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let id = "019a0000-0000-7000-8000-00000000000b";
        let meta = format!(
            "{{\"timestamp\":\"t\",\"type\":\"session_meta\",\"payload\":{{\"id\":\"{id}\"}}}}\n{{}}\n"
        );
        let dir = home.path().join("sessions/2026/12/07");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rollout-decoy-019a0000-0000-7000-8000-00000000000c.jsonl");
        std::fs::write(&file, &meta).unwrap();
        let read = rollout_thread(home.path(), file.to_str().unwrap()).unwrap();
        assert_eq!(read.as_str(), id, "the file's own record, not its name");
        let foreign = outside.path().join("rollout.jsonl");
        std::fs::write(&foreign, &meta).unwrap();
        let refused = rollout_thread(home.path(), foreign.to_str().unwrap()).unwrap_err();
        assert!(refused.contains("outside CODEX_HOME"), "{refused}");
        let dotted = format!(
            "{}/sessions/../../{}",
            home.path().display(),
            foreign.display()
        );
        assert!(rollout_thread(home.path(), &dotted).is_err());
        let link = dir.join("rollout-link.jsonl");
        std::os::unix::fs::symlink(&foreign, &link).unwrap();
        let refused = rollout_thread(home.path(), link.to_str().unwrap()).unwrap_err();
        assert!(
            refused.contains("outside CODEX_HOME"),
            "a link out of the home: {refused}"
        );
        assert!(rollout_thread(home.path(), "sessions/rollout.jsonl").is_err());
        std::fs::write(&file, "not a rollout\n").unwrap();
        assert!(rollout_thread(home.path(), file.to_str().unwrap()).is_err());
    }

    #[test]
    fn a_listing_entry_is_read_in_each_shape_codex_lists() {
        let entries = serde_json::json!([
            "a",
            {"id": "b", "preview": "p"},
            {"snippet": "s", "thread": {"id": "c"}},
            {"threadId": "d", "archived": false},
            {"preview": "no id"},
            3
        ]);
        let read: Vec<Option<&str>> = entries
            .as_array()
            .unwrap()
            .iter()
            .map(listed_thread)
            .collect();
        assert_eq!(
            read,
            [Some("a"), Some("b"), Some("c"), Some("d"), None, None]
        );
    }
}
