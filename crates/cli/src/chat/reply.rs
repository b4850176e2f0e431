//! The reply of `chat` as it is written: agent message deltas go to stdout as they arrive,
//! so that a person sees the reply grow. What ends up printed is the turn's reply: each agent
//! message once, in order, separated by a blank line (as `TurnReport::reply` joins them),
//! then a newline.
//!
//! A message codex completes without deltas is printed whole when it completes; one whose
//! final text does not continue what its deltas printed (never seen from codex) is printed
//! again, whole, on a new line. A turn that fails after part of the reply was printed leaves
//! that part, ended by a newline; the exit code says the turn was not committed.

use std::io::Write;

use rethread_protocol::messages::{KnownItem, ThreadItem};
use rethread_runtime::TurnEvent;

/// Whether [`ReplyPrinter::show`] may print something for `event` (the reply starts).
pub(crate) fn shows_text(event: &TurnEvent) -> bool {
    matches!(
        event,
        TurnEvent::AgentMessageDelta { .. }
            | TurnEvent::ItemCompleted(ThreadItem::Known(KnownItem::AgentMessage { .. }))
    )
}

/// Prints a reply as its events arrive. Write errors (a closed stdout) are ignored: the exit
/// code still reports the turn.
pub(crate) struct ReplyPrinter<W: Write> {
    out: W,
    /// The agent message being printed and what was printed of it; `None` before the reply.
    current: Option<(String, String)>,
    /// Whether the closing newline was written.
    finished: bool,
}

impl<W: Write> ReplyPrinter<W> {
    pub(crate) fn new(out: W) -> Self {
        let (current, finished) = (None, false);
        ReplyPrinter {
            out,
            current,
            finished,
        }
    }

    /// Shows one event of the running turn.
    pub(crate) fn show(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::AgentMessageDelta { item_id, delta } => {
                self.begin(item_id);
                if let Some((_, printed)) = &mut self.current {
                    printed.push_str(delta);
                }
                self.write(delta);
            }
            TurnEvent::ItemCompleted(ThreadItem::Known(KnownItem::AgentMessage { id, text })) => {
                self.begin(id);
                let printed = self.current.take().map(|(_, printed)| printed);
                match text.strip_prefix(printed.unwrap_or_default().as_str()) {
                    Some(rest) => self.write(rest),
                    None => {
                        self.write("\n");
                        self.write(text);
                    }
                }
                self.current = Some((id.clone(), text.clone()));
            }
            _ => {}
        }
    }

    /// The turn completed with `reply`: prints it if nothing of it was streamed, then the
    /// closing newline.
    pub(crate) fn finish(&mut self, reply: &str) {
        if self.current.is_none() {
            self.write(reply);
            self.current = Some((String::new(), reply.to_string()));
        }
        self.end();
    }

    /// Ends a partly printed reply with a newline (the turn failed or was interrupted).
    fn end(&mut self) {
        if self.current.is_some() && !self.finished {
            self.finished = true;
            self.write("\n");
        }
    }

    /// Starts printing agent message `id`, after a blank line when it is not the first.
    fn begin(&mut self, id: &str) {
        match &self.current {
            Some((current, _)) if current == id => return,
            Some(_) => self.write("\n\n"),
            None => {}
        }
        self.current = Some((id.to_string(), String::new()));
    }

    fn write(&mut self, text: &str) {
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
    }
}

impl<W: Write> Drop for ReplyPrinter<W> {
    fn drop(&mut self) {
        // An interrupted turn drops the printer mid-reply: the shell prompt or the error line
        // must not continue the reply's last line.
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(item: &str, text: &str) -> TurnEvent {
        TurnEvent::AgentMessageDelta {
            item_id: item.into(),
            delta: text.into(),
        }
    }

    fn message(id: &str, text: &str) -> TurnEvent {
        TurnEvent::ItemCompleted(ThreadItem::Known(KnownItem::AgentMessage {
            id: id.into(),
            text: text.into(),
        }))
    }

    fn printed(events: &[TurnEvent], reply: Option<&str>) -> String {
        let mut out = Vec::new();
        {
            let mut printer = ReplyPrinter::new(&mut out);
            for event in events {
                printer.show(event);
            }
            if let Some(reply) = reply {
                printer.finish(reply);
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn deltas_print_the_reply_once_with_messages_apart() {
        let events = [
            delta("m1", "hel"),
            delta("m1", "lo"),
            message("m1", "hello"),
            message("m2", "second, without deltas"),
            delta("m3", "third "),
            message("m3", "third part"),
        ];
        assert_eq!(
            printed(
                &events,
                Some("hello\n\nsecond, without deltas\n\nthird part")
            ),
            "hello\n\nsecond, without deltas\n\nthird part\n"
        );
    }

    #[test]
    fn a_reply_without_events_prints_at_the_end_and_a_failure_ends_the_line() {
        assert_eq!(printed(&[], Some("all at once")), "all at once\n");
        assert_eq!(printed(&[], Some("")), "\n");
        assert_eq!(printed(&[delta("m1", "half")], None), "half\n");
        assert_eq!(printed(&[], None), "");
    }

    #[test]
    fn a_final_text_that_rewrites_the_deltas_is_printed_again() {
        assert_eq!(
            printed(
                &[delta("m1", "draft"), message("m1", "final")],
                Some("final")
            ),
            "draft\nfinal\n"
        );
    }
}
