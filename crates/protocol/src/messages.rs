//! Typed v2 messages of codex app-server that rethread uses. Unknown fields are ignored on
//! input (codex sends many its own schema does not list) and `None` fields omitted on output.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::jsonrpc::{Notification as RawNotification, Request as RawRequest};
use crate::HistoryMode;

/// A client-to-server request type: method name, params and result.
pub trait Request {
    /// The method name on the wire.
    const METHOD: &'static str;
    /// The `params` member.
    type Params: Serialize + DeserializeOwned;
    /// The `result` member of a successful response.
    type Result: Serialize + DeserializeOwned;
}

/// One uninhabited type per method, tying its name to its params and result.
macro_rules! requests {
    ($($(#[$doc:meta])* $name:ident = $method:literal, $params:ty => $result:ty;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub enum $name {}
        impl Request for $name {
            const METHOD: &'static str = $method;
            type Params = $params;
            type Result = $result;
        }
    )*};
}

requests! {
    /// `initialize`: the first request; answered once per connection.
    Initialize = "initialize", InitializeParams => InitializeResponse;
    /// `thread/start`: a new thread.
    ThreadStart = "thread/start", ThreadStartParams => ThreadStartResponse;
    /// `thread/resume`: load a stored thread so turns can run on it.
    ThreadResume = "thread/resume", ThreadResumeParams => ThreadResumeResponse;
    /// `thread/read`: read a stored thread without resuming it (side-effect free).
    ThreadRead = "thread/read", ThreadReadParams => ThreadReadResponse;
    /// `thread/turns/list`: a page of a stored thread's turns, without resuming it (0.144.6
    /// serves it only under `experimentalApi`).
    ThreadTurnsList = "thread/turns/list", ThreadTurnsListParams => ThreadTurnsListResponse;
    /// `thread/list`: page through stored threads.
    ThreadList = "thread/list", ThreadListParams => ThreadListResponse;
    /// `turn/start`: run one turn; progress arrives as notifications.
    TurnStart = "turn/start", TurnStartParams => TurnStartResponse;
    /// `turn/interrupt`: stop a running turn.
    TurnInterrupt = "turn/interrupt", TurnInterruptParams => TurnInterruptResponse;
}

/// The `initialized` notification the client sends after the `initialize` response.
pub const INITIALIZED: &str = "initialized";

/// Who the client is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInfo {
    /// Client name.
    pub name: String,
    /// Client version.
    pub version: String,
    /// Optional display title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// Capabilities the client declares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeCapabilities {
    /// Opt into experimental fields (`historyMode`, `excludeTurns` on 0.144.6, ...).
    #[serde(default)]
    pub experimental_api: bool,
}

/// `initialize` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// Who the client is.
    pub client_info: ClientInfo,
    /// Declared capabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<InitializeCapabilities>,
}

/// `initialize` result. Codex reports its user agent; everything else is ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResponse {
    /// The server's user agent string, which carries its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
}

/// The members of `thread/start` params that `thread/resume` takes too (codex 0.144.6 to
/// 0.171.0 alike): what a host set for its thread goes with the resume after a restart.
pub const SHARED_WITH_RESUME: [&str; 11] = [
    "approvalPolicy",
    "approvalsReviewer",
    "baseInstructions",
    "config",
    "cwd",
    "developerInstructions",
    "model",
    "modelProvider",
    "personality",
    "sandbox",
    "serviceTier",
];

/// `thread/start` params: the members rethread reads, typed; every other member codex takes
/// (`approvalPolicy`, `sandbox`, `config`, ...) in [`settings`](Self::settings), as given.
///
/// ```
/// use rethread_protocol::messages::ThreadStartParams;
/// use serde_json::json;
/// let start = ThreadStartParams::default()
///     .cwd("/srv/work")
///     .setting("sandbox", json!("read-only"))
///     .setting("approvalPolicy", json!("never"));
/// let resume = start.resume("thr_1");
/// assert_eq!(
///     serde_json::to_value(&resume).unwrap(),
///     json!({"threadId": "thr_1", "cwd": "/srv/work", "sandbox": "read-only", "approvalPolicy": "never"})
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ThreadStartParams {
    /// Working directory of the thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Requested history mode; needs the `experimentalApi` capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_mode: Option<HistoryMode>,
    /// Extra developer instructions (rethread seeds a replacement thread here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub developer_instructions: Option<String>,
    /// Model override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Codex keeps no rollout of an ephemeral thread: rethread never binds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<bool>,
    /// Every other member, in order, as given.
    #[serde(flatten)]
    pub settings: Map<String, Value>,
}

