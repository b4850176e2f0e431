//! Typed v2 messages of codex app-server that rethread uses.
//!
//! Every struct ignores unknown fields on input (codex sends many fields its own schema does
//! not list) and omits `None` fields on output. Client requests implement [`Request`], which
//! ties a method name to its params and result types.

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

macro_rules! request {
    ($(#[$doc:meta])* $name:ident, $method:literal, $params:ty, $result:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub enum $name {}
        impl Request for $name {
            const METHOD: &'static str = $method;
            type Params = $params;
            type Result = $result;
        }
    };
}

request!(
    /// `initialize`: the first request; answered once per connection.
    Initialize, "initialize", InitializeParams, InitializeResponse
);
request!(
    /// `thread/start`: a new thread.
    ThreadStart, "thread/start", ThreadStartParams, ThreadStartResponse
);
request!(
    /// `thread/resume`: load a stored thread so turns can run on it.
    ThreadResume, "thread/resume", ThreadResumeParams, ThreadResumeResponse
);
request!(
    /// `thread/read`: read a stored thread without resuming it (side-effect free).
    ThreadRead, "thread/read", ThreadReadParams, ThreadReadResponse
);
request!(
    /// `thread/list`: page through stored threads.
    ThreadList, "thread/list", ThreadListParams, ThreadListResponse
);
request!(
    /// `turn/start`: run one turn; progress arrives as notifications.
    TurnStart, "turn/start", TurnStartParams, TurnStartResponse
);
request!(
    /// `turn/interrupt`: stop a running turn.
    TurnInterrupt, "turn/interrupt", TurnInterruptParams, TurnInterruptResponse
);

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
    /// Opt into experimental methods and fields (`historyMode` on `thread/start`,
    /// `excludeTurns` on 0.144.6, ...).
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

/// `thread/start` params (the subset rethread sets).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
}

/// `thread/start` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadStartResponse {
    /// The new thread.
    pub thread: Thread,
    /// The model the thread will use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `thread/resume` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadResumeParams {
    /// The thread to resume.
    pub thread_id: String,
    /// Leave the earlier turns out of the response (the host has its own transcript).
    /// 0.144.6 needs the `experimentalApi` capability for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_turns: Option<bool>,
    /// Developer instructions for the resumed thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub developer_instructions: Option<String>,
}

impl ThreadResumeParams {
    /// Params for `thread_id` with nothing else set.
    pub fn new(thread_id: impl Into<String>) -> Self {
        ThreadResumeParams {
            thread_id: thread_id.into(),
            ..Default::default()
        }
    }

    /// Sets `excludeTurns`.
    pub fn exclude_turns(mut self, exclude: bool) -> Self {
        self.exclude_turns = Some(exclude);
        self
    }
}

/// `thread/resume` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadResumeResponse {
    /// The resumed thread (with turns unless they were excluded).
    pub thread: Thread,
    /// The model the thread will use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `thread/read` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadReadParams {
    /// The thread to read.
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadListResponse {
    /// The threads of this page.
    pub data: Vec<Thread>,
    /// Cursor of the next page, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// One piece of user input. Every variant is one each supported codex release accepts (its
/// generated `UserInput` schema): text, an image by URL, an image file codex reads itself.
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
    /// An image file on the machine codex runs on; codex reads it and sends the model its
    /// bytes. A relative path is resolved by codex, against its own working directory.
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

    /// An image file codex reads (`localImage`). A path that is not UTF-8 is converted
    /// lossily: the wire carries strings.
    pub fn local_image(path: impl AsRef<std::path::Path>) -> Self {
        UserInput::LocalImage {
            path: path.as_ref().to_string_lossy().into_owned(),
        }
    }
}

/// `turn/start` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartParams {
    /// The thread to run the turn on.
    pub thread_id: String,
    /// The user's input.
    pub input: Vec<UserInput>,
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
    pub thread_id: String,
    /// The turn to stop.
    pub turn_id: String,
}

/// `turn/interrupt` result (empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnInterruptResponse {}

/// A codex thread. Only the fields rethread reads are typed; the rest are kept in `extra` so a
/// thread survives a decode/encode round trip unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Thread {
    /// The thread id (a UUIDv7 in codex).
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

