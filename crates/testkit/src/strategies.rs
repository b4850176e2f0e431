//! Proptest strategies for fault scripts and operation sequences, over small domains so that
//! shrinking finds short counterexamples (request and turn numbers 1..=6, short delays).
//!
//! - [`fault`], [`fault_script`]: any fault; [`wire_safe_fault`] only those that leave every
//!   answer well-formed and eventually correct (delays, overload, foreign notifications), for
//!   properties that must still make progress.
//! - [`op`], [`ops`]: what a client and the world do to a fake: start threads, run turns,
//!   resume, read, list, restart the server, damage a rollout while the server is down.
//!   Threads are named by index into the threads started so far ([`ThreadRef`]), so a sequence
//!   stays meaningful whatever ids the server hands out.
//!
//! ```
//! use proptest::prelude::*;
//! use rethread_testkit::strategies::{fault_script, ops};
//! proptest!(|(script in fault_script(), steps in ops(8))| {
//!     let json = serde_json::to_string(&script).unwrap();
//!     prop_assert_eq!(serde_json::from_str::<rethread_fake_appserver::FaultScript>(&json).unwrap(), script);
//!     prop_assert!(steps.len() <= 8);
//! });
//! ```

use proptest::prelude::*;

use rethread_fake_appserver::faults::{Corruption, Fault, FaultScript};
use rethread_fake_appserver::Profile;

/// Any profile.
pub fn profile() -> impl Strategy<Value = Profile> {
    prop_oneof![
        Just(Profile::Current),
        Just(Profile::ReleaseN),
        Just(Profile::PreHistoryMode)
    ]
}

/// Any rollout corruption.
pub fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        Just(Corruption::Empty),
        Just(Corruption::Garbage),
        Just(Corruption::TornTail),
        Just(Corruption::Delete),
    ]
}

fn method() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        Just(Some("thread/resume".to_string())),
        Just(Some("thread/start".to_string())),
        Just(Some("turn/start".to_string())),
        Just(Some("thread/read".to_string())),
    ]
}

/// A fault that keeps the wire usable: answers may be late or overloaded (a bounded number of
/// times), and notifications for other threads may interleave, but every request is
/// eventually answered correctly.
pub fn wire_safe_fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        (method(), 0u64..20).prop_map(|(method, millis)| Fault::Delay { method, millis }),
        (method(), 1u32..3).prop_map(|(method, attempts)| Fault::Overloaded { method, attempts }),
        (1u64..=6).prop_map(|turn| Fault::ForeignNotifications { turn }),
        (0u64..10).prop_map(|millis| Fault::SlowTurn { millis }),
    ]
}

/// Any fault.
pub fn fault() -> impl Strategy<Value = Fault> {
    let n = 1u64..=6;
    prop_oneof![
        wire_safe_fault(),
        (
            proptest::collection::vec("[0-9a-f]{8}", 0..3),
            prop_oneof![Just(-32600i64), Just(-32603), Just(-32001)]
        )
            .prop_map(|(thread_ids, code)| Fault::FailResume {
                thread_ids,
                code,
                message: None
            }),
        n.clone().prop_map(|n| Fault::ExitAtRequest { n }),
        n.clone().prop_map(|turn| Fault::ExitMidTurn { turn }),
        (n.clone(), corruption()).prop_map(|(after_turn, corruption)| Fault::CorruptRollout {
            after_turn,
            corruption
        }),
        n.clone()
            .prop_map(|at_request| Fault::GarbageLine { at_request }),
        (n.clone(), 1usize..(64 * 1024))
            .prop_map(|(at_request, bytes)| Fault::OversizedLine { at_request, bytes }),
        n.clone()
            .prop_map(|at_request| Fault::WrongId { at_request }),
        n.prop_map(|turn| Fault::Approval { turn }),
    ]
}

/// A script of up to four faults.
pub fn fault_script() -> impl Strategy<Value = FaultScript> {
    proptest::collection::vec(fault(), 0..4).prop_map(|faults| FaultScript { faults })
}

/// A script of up to three [`wire_safe_fault`]s.
pub fn wire_safe_fault_script() -> impl Strategy<Value = FaultScript> {
    proptest::collection::vec(wire_safe_fault(), 0..3).prop_map(|faults| FaultScript { faults })
}

/// A thread named by its index among the threads started so far (taken modulo their number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThreadRef(pub usize);

impl ThreadRef {
    /// The index into `threads`, or `None` when none were started.
    pub fn resolve(self, started: usize) -> Option<usize> {
        (started > 0).then(|| self.0 % started)
    }
}

/// One step of a client session against a fake, or of the world around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `thread/start`.
    Start,
    /// `turn/start` on a thread, with a message made from `word`.
    Turn {
        /// Which thread.
        thread: ThreadRef,
        /// Picks the message text.
        word: u8,
    },
    /// `thread/resume`.
    Resume {
        /// Which thread.
        thread: ThreadRef,
        /// Send `excludeTurns: true`.
        exclude_turns: bool,
    },
    /// `thread/read`.
    Read {
        /// Which thread.
        thread: ThreadRef,
        /// Send `includeTurns: true`.
        include_turns: bool,
    },
    /// `thread/list`.
    List,
    /// Kill and restart the server (loaded threads are forgotten).
    Restart,
    /// Restart the server, damaging a rollout while it is down.
    RestartCorrupting {
        /// Which thread.
        thread: ThreadRef,
        /// What to do to its rollout.
        corruption: Corruption,
    },
}

/// Any [`Op`], turns and starts weighted up so sequences build some history.
pub fn op() -> impl Strategy<Value = Op> {
    let thread = (0usize..4).prop_map(ThreadRef);
    prop_oneof![
        3 => Just(Op::Start),
        5 => (thread.clone(), any::<u8>()).prop_map(|(thread, word)| Op::Turn { thread, word }),
        3 => (thread.clone(), any::<bool>()).prop_map(|(thread, exclude_turns)| Op::Resume { thread, exclude_turns }),
        1 => (thread.clone(), any::<bool>()).prop_map(|(thread, include_turns)| Op::Read { thread, include_turns }),
        1 => Just(Op::List),
        2 => Just(Op::Restart),
        1 => (thread, corruption()).prop_map(|(thread, corruption)| Op::RestartCorrupting { thread, corruption }),
    ]
}

/// Up to `max_len` operations.
pub fn ops(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 0..=max_len)
}
