//! The client's first `thread/start` of a bound session: resume the bound thread in its place,
//! or give it up and let the start through, seeded; the wire shapes that takes.

use rethread_protocol::jsonrpc::Request as RawRequest;
use rethread_protocol::messages::{shared_with_resume, ThreadResumeParams};
use rethread_protocol::{ErrorCode, Message, RequestId, RpcError};
use rethread_runtime::binding::seeded_instructions;
use rethread_runtime::RuntimeError;
use serde_json::{json, Map, Value};

use crate::line::Line;

/// Members of a `thread/resume` result a `thread/start` result does not have.
const RESUME_ONLY: [&str; 3] = [
    "collaborationMode",
    "itemsBackwardsCursor",
    "turnsBackwardsCursor",
];

/// The attempt's `thread/resume` params plus the members of the client's start a resume takes.
pub(crate) fn resume_params(mut attempt: ThreadResumeParams, start: &Map<String, Value>) -> Value {
    attempt.settings.extend(shared_with_resume(start));
    serde_json::to_value(attempt).unwrap_or_default()
}

/// A `thread/resume` result in the shape of a `thread/start` result: the resume-only members
/// left out and the thread's `turns` empty (a started thread has none; `excludeTurns` asks for
/// the same, and a server that refused it has sent them anyway).
pub(crate) fn as_start_result(mut result: Value) -> Value {
    if let Some(object) = result.as_object_mut() {
        for key in RESUME_ONLY {
            object.remove(key);
        }
        if let Some(thread) = object.get_mut("thread").and_then(Value::as_object_mut) {
            thread.insert("turns".to_string(), json!([]));
        }
    }
    result
}

/// The `thread/start` the client sent, with `seed` appended to its developer instructions
/// (the runtime's [`seeded_instructions`]); every other member as the client sent it.
pub(crate) fn seeded_start(id: RequestId, params: Map<String, Value>, seed: String) -> Line {
    Line::from_message(&Message::Request(RawRequest {
        id,
        method: "thread/start".to_string(),
        params: Some(Value::Object(seeded_params(params, seed))),
    }))
}

/// `thread/start` params with `seed` appended to their developer instructions.
pub(crate) fn seeded_params(mut params: Map<String, Value>, seed: String) -> Map<String, Value> {
    let own = params.get("developerInstructions").and_then(Value::as_str);
    let instructions = Value::String(seeded_instructions(own, seed));
    params.insert("developerInstructions".to_string(), instructions);
    params
}

/// The error that answers the client's first `thread/start` when its bound thread could not
/// be resumed now and nothing was written, or a `thread/resume` without a session (`session_id`
/// `None`) whose thread could not be taken: `-32001` with `data.codexErrorInfo:
/// "server_overloaded"` (codex's own "retry later", which its SDKs read as retryable) when
/// [`RuntimeError::is_retryable`], else `-32603`; another session's thread is
/// [`thread_taken`]'s answer. `data.rethread` says what happened: `kind` (the runtime's error
/// kind), `sessionId` (`null` without a session), `threadId` (the bound thread, or `null`) and
/// `retryable`.
pub(crate) fn start_refused(
    error: &RuntimeError,
    session_id: Option<&str>,
    thread_id: Option<&str>,
) -> RpcError {
    if let Some(taken) = thread_taken(error, session_id) {
        return taken;
    }
    let retryable = error.is_retryable();
    let mut data = json!({
        "rethread": {
            "kind": error.kind(),
            "sessionId": session_id,
            "threadId": thread_id,
            "retryable": retryable,
        }
    });
    let (what, kept) = match session_id {
        Some(_) => ("the session's thread".to_string(), "; the session is kept"),
        None => (format!("thread {}", thread_id.unwrap_or_default()), ""),
    };
    let code = if retryable {
        data["codexErrorInfo"] = json!("server_overloaded");
        ErrorCode::OVERLOADED
    } else {
        ErrorCode::INTERNAL_ERROR
    };
    let retry = if retryable { "; retry later" } else { "" };
    RpcError {
        code,
        message: format!("rethread could not resume {what}: {error}{kept}{retry}"),
        data: Some(data),
    }
}

