//! What the session hooks remember of the conversation, every part bounded ([`TurnLimits`]):
//! the client's requests whose answers matter, and the turns in progress on the session's
//! thread with their projected rows. Whatever is forgotten is said ([`Forgot`]).

use std::collections::VecDeque;

use rethread_protocol::messages::{KnownItem, ThreadItem, UserInput};
use rethread_protocol::RequestId;
use rethread_runtime::machine::Stored;
use rethread_runtime::projection::project_turn_input;
use serde::Deserialize;
use serde_json::Value;

/// The bounds of what the session hooks keep in memory. Past a bound the oldest entry is
/// forgotten (and said), except a turn's rows: past [`max_rows`](Self::max_rows) or
/// [`max_bytes`](Self::max_bytes) further rows are not recorded (counted and said), and the
/// turn still commits with the rows it kept (the rows only seed a replacement thread).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TurnLimits {
    /// Rows recorded per turn (the user's input counts as one).
    pub max_rows: usize,
    /// Bytes of rows recorded per turn (the rows' JSON).
    pub max_bytes: usize,
    /// Turns in progress followed at once.
    pub max_open_turns: usize,
    /// Client requests awaiting an answer the hooks read (`thread/resume`, `thread/fork`,
    /// later `thread/start`s, `turn/start`; never the session's own start).
    pub max_pending: usize,
}

impl Default for TurnLimits {
    fn default() -> Self {
        TurnLimits {
            max_rows: 1000,
            max_bytes: 4 * 1024 * 1024,
            max_open_turns: 64,
            max_pending: 256,
        }
    }
}

/// Why a client request's answer matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pending {
    /// A thread the client opens itself (`thread/resume`, `thread/fork`, a later
    /// `thread/start`), named by the answer. `stored`: the store's record, read while the
    /// session had no thread yet.
    ClientThread {
        ephemeral: bool,
        stored: Option<Stored>,
        /// The thread a `thread/resume` asked for (canonical): an answer naming another is
        /// not taken.
        asked: Option<String>,
    },
    /// `turn/start` on the session's thread, named by the answer; `input` is its user row.
    TurnStart { input: Vec<UserInput> },
}

/// A turn in progress on the session's thread.
#[derive(Debug, Default)]
pub(crate) struct OpenTurn {
    turn_id: String,
    /// What the client sent with `turn/start`, once its answer named the turn.
    input: Option<Vec<UserInput>>,
    /// The input of its user message items (a turn not started by `turn/start`: a review).
    user_input: Vec<UserInput>,
    /// Rows of the completed items, in order.
    rows: Vec<Value>,
    bytes: usize,
    /// Completed items seen (projected or not).
    items_seen: usize,
    /// Rows not recorded because a limit was reached.
    dropped: usize,
}

impl OpenTurn {
    fn new(turn_id: &str) -> Self {
        let turn_id = turn_id.to_string();
        OpenTurn {
            turn_id,
            ..OpenTurn::default()
        }
    }
}

/// What the tracker had to forget to stay within its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Forgot {
    /// A client request's answer will not be read.
    Request(RequestId),
    /// A turn in progress is no longer followed (it will not be committed).
    Turn(String),
}

impl Forgot {
    /// What was forgotten, for the client and stderr.
    pub(crate) fn message(&self) -> String {
        let what = match self {
            Forgot::Request(id) => format!(
                "the answer to request {id} (a thread it opens is not recorded; a turn it \
                 starts is recorded without its input)"
            ),
            Forgot::Turn(turn) => format!("turn {turn} (it will not be recorded)"),
        };
        format!("rethread is over the session's memory limits and no longer follows {what}.")
    }
}

/// The hooks' memory of the conversation. Every collection is bounded by [`TurnLimits`].
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    limits: TurnLimits,
    pending: VecDeque<(RequestId, Pending)>,
    turns: VecDeque<OpenTurn>,
}

impl Tracker {
    pub(crate) fn new(limits: TurnLimits) -> Self {
        let tracker = Tracker::default();
        Tracker { limits, ..tracker }
    }

    /// Remembers that the answer to the client's request `id` matters.
    pub(crate) fn expect(&mut self, id: RequestId, what: Pending) -> Option<Forgot> {
        self.pending.push_back((id, what));
        if self.pending.len() > self.limits.max_pending.max(1) {
            return self.pending.pop_front().map(|(id, _)| Forgot::Request(id));
        }
        None
    }

