//! What the server sends: notifications (typed where rethread reads them) and server requests.

use super::*;

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
    #[serde(deserialize_with = "crate::thread_id::canonical")]
    pub thread_id: String,
    /// The turn (with its items on completion).
    pub turn: Turn,
}

/// `item/started` and `item/completed` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemNotification {
    /// The thread.
    #[serde(deserialize_with = "crate::thread_id::canonical")]
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
    #[serde(deserialize_with = "crate::thread_id::canonical")]
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
    #[serde(deserialize_with = "crate::thread_id::canonical")]
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
    #[serde(deserialize_with = "crate::thread_id::canonical")]
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
    /// Types a raw notification: unknown methods are [`ServerNotification::Other`], a known
    /// one's params must decode.
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

    /// A string member of the params.
    fn param(&self, key: &str) -> Option<&str> {
        let value = match self {
            Self::Approval { params, .. } => match key {
                "threadId" => return params.thread_id.as_deref(),
                "turnId" => return params.turn_id.as_deref(),
                _ => params.extra.get(key),
            },
            Self::Other { params, .. } => params.as_ref()?.get(key),
        };
        value?.as_str()
    }

    /// The thread the request concerns, when it names one: `threadId` (v2 requests), else
    /// `conversationId` (the legacy approvals name the thread so).
    pub fn thread_id(&self) -> Option<&str> {
        self.param("threadId")
            .or_else(|| self.param("conversationId"))
    }

    /// The turn the request concerns, when it names one (`turnId`).
    pub fn turn_id(&self) -> Option<&str> {
        self.param("turnId")
    }

    /// The answer that declines this approval, in its method's vocabulary (`None` for
    /// non-approvals): `decline` for v2 requests (the turn goes on without the action), `abort`
    /// for the legacy ones, whose plain denial changed shape between 0.144.6 and 0.169.0.
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