impl Thread {
    /// A thread with the given id and mode and nothing else.
    pub fn new(id: impl Into<String>, history_mode: HistoryMode) -> Self {
        Thread {
            id: id.into(),
            history_mode,
            path: None,
            preview: None,
            turns: Vec::new(),
            extra: Map::new(),
        }
    }
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

/// `thread/started` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadStartedNotification {
    /// The new thread.
    pub thread: Thread,
}

/// `turn/started` and `turn/completed` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnNotification {
    /// The thread.
    pub thread_id: String,
    /// The turn (with its items on completion).
    pub turn: Turn,
}

/// `item/started` and `item/completed` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemNotification {
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The item.
    pub item: ThreadItem,
}

/// `item/agentMessage/delta` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentMessageDeltaNotification {
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The item the delta belongs to.
    pub item_id: String,
    /// The text fragment.
    pub delta: String,
}

/// Token counts of one model request or of a whole thread, as codex reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsageBreakdown {
    /// All tokens (input plus output).
    pub total_tokens: i64,
    /// Input tokens.
    pub input_tokens: i64,
    /// Input tokens served from the prompt cache.
    pub cached_input_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// Output tokens spent on reasoning.
    pub reasoning_output_tokens: i64,
}

/// A thread's token usage: the running total and the last model request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadTokenUsage {
    /// Everything the thread used so far.
    pub total: TokenUsageBreakdown,
    /// The last model request.
    pub last: TokenUsageBreakdown,
    /// The model's context window, when codex knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_context_window: Option<i64>,
}

/// `thread/tokenUsage/updated` params: sent after each model response of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsageUpdatedNotification {
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The usage.
    pub token_usage: ThreadTokenUsage,
}

/// `error` notification params: a turn hit an error (maybe retried).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorNotification {
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// What went wrong.
    pub error: TurnError,
    /// Whether codex retries on its own.
    #[serde(default)]
    pub will_retry: bool,
}

/// `warning` notification params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarningNotification {
    /// The warning.
    pub message: String,
    /// The thread it concerns, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// `deprecationNotice` notification params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeprecationNoticeNotification {
    /// One-line summary.
    pub summary: String,
    /// Details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
}

/// A server notification, typed where rethread reads it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerNotification {
    /// `thread/started`.
    ThreadStarted(ThreadStartedNotification),
    /// `turn/started`.
    TurnStarted(TurnNotification),
    /// `turn/completed`.
    TurnCompleted(TurnNotification),
    /// `item/started`.
    ItemStarted(ItemNotification),
    /// `item/completed`.
    ItemCompleted(ItemNotification),
    /// `item/agentMessage/delta`.
    AgentMessageDelta(AgentMessageDeltaNotification),
    /// `thread/tokenUsage/updated`.
    TokenUsageUpdated(TokenUsageUpdatedNotification),
    /// `error`.
    Error(ErrorNotification),
    /// `warning`.
    Warning(WarningNotification),
    /// `deprecationNotice`.
    DeprecationNotice(DeprecationNoticeNotification),
    /// Any other method, kept raw.
    Other {
        /// The method.
        method: String,
        /// The params.
        params: Option<Value>,
    },
}

fn decode<T: DeserializeOwned>(params: &Option<Value>) -> Result<T, serde_json::Error> {
    T::deserialize(params.as_ref().unwrap_or(&Value::Null))
}

impl ServerNotification {
    /// Types a raw notification. Unknown methods become [`ServerNotification::Other`]; a known
    /// method whose params do not decode is an error.
    pub fn from_raw(raw: &RawNotification) -> Result<Self, serde_json::Error> {
        let p = &raw.params;
        Ok(match raw.method.as_str() {
            "thread/started" => Self::ThreadStarted(decode(p)?),
            "turn/started" => Self::TurnStarted(decode(p)?),
            "turn/completed" => Self::TurnCompleted(decode(p)?),
            "item/started" => Self::ItemStarted(decode(p)?),
            "item/completed" => Self::ItemCompleted(decode(p)?),
            "item/agentMessage/delta" => Self::AgentMessageDelta(decode(p)?),
            "thread/tokenUsage/updated" => Self::TokenUsageUpdated(decode(p)?),
            "error" => Self::Error(decode(p)?),
            "warning" => Self::Warning(decode(p)?),
            "deprecationNotice" => Self::DeprecationNotice(decode(p)?),
            other => Self::Other {
                method: other.to_string(),
                params: raw.params.clone(),
            },
        })
    }

