//! The few members of JSON-RPC lines the session reads (a thread id, a turn id, a turn's
//! input), read with serde so that they are what a JSON parser finds.

use serde::Deserialize;
use serde_json::Value;

use crate::line::Line;

/// The `params` of a message.
#[derive(Deserialize)]
pub(super) struct Params<P> {
    pub(super) params: P,
}

/// What the hooks read of `turn/start` params.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TurnStartInput {
    pub(super) thread_id: String,
    #[serde(default)]
    pub(super) input: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ThreadIdOf {
    pub(super) thread_id: String,
}

#[derive(Deserialize)]
pub(super) struct Answer<R> {
    result: R,
}

#[derive(Deserialize)]
pub(super) struct ThreadOf {
    thread: IdOf,
}

#[derive(Deserialize)]
pub(super) struct TurnOf {
    turn: IdOf,
}

#[derive(Deserialize)]
pub(super) struct IdOf {
    id: String,
}

/// The thread an answer (`thread/start`, `thread/resume`, `thread/fork`) names.
pub(super) fn answered_thread(line: &Line) -> Option<String> {
    serde_json::from_slice::<Answer<ThreadOf>>(line.json())
        .ok()
        .map(|answer| answer.result.thread.id)
}

/// The turn a `turn/start` answer names.
pub(super) fn answered_turn(line: &Line) -> Option<String> {
    serde_json::from_slice::<Answer<TurnOf>>(line.json())
        .ok()
        .map(|answer| answer.result.turn.id)
}