/// The error answering the client's first request (`initialize`) when the session could not
/// be opened at all, before codex started (its lease held by another live process, the store
/// unreachable): the code and `data` of a refused `thread/start` (`-32001` with
/// `data.codexErrorInfo: "server_overloaded"` when retryable, else `-32603`; `data.rethread`
/// = `{kind, sessionId, threadId: null, retryable}`: a busy session is `kind:
/// "session_busy"`), with rethread's own message, which names the holder.
pub fn open_refused(error: &RuntimeError, session_id: &str) -> RpcError {
    let mut refusal = start_refused(error, Some(session_id), None);
    let retry = if error.is_retryable() {
        "; retry later"
    } else {
        ""
    };
    refusal.message = format!("rethread: {error}{retry}");
    refusal
}

/// The refusal of a thread another session owns ([`RuntimeError::ThreadTaken`]), the same
/// with a session (`session_id`) or without: `-32600` naming the owner, `data.rethread` =
/// `{kind: "thread_taken", sessionId (or null), threadId, ownerSessionId}`.
pub(crate) fn thread_taken(error: &RuntimeError, session_id: Option<&str>) -> Option<RpcError> {
    let RuntimeError::ThreadTaken {
        thread_id,
        session_id: owner,
    } = error
    else {
        return None;
    };
    let asking = session_id.map_or("a client without a session".into(), |s| {
        format!("session {s}")
    });
    Some(RpcError {
        code: ErrorCode::INVALID_REQUEST,
        message: format!(
            "thread {thread_id} belongs to rethread session {owner}; {asking} cannot use it"
        ),
        data: Some(json!({"rethread": {
            "kind": error.kind(),
            "sessionId": session_id,
            "threadId": thread_id,
            "ownerSessionId": owner,
        }})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn the_resume_takes_the_members_a_resume_accepts() {
        let start = json!({"cwd": "/w", "model": "m", "ephemeral": false, "serviceName": "s",
                           "developerInstructions": "be brief", "sandbox": "read-only"});
        let start = start.as_object().unwrap().clone();
        let params = resume_params(ThreadResumeParams::new("t").exclude_turns(true), &start);
        assert_eq!(
            params,
            json!({"threadId": "t", "excludeTurns": true, "cwd": "/w",
                   "developerInstructions": "be brief", "model": "m", "sandbox": "read-only"})
        );
    }

    #[test]
    fn a_resume_result_is_shaped_as_a_start_result() {
        let result = json!({"thread": {"id": "t", "turns": [{"id": "x"}], "preview": "p"},
                            "model": "m", "turnsBackwardsCursor": "c", "collaborationMode": {}});
        assert_eq!(
            as_start_result(result),
            json!({"thread": {"id": "t", "turns": [], "preview": "p"}, "model": "m"})
        );
    }

    #[test]
    fn the_seed_follows_the_clients_own_instructions_and_nothing_else_changes() {
        let line = Line::new(Bytes::from_static(
            br#"{"id":"a-b","method":"thread/start","params":{"cwd":"/w","developerInstructions":"mine","x":1}}"#,
        ));
        let seeded = seeded_start(
            line.id().unwrap().clone(),
            line.params().unwrap_or_default(),
            "SEED".into(),
        );
        let value = seeded.value().unwrap();
        assert_eq!(value["id"], "a-b");
        assert_eq!(
            value["params"],
            json!({"cwd": "/w", "developerInstructions": "mine\n\nSEED", "x": 1})
        );
        let bare = Line::new(Bytes::from_static(br#"{"id":3,"method":"thread/start"}"#));
        let seeded = seeded_start(
            RequestId::Integer(3),
            bare.params().unwrap_or_default(),
            "SEED".into(),
        );
        assert_eq!(
            seeded.value().unwrap()["params"],
            json!({"developerInstructions": "SEED"})
        );
    }

    #[test]
    fn refusals_say_whether_to_retry() {
        let busy = RuntimeError::ThreadBusy {
            thread_id: "t".into(),
            message: "thread t already has an active writer".into(),
        };
        let error = start_refused(&busy, Some("s"), Some("t"));
        assert_eq!(error.code, ErrorCode::OVERLOADED);
        let data = error.data.unwrap();
        assert_eq!(data["codexErrorInfo"], "server_overloaded");
        assert_eq!(
            data["rethread"],
            json!({"kind": "thread_busy", "sessionId": "s", "threadId": "t", "retryable": true})
        );
        let other = RuntimeError::Resume {
            thread_id: "t".into(),
            failure: rethread_protocol::ResumeFailure::Other,
            error: RpcError::new(-32000, "strange"),
        };
        let error = start_refused(&other, Some("s"), Some("t"));
        assert_eq!(error.code, ErrorCode::INTERNAL_ERROR);
        assert!(error.data.unwrap().get("codexErrorInfo").is_none());
    }
}