    /// The thread the notification concerns, when it names one.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            Self::ThreadStarted(n) => Some(&n.thread.id),
            Self::TurnStarted(n) | Self::TurnCompleted(n) => Some(&n.thread_id),
            Self::ItemStarted(n) | Self::ItemCompleted(n) => Some(&n.thread_id),
            Self::AgentMessageDelta(n) => Some(&n.thread_id),
            Self::TokenUsageUpdated(n) => Some(&n.thread_id),
            Self::Error(n) => Some(&n.thread_id),
            Self::Warning(n) => n.thread_id.as_deref(),
            Self::DeprecationNotice(_) => None,
            Self::Other { params, .. } => params
                .as_ref()
                .and_then(|p| p.get("threadId"))
                .and_then(Value::as_str),
        }
    }
}

/// Methods of the approval server requests codex sends mid-turn.
pub const APPROVAL_METHODS: [&str; 5] = [
    "item/commandExecution/requestApproval",
    "item/fileChange/requestApproval",
    "item/permissions/requestApproval",
    "applyPatchApproval",
    "execCommandApproval",
];

/// Params common to the v2 approval requests (the rest is kept raw).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequestParams {
    /// The thread (v2 requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The turn (v2 requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The item (v2 requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// Every other member.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A request from the server that the client must answer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerRequest {
    /// One of [`APPROVAL_METHODS`].
    Approval {
        /// Which approval.
        method: String,
        /// Its params.
        params: ApprovalRequestParams,
    },
    /// Any other server request (`item/tool/call`, `item/tool/requestUserInput`, ...).
    Other {
        /// The method.
        method: String,
        /// The params.
        params: Option<Value>,
    },
}

impl ServerRequest {
    /// Types a raw server request.
    pub fn from_raw(raw: &RawRequest) -> Result<Self, serde_json::Error> {
        if APPROVAL_METHODS.contains(&raw.method.as_str()) {
            Ok(Self::Approval {
                method: raw.method.clone(),
                params: decode(&raw.params)?,
            })
        } else {
            Ok(Self::Other {
                method: raw.method.clone(),
                params: raw.params.clone(),
            })
        }
    }

    /// The method on the wire.
    pub fn method(&self) -> &str {
        match self {
            Self::Approval { method, .. } | Self::Other { method, .. } => method,
        }
    }

    /// Whether this is one of the [`APPROVAL_METHODS`].
    pub fn is_approval(&self) -> bool {
        matches!(self, Self::Approval { .. })
    }

    /// The thread the request concerns, when it names one: `threadId` (v2 requests), else
    /// `conversationId` (the legacy approvals name the thread so).
    pub fn thread_id(&self) -> Option<&str> {
        let (thread, extra) = match self {
            Self::Approval { params, .. } => (params.thread_id.as_deref(), Some(&params.extra)),
            Self::Other { params, .. } => (
                params
                    .as_ref()
                    .and_then(|p| p.get("threadId"))
                    .and_then(Value::as_str),
                params.as_ref().and_then(Value::as_object),
            ),
        };
        thread.or_else(|| {
            extra
                .and_then(|e| e.get("conversationId"))
                .and_then(Value::as_str)
        })
    }

    /// The turn the request concerns, when it names one (`turnId`).
    pub fn turn_id(&self) -> Option<&str> {
        match self {
            Self::Approval { params, .. } => params.turn_id.as_deref(),
            Self::Other { params, .. } => params
                .as_ref()
                .and_then(|p| p.get("turnId"))
                .and_then(Value::as_str),
        }
    }

    /// The answer that declines this approval, in the vocabulary of its method; `None` for
    /// non-approvals.
    ///
    /// v2 requests get `decline` (the turn goes on without the action). The legacy requests
    /// get `abort`: their plain "denied" changed shape between 0.144.6 (a string) and
    /// 0.169.0 (an object with a rejection), and `abort` is the refusal both accept.
    pub fn decline_result(&self) -> Option<Value> {
        match self {
            Self::Approval { method, .. } => Some(match method.as_str() {
                "applyPatchApproval" | "execCommandApproval" => {
                    serde_json::json!({ "decision": "abort" })
                }
                "item/permissions/requestApproval" => {
                    serde_json::json!({ "permissions": {}, "scope": "turn" })
                }
                _ => serde_json::json!({ "decision": "decline" }),
            }),
            Self::Other { .. } => None,
        }
    }
}