/// Builder methods: a setter per optional member named, and `setting` for any other.
macro_rules! setters {
    ($($(#[$doc:meta])* $field:ident: $type:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, value: impl Into<$type>) -> Self {
                self.$field = Some(value.into());
                self
            }
        )*

        /// Sets any other member codex takes (`"sandbox"`, `"approvalPolicy"`, `"config"`, ...).
        pub fn setting(mut self, key: impl Into<String>, value: Value) -> Self {
            self.settings.insert(key.into(), value);
            self
        }
    };
}

impl ThreadStartParams {
    setters! {
        /// Sets the working directory.
        cwd: String;
        /// Sets the model.
        model: String;
        /// Sets the developer instructions.
        developer_instructions: String;
        /// Sets the history mode (needs the `experimentalApi` capability).
        history_mode: HistoryMode;
    }

    /// The `thread/resume` of `thread_id` with this start's members a resume takes
    /// ([`SHARED_WITH_RESUME`]).
    pub fn resume(&self, thread_id: impl Into<String>) -> ThreadResumeParams {
        let mut resume = ThreadResumeParams::new(thread_id);
        if let Ok(Value::Object(start)) = serde_json::to_value(self) {
            resume.settings = shared_with_resume(&start);
        }
        resume
    }
}

/// The members of `start` (a `thread/start`'s params) that a `thread/resume` takes, in order.
pub fn shared_with_resume(start: &Map<String, Value>) -> Map<String, Value> {
    start
        .iter()
        .filter(|(key, _)| SHARED_WITH_RESUME.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// `thread/start` result, and `thread/resume`'s ([`ThreadResumeResponse`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadStartResponse {
    /// The thread (a resumed one with its turns, unless they were excluded).
    pub thread: Thread,
    /// The model the thread will use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `thread/resume` params: the thread, `excludeTurns`, and the thread's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ThreadResumeParams {
    /// The thread to resume.
    #[serde(deserialize_with = "crate::thread_id::canonical")]
    pub thread_id: String,
    /// Leave the earlier turns out of the response (the host has its own transcript).
    /// 0.144.6 needs the `experimentalApi` capability for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_turns: Option<bool>,
    /// Every other member (`cwd`, `model`, `developerInstructions`, `sandbox`, ...), in order.
    #[serde(flatten)]
    pub settings: Map<String, Value>,
}

impl ThreadResumeParams {
    /// Params for `thread_id` with nothing else set.
    pub fn new(thread_id: impl Into<String>) -> Self {
        ThreadResumeParams {
            thread_id: thread_id.into(),
            ..Default::default()
        }
    }

    setters! {
        /// Sets `excludeTurns`.
        exclude_turns: bool;
    }
}

/// `thread/resume` result: the shape of a start's.
pub type ThreadResumeResponse = ThreadStartResponse;

/// `thread/read` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadReadParams {
    /// The thread to read.
    #[serde(deserialize_with = "crate::thread_id::canonical")]
    pub thread_id: String,
    /// Include the turns (a full-history read; refused for paginated threads by 0.144.6).
    #[serde(default)]
    pub include_turns: bool,
}

/// `thread/read` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadReadResponse {
    /// The thread.
    pub thread: Thread,
}

/// `thread/turns/list` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadTurnsListParams {
    /// The thread whose turns to list.
    #[serde(deserialize_with = "crate::thread_id::canonical")]
    pub thread_id: String,
    /// Page size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// One page of a list result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    /// The items of this page (turns: newest first by default).
    pub data: Vec<T>,
    /// Cursor of the next page, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `thread/turns/list` result.
pub type ThreadTurnsListResponse = Page<Turn>;

/// `thread/list` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadListParams {
    /// Opaque cursor from a previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Page size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `thread/list` result.
pub type ThreadListResponse = Page<Thread>;

/// One piece of user input, in a form every supported codex release accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
#[non_exhaustive]
pub enum UserInput {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// An image by URL (`https://...` or a `data:` URL); the model fetches or decodes it.
    Image {
        /// The URL.
        url: String,
    },
    /// An image file codex reads (a relative path against its working directory).
    LocalImage {
        /// The file.
        path: String,
    },
}

