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
