//! The model side of the fake: what the model answers and the conversation it saw.
//!
//! Shared with the Responses-API stand-in of `rethread-testkit`, so the in-process fake and
//! the real codex driven offline give the same deterministic replies.

use std::collections::VecDeque;

/// What the model answers (the fake's and the Responses-API stand-in's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `echo: <the last user text of the conversation>` (the default).
    Echo,
    /// Always this text.
    Fixed(String),
    /// These texts in order, one per model request; [`Reply::Echo`] once exhausted.
    Script(VecDeque<String>),
}

impl Reply {
    /// The next reply to `conversation` (advances a [`Reply::Script`]).
    pub fn next_reply(&mut self, conversation: &[ConversationMessage]) -> String {
        match self {
            Reply::Echo => echo_reply(conversation),
            Reply::Fixed(text) => text.clone(),
            Reply::Script(queue) => queue
                .pop_front()
                .unwrap_or_else(|| echo_reply(conversation)),
        }
    }
}

/// How the model delivers its answer, which decides the notifications codex sends for it
/// (measured on 0.171.0, 0.169.0 and 0.144.6): text streamed in pieces (`item/agentMessage/delta`
/// per piece, between the agent message's `item/started` and `item/completed`), or only the
/// completed message (no delta at all). The fake's model and the Responses-API stand-in stream
/// the same pieces ([`stream_pieces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnswerShape {
    /// The text in two deltas, then the completed message (the default: models stream).
    #[default]
    Streamed,
    /// Only the completed message.
    Whole,
}

impl std::str::FromStr for AnswerShape {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "streamed" => Ok(AnswerShape::Streamed),
            "whole" => Ok(AnswerShape::Whole),
            other => Err(format!(
                "unknown answer shape `{other}` (streamed or whole)"
            )),
        }
    }
}

/// The pieces a streamed answer comes in: `text` cut in two on the character boundary at its
/// middle (what the stand-in streams, and so what codex sends as deltas).
pub fn stream_pieces(text: &str) -> [&str; 2] {
    let cut = text
        .char_indices()
        .map(|(at, _)| at)
        .nth(text.chars().count() / 2)
        .unwrap_or(text.len());
    let (first, second) = text.split_at(cut);
    [first, second]
}

/// The deterministic echo reply both the stand-in and the fake app-server's model give:
/// `echo: <last user text>` (or `echo:` when there is none).
pub fn echo_reply(conversation: &[ConversationMessage]) -> String {
    match conversation.iter().rev().find(|m| m.role == "user") {
        Some(message) => format!("echo: {}", message.text),
        None => "echo:".to_string(),
    }
}

/// One message of a conversation as the model saw it: a role and its text parts joined.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConversationMessage {
    /// `user`, `assistant`, `developer`, `system`.
    pub role: String,
    /// The text parts of the message, joined with `\n`.
    pub text: String,
}