impl UserInput {
    /// Text input.
    pub fn text(text: impl Into<String>) -> Self {
        UserInput::Text { text: text.into() }
    }

    /// An image by URL.
    pub fn image_url(url: impl Into<String>) -> Self {
        UserInput::Image { url: url.into() }
    }

    /// An image file codex reads (`localImage`); a path that is not UTF-8 is converted lossily.
    pub fn local_image(path: impl AsRef<std::path::Path>) -> Self {
        UserInput::LocalImage {
            path: path.as_ref().to_string_lossy().into_owned(),
        }
    }
}

/// `turn/start` params; every other member codex takes for a turn (`effort`, `model`, ...) in
/// [`settings`](Self::settings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct TurnStartParams {
    /// The thread to run the turn on.
    #[serde(deserialize_with = "crate::thread_id::canonical")]
    pub thread_id: String,
    /// The user's input.
    pub input: Vec<UserInput>,
    /// Every other member, in order, as given.
    #[serde(flatten)]
    pub settings: Map<String, Value>,
}

impl TurnStartParams {
    /// A turn of `input` on `thread_id`, nothing else set.
    pub fn new(thread_id: impl Into<String>, input: Vec<UserInput>) -> Self {
        TurnStartParams {
            thread_id: thread_id.into(),
            input,
            settings: Map::new(),
        }
    }
}

/// `turn/start` result: the turn, `inProgress`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnStartResponse {
    /// The started turn.
    pub turn: Turn,
}

/// `turn/interrupt` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnInterruptParams {
    /// The thread.
    #[serde(deserialize_with = "crate::thread_id::canonical")]
    pub thread_id: String,
    /// The turn to stop.
    pub turn_id: String,
}

/// `turn/interrupt` result (empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnInterruptResponse {}

/// A codex thread: the fields rethread reads, typed; the rest kept verbatim in `extra`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Thread {
    /// The thread id (a UUIDv7 in codex), read in its canonical form ([`crate::ThreadId`]).
    #[serde(deserialize_with = "crate::thread_id::canonical")]
    pub id: String,
    /// The history contract; absent on the wire means legacy.
    #[serde(default)]
    pub history_mode: HistoryMode,
    /// The rollout path, when materialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A preview of the first user message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
    /// The turns, when included.
    #[serde(default)]
    pub turns: Vec<Turn>,
    /// Every other member, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The status of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TurnStatus {
    /// Finished normally.
    Completed,
    /// Stopped by `turn/interrupt`.
    Interrupted,
    /// Failed.
    Failed,
    /// Still running.
    InProgress,
    /// A status this crate does not know.
    #[serde(untagged)]
    Other(String),
}

/// A turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Turn {
    /// The turn id.
    pub id: String,
    /// Its status.
    pub status: TurnStatus,
    /// Its items (may be empty when not loaded).
    #[serde(default)]
    pub items: Vec<ThreadItem>,
    /// The error of a failed turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<TurnError>,
}

/// Why a turn failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnError {
    /// Human-readable message.
    pub message: String,
}

/// An item of a turn. The kinds rethread projects are typed; every other kind is kept raw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ThreadItem {
    /// A typed item.
    Known(KnownItem),
    /// Any other item kind, kept verbatim.
    Other(Value),
}

/// The item kinds rethread reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum KnownItem {
    /// The user's message.
    UserMessage {
        /// Item id.
        id: String,
        /// The input pieces (kept raw: images, mentions, ...).
        content: Vec<Value>,
    },
    /// The assistant's message.
    AgentMessage {
        /// Item id.
        id: String,
        /// The text.
        text: String,
    },
}

impl ThreadItem {
    /// The item's `type`, if it has one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ThreadItem::Known(KnownItem::UserMessage { .. }) => Some("userMessage"),
            ThreadItem::Known(KnownItem::AgentMessage { .. }) => Some("agentMessage"),
            ThreadItem::Other(value) => value.get("type").and_then(Value::as_str),
        }
    }

    /// The item's id, if it has one.
    pub fn id(&self) -> Option<&str> {
        match self {
            ThreadItem::Known(KnownItem::UserMessage { id, .. })
            | ThreadItem::Known(KnownItem::AgentMessage { id, .. }) => Some(id),
            ThreadItem::Other(value) => value.get("id").and_then(Value::as_str),
        }
    }
}

mod server;
pub use server::*;