    /// Whether any answer is awaited.
    pub(crate) fn awaits_answers(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes what the answer to `id` means, if it matters.
    pub(crate) fn answered(&mut self, id: &RequestId) -> Option<Pending> {
        let at = self.pending.iter().position(|(pending, _)| pending == id)?;
        self.pending.remove(at).map(|(_, what)| what)
    }

    fn turn_mut(&mut self, turn_id: &str) -> (&mut OpenTurn, Option<Forgot>) {
        let mut forgot = None;
        let at = match self.turns.iter().position(|t| t.turn_id == turn_id) {
            Some(at) => at,
            None => {
                self.turns.push_back(OpenTurn::new(turn_id));
                if self.turns.len() > self.limits.max_open_turns.max(1) {
                    forgot = self.turns.pop_front().map(|t| Forgot::Turn(t.turn_id));
                }
                self.turns.len() - 1
            }
        };
        (&mut self.turns[at], forgot)
    }

    /// `turn/start`'s answer named the turn: its input is known.
    pub(crate) fn turn_started(&mut self, turn_id: &str, input: Vec<UserInput>) -> Option<Forgot> {
        let (turn, forgot) = self.turn_mut(turn_id);
        turn.input = Some(input);
        forgot
    }

    /// An `item/completed` on the session's thread: its row kept, within the limits.
    pub(crate) fn item_completed(
        &mut self,
        thread_id: &str,
        turn_id: &str,
        item: &ThreadItem,
    ) -> Option<Forgot> {
        let (max_rows, max_bytes) = (self.limits.max_rows, self.limits.max_bytes);
        let (turn, forgot) = self.turn_mut(turn_id);
        turn.items_seen += 1;
        if let ThreadItem::Known(KnownItem::UserMessage { content, .. }) = item {
            let size = serde_json::to_string(content).map_or(0, |json| json.len());
            if turn.bytes + size <= max_bytes {
                turn.bytes += size;
                turn.user_input.extend(user_input(content));
            }
            return forgot;
        }
        if let Some(row) = item_row(thread_id, turn_id, item) {
            push_row(turn, row, max_rows, max_bytes);
        }
        forgot
    }

    /// Stops following the turn and returns what was kept of it.
    pub(crate) fn take_turn(&mut self, turn_id: &str) -> Option<OpenTurn> {
        let at = self.turns.iter().position(|t| t.turn_id == turn_id)?;
        self.turns.remove(at)
    }
}

/// Keeps `row` within `max_rows` (a place kept for the user row, which a turn without user
/// input does not have) and `max_bytes`.
fn push_row(turn: &mut OpenTurn, row: Value, max_rows: usize, max_bytes: usize) {
    let size = row.to_string().len();
    if turn.rows.len() + 1 >= max_rows || turn.bytes + size > max_bytes {
        turn.dropped += 1;
        return;
    }
    turn.bytes += size;
    turn.rows.push(row);
}

/// The rows of a completed turn: the user's input, then the rows of its items, as streamed, or
/// from `completed_items` when none were (as the runtime's own turns do), within the limits.
pub(crate) fn turn_rows(
    thread_id: &str,
    turn_id: &str,
    open: Option<OpenTurn>,
    completed_items: &[ThreadItem],
    limits: &TurnLimits,
) -> (Vec<Value>, usize) {
    let mut turn = open.unwrap_or_else(|| OpenTurn::new(turn_id));
    if turn.items_seen == 0 {
        for item in completed_items {
            if let ThreadItem::Known(KnownItem::UserMessage { content, .. }) = item {
                turn.user_input.extend(user_input(content));
            } else if let Some(row) = item_row(thread_id, turn_id, item) {
                push_row(&mut turn, row, limits.max_rows, limits.max_bytes);
            }
        }
    }
    // What `turn/start` sent, else the turn's user messages.
    let input = turn.input.unwrap_or(turn.user_input);
    let mut rows = project_turn_input(thread_id, turn_id, &input, &[]);
    rows.append(&mut turn.rows);
    (rows, turn.dropped)
}

/// The row of one item, as [`project_turn_input`] makes it (at most one per item; no input, so no
/// user row): projected as they complete, the items give the rows projecting them all at the
/// end would (tested below), without being kept until the turn completes.
pub(crate) fn item_row(thread_id: &str, turn_id: &str, item: &ThreadItem) -> Option<Value> {
    project_turn_input(thread_id, turn_id, &[], std::slice::from_ref(item)).pop()
}

/// The pieces of a user input array (`turn/start`'s `input`, a user message's `content`) a
/// row keeps, as every driver's rows keep them (text, images); others (mentions, skills) are
/// left out.
pub(crate) fn user_input(input: &[Value]) -> Vec<UserInput> {
    let piece = |piece: &Value| UserInput::deserialize(piece).ok();
    input.iter().filter_map(piece).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rethread_runtime::projection::project_turn;
    use serde_json::json;

    fn items() -> Vec<ThreadItem> {
        serde_json::from_value(json!([
            {"type": "userMessage", "id": "u", "content": [{"type": "text", "text": "hi"}]},
            {"type": "reasoning", "id": "r"},
            {"type": "commandExecution", "id": "c", "command": "ls", "cwd": "/", "status": "completed", "commandActions": []},
            {"type": "agentMessage", "id": "a1", "text": "one"},
            {"type": "webSearch", "id": "w", "query": "rust"},
            {"type": "plan", "id": "p"},
            {"type": "agentMessage", "id": "a2", "text": "two"}
        ]))
        .unwrap()
    }

    #[test]
    fn rows_item_by_item_are_the_projection_of_the_whole_turn() {
        let items = items();
        let whole = project_turn("t", "u1", "hi", &items);
        let mut tracker = Tracker::new(TurnLimits::default());
        for item in &items {
            tracker.item_completed("t", "u1", item);
        }
        let open = tracker.take_turn("u1");
        let (rows, dropped) = turn_rows("t", "u1", open, &[], &TurnLimits::default());
        assert_eq!(rows, whole);
        assert_eq!(dropped, 0);
        // Only on completion: the same rows.
        let (rows, _) = turn_rows("t", "u1", None, &items, &TurnLimits::default());
        assert_eq!(rows, whole);
    }

    /// `thread/compact/start` runs a turn no `turn/start` opened, with no user message.
    #[test]
    fn a_compaction_turn_has_no_user_row() {
        let compaction: Vec<ThreadItem> =
            serde_json::from_value(json!([{"type": "contextCompaction", "id": "c"}])).unwrap();
        let mut tracker = Tracker::new(TurnLimits::default());
        tracker.item_completed("t", "c1", &compaction[0]);
        let limits = TurnLimits::default();
        let (rows, _) = turn_rows("t", "c1", tracker.take_turn("c1"), &[], &limits);
        assert_eq!(rows, Vec::<Value>::new());
        let (rows, _) = turn_rows("t", "c1", None, &compaction, &limits);
        assert_eq!(rows, Vec::<Value>::new());
    }

    #[test]
    fn the_input_of_turn_start_wins_over_the_user_message() {
        let mut tracker = Tracker::new(TurnLimits::default());
        tracker.turn_started("u1", vec![UserInput::text("what was sent")]);
        tracker.item_completed("t", "u1", &items()[0]);
        let (rows, _) = turn_rows(
            "t",
            "u1",
            tracker.take_turn("u1"),
            &[],
            &TurnLimits::default(),
        );
        assert_eq!(rows[0]["text"], "what was sent");
    }

    #[test]
    fn rows_past_the_limits_are_dropped_and_counted() {
        let limits = TurnLimits {
            max_rows: 3,
            ..TurnLimits::default()
        };
        let mut tracker = Tracker::new(limits.clone());
        for item in &items() {
            tracker.item_completed("t", "u1", item);
        }
        let (rows, dropped) = turn_rows("t", "u1", tracker.take_turn("u1"), &[], &limits);
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert_eq!(dropped, 2);
        let big = ThreadItem::Known(KnownItem::AgentMessage {
            id: "big".into(),
            text: "x".repeat(2000),
        });
        let limits = TurnLimits {
            max_bytes: 1000,
            ..TurnLimits::default()
        };
        let mut tracker = Tracker::new(limits.clone());
        tracker.item_completed("t", "u1", &big);
        tracker.item_completed("t", "u1", &items()[3]);
        let (rows, dropped) = turn_rows("t", "u1", tracker.take_turn("u1"), &[], &limits);
        // No user input (no `turn/start`, no user message): no user row.
        assert_eq!((rows.len(), dropped), (1, 1));
        assert_eq!(rows[0]["text"], "one");
    }

    #[test]
    fn every_collection_is_bounded() {
        let limits = TurnLimits {
            max_open_turns: 2,
            max_pending: 2,
            ..TurnLimits::default()
        };
        let opens = || Pending::ClientThread {
            ephemeral: false,
            stored: None,
            asked: None,
        };
        let mut tracker = Tracker::new(limits);
        assert_eq!(tracker.expect(RequestId::Integer(1), opens()), None);
        assert_eq!(tracker.expect(RequestId::Integer(2), opens()), None);
        assert_eq!(
            tracker.expect(RequestId::Integer(3), opens()),
            Some(Forgot::Request(RequestId::Integer(1)))
        );
        assert_eq!(tracker.answered(&RequestId::Integer(1)), None);
        assert_eq!(tracker.answered(&RequestId::Integer(3)), Some(opens()));
        tracker.turn_started("1", Vec::new());
        tracker.turn_started("2", Vec::new());
        assert_eq!(
            tracker.turn_started("3", Vec::new()),
            Some(Forgot::Turn("1".into()))
        );
        assert!(tracker.take_turn("1").is_none());
        assert!(tracker.take_turn("3").is_some());
    }

    #[test]
    fn user_input_keeps_the_pieces_a_row_keeps() {
        let input = [
            json!({"type": "text", "text": "a"}),
            json!({"type": "image", "url": "u"}),
            json!({"type": "mention", "name": "m", "path": "p"}),
            json!({"type": "image"}),
        ];
        assert_eq!(
            user_input(&input),
            [UserInput::text("a"), UserInput::image_url("u")]
        );
    }
}
