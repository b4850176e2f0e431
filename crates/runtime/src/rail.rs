//! The status rail: one sink of typed events that every surface (CLI, TUI, gateway) renders.

use rethread_store::Unpoisoned;
use std::fmt;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What kind of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StatusKind {
    /// A change of the conversation's lifecycle the user must see (e.g. the fallback notice).
    Lifecycle,
    /// Something went wrong but the turn goes on (a declined approval, a bad line).
    Warn,
    /// Informational.
    Info,
}

/// One event on the rail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusEvent {
    /// The kind.
    pub kind: StatusKind,
    /// A human-readable, one-line message.
    pub message: String,
    /// Structured fields (thread ids, reasons, ...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub fields: Map<String, Value>,
}

impl StatusEvent {
    /// An event with no fields.
    pub fn new(kind: StatusKind, message: impl Into<String>) -> Self {
        StatusEvent {
            kind,
            message: message.into(),
            fields: Map::new(),
        }
    }

    /// Adds a structured field.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    /// One line for people (stderr): the message, then its fields, `MESSAGE (key: value, ...)`.
    pub fn described(&self) -> String {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(key, value)| match value {
                Value::String(text) => format!("{key}: {text}"),
                other => format!("{key}: {other}"),
            })
            .collect();
        format!("{} ({})", self.message, fields.join(", "))
    }
}

/// Where rail events go. Implementations must not block: they are called from async code.
pub trait StatusSink: Send + Sync + fmt::Debug {
    /// Receives one event.
    fn emit(&self, event: StatusEvent);
}

/// A cheap, clonable handle on a [`StatusSink`].
///
/// ```
/// use rethread_runtime::{StatusRail, StatusEvent, StatusKind};
/// let (rail, recorded) = StatusRail::recording();
/// rail.emit(StatusEvent::new(StatusKind::Info, "hello"));
/// assert_eq!(recorded.events()[0].message, "hello");
/// ```
#[derive(Debug, Clone)]
pub struct StatusRail(Arc<dyn StatusSink>);

impl StatusRail {
    /// A rail over `sink`.
    pub fn new(sink: impl StatusSink + 'static) -> Self {
        StatusRail(Arc::new(sink))
    }

    /// A rail that forwards events to `tracing` only.
    pub fn tracing() -> Self {
        StatusRail::new(TracingSink)
    }

    /// A rail that records every event, and the handle to read them.
    pub fn recording() -> (Self, RecordedEvents) {
        let recorded = RecordedEvents::default();
        (StatusRail::new(recorded.clone()), recorded)
    }

    /// Emits an event (also logged through `tracing`).
    pub fn emit(&self, event: StatusEvent) {
        tracing::debug!(kind = ?event.kind, message = %event.message, "status");
        self.0.emit(event);
    }
}

impl Default for StatusRail {
    fn default() -> Self {
        StatusRail::tracing()
    }
}

#[derive(Debug)]
struct TracingSink;

impl StatusSink for TracingSink {
    fn emit(&self, event: StatusEvent) {
        match event.kind {
            StatusKind::Warn => tracing::warn!("{}", event.message),
            _ => tracing::info!("{}", event.message),
        }
    }
}

/// Events recorded by [`StatusRail::recording`].
#[derive(Debug, Clone, Default)]
pub struct RecordedEvents(Arc<Mutex<Vec<StatusEvent>>>);

impl RecordedEvents {
    /// A copy of every event so far.
    pub fn events(&self) -> Vec<StatusEvent> {
        self.0.lock().unpoisoned().clone()
    }

    /// The messages of the events of `kind`, in order.
    pub fn messages(&self, kind: StatusKind) -> Vec<String> {
        self.0
            .lock()
            .unpoisoned()
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.message.clone())
            .collect()
    }

    /// Removes and returns every event so far.
    pub fn take(&self) -> Vec<StatusEvent> {
        std::mem::take(&mut *self.0.lock().unpoisoned())
    }
}

impl StatusSink for RecordedEvents {
    fn emit(&self, event: StatusEvent) {
        self.0.lock().unpoisoned().push(event);
    }
}
