//! The session machine's rules as tables: each row is an event and the actions it must
//! produce, wire params as literal JSON (each action's `Display`).

use std::time::Duration;

use rethread_protocol::{ResumeFailure, RpcError};
use rethread_runtime::machine::{
    CommitFailure, LeaseLostTo, MachineOptions, SessionMachine, Stored,
};
use rethread_runtime::{MirrorReport, RestoreFailure, Restored};
use serde_json::json;

/// One event fed to the machine.
enum Event {
    Open,
    Session(Stored),
    Resumed,
    ResumeError(i64, &'static str),
    ResumeTimeout,
    ResumeExited(&'static str),
    WaitOver,
    GivenUp,
    Delivered,
    Transcript(Result<Vec<serde_json::Value>, &'static str>),
    Started(&'static str),
    /// The driver's step failed (its error is the driver's).
    Failed,
    ClientThread(&'static str, bool, Stored),
    TurnCompleted(&'static str),
    /// A turn on the thread failed with codex's error message.
    TurnFailed(&'static str, &'static str),
    Committed(&'static str, Option<CommitFailure>),
    LeaseLost(LeaseLostTo),
    Retire,
    /// A restore's answer; an error is one that may pass (a store or disk hiccup).
    Restore(Result<Restored, &'static str>),
    /// A restore that failed for good (a damaged mirror, a path a restore refuses).
    RestoreRefused(&'static str),
    Mirrored(&'static str, MirrorReport),
}
use Event::*;

fn apply(machine: &mut SessionMachine, event: Event) -> Vec<String> {
    match event {
        Open => machine.open(),
        Session(stored) => machine.handle_session(stored),
        Resumed => machine.handle_resumed(),
        ResumeError(code, message) => machine.handle_resume_error(&RpcError::new(code, message)),
        ResumeTimeout => machine.handle_resume_timeout(Duration::from_secs(60)),
        ResumeExited(stderr) => machine.handle_resume_exited(stderr),
        WaitOver => machine.handle_wait_over(),
        GivenUp => machine.handle_given_up(),
        Delivered => machine.handle_notice_delivered(),
        Transcript(rows) => machine.handle_transcript(rows.map_err(str::to_string)),
        Started(thread) => machine.handle_started(thread),
        Failed => machine.handle_failed(),
        ClientThread(thread, ephemeral, stored) => {
            machine.handle_client_thread(thread, ephemeral, Some(&stored))
        }
        TurnCompleted(thread) => machine.handle_turn_completed(thread, vec![json!({}), json!({})]),
        TurnFailed(thread, message) => machine.handle_turn_failed(thread, message),
        Committed(thread, error) => machine.handle_committed(thread, error.map_or(Ok(()), Err)),
        LeaseLost(to) => machine.handle_lease_lost(to),
        Retire => machine.handle_retire(),
        Restore(restored) => {
            machine.handle_restored(restored.map_err(|message| RestoreFailure::new(message, true)))
        }
        RestoreRefused(message) => {
            machine.handle_restored(Err(RestoreFailure::new(message, false)))
        }
        Mirrored(thread, report) => machine.handle_mirrored(thread, &report),
    }
    std::iter::from_fn(|| machine.poll())
        .map(|action| action.to_string())
        .collect()
}

/// Runs the table on a fresh machine for session `s`, checking each row's actions.
fn table(options: MachineOptions, rows: Vec<(Event, &[&str])>) -> SessionMachine {
    let mut machine = SessionMachine::new("s", options);
    for (i, (event, want)) in rows.into_iter().enumerate() {
        let got = apply(&mut machine, event);
        assert_eq!(got, want, "row {i}");
    }
    machine
}

fn bound(thread: &str) -> Stored {
    Stored::Bound {
        thread_id: thread.into(),
    }
}

fn given_up(thread: &str, reason: ResumeFailure, notice_delivered: bool) -> Stored {
    Stored::GivenUp {
        thread_id: thread.into(),
        reason,
        message: "no rollout found for thread id t1".into(),
        notice_delivered,
    }
}

/// The rules without the rollout mirror: the rows below that are not about it.
fn rules() -> MachineOptions {
    let mut options = MachineOptions::default();
    options.mirror = false;
    options
}

fn no_seed() -> MachineOptions {
    let mut options = rules();
    options.seed = None;
    options
}

const GONE: &str = "no rollout found for thread id t1";
const RESUME_T1: &str = r#"resume {"threadId":"t1","excludeTurns":true}"#;

#[test]
fn a_session_without_a_thread_starts_one() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(Stored::Unbound), &["start"]),
            (
                Started("t1"),
                &[r#"opened {"outcome":"started","thread_id":"t1"}"#],
            ),
            (TurnCompleted("t1"), &["commit t1 2"]),
            (Committed("t1", None), &[]),
        ],
    );
}

#[test]
fn a_bound_thread_is_resumed_before_any_turn_and_nothing_is_said() {
    let machine = table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (TurnCompleted("t1"), &["commit t1 2"]),
        ],
    );
    assert_eq!(machine.thread_id(), Some("t1"));
}

#[test]
fn a_lost_thread_is_given_up_then_said_once_then_replaced_seeded() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeError(-32600, GONE), &["give_up t1 gone"]),
            (GivenUp, &["notice t1 gone", "read_transcript 40"]),
            (Delivered, &["mark_delivered t1"]),
            (Delivered, &[]),
            (
                Transcript(Ok(vec![json!({"role": "user", "text": "hi"})])),
                &["start seeded"],
            ),
            (
                Started("t2"),
                &[
                    r#"opened {"outcome":"fell_back","thread_id":"t2","previous_thread_id":"t1","reason":"gone","message":"no rollout found for thread id t1","seeded":true}"#,
                ],
            ),
            (TurnCompleted("t2"), &["commit t2 2"]),
        ],
    );
}

/// A codex that answers the replacement's `thread/start` with the thread just given up (found
/// by the `runtime_hostile` fuzz target) has not started a new thread: the open fails, and no
/// turn runs on a thread whose binding can never be published again.
#[test]
fn a_replacement_that_is_the_lost_thread_fails_the_open() {
    table(
        no_seed(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeError(-32600, GONE), &["give_up t1 gone"]),
            (GivenUp, &["notice t1 gone", "start"]),
            (Started("t1"), &["open_failed internal"]),
        ],
    );
}

#[test]
fn every_loss_reason_gives_up_and_nothing_else_does() {
    let cases: [(i64, &str, Option<&str>); 5] = [
        (-32600, GONE, Some("gone")),
        (
            -32601,
            "paginated_threads is not supported yet",
            Some("incompatible"),
        ),
        (
            -32603,
            "failed to read thread: thread-store internal error: failed to read session metadata",
            Some("unreadable"),
        ),
        (-32600, "thread t1 already has an active writer", None),
        (-32000, "something new", None),
    ];
    for (code, message, lost) in cases {
        let mut machine = SessionMachine::new("s", rules());
        apply(&mut machine, Open);
        apply(&mut machine, Session(bound("t1")));
        let got = apply(&mut machine, ResumeError(code, message));
        match lost {
            Some(reason) => assert_eq!(got, [format!("give_up t1 {reason}")], "{message}"),
            None => assert!(!got[0].starts_with("give_up"), "{message}: {got:?}"),
        }
    }
}

#[test]
fn a_capability_refusal_resends_without_exclude_turns_and_is_never_a_loss() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                ResumeError(
                    -32600,
                    "thread/resume.excludeTurns requires experimentalApi capability",
                ),
                &[r#"resume {"threadId":"t1"}"#],
            ),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
        ],
    );
}

#[test]
fn temporary_failures_back_off_then_fail_with_the_binding_kept() {
    let overloaded = "Server overloaded; retry later.";
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeError(-32001, overloaded), &["wait 200ms"]),
            (WaitOver, &[RESUME_T1]),
            (ResumeTimeout, &["wait 400ms"]),
            (WaitOver, &[RESUME_T1]),
            (ResumeError(-32001, overloaded), &["wait 800ms"]),
            (WaitOver, &[RESUME_T1]),
            (
                ResumeError(-32001, overloaded),
                &["open_failed resume_unavailable"],
            ),
            // Nothing was written: the next open judges the thread again.
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
        ],
    );
    let mut options = rules();
    options.transient_retries = 0;
    table(
        options,
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                ResumeError(-32600, "thread t1 already has an active writer"),
                &["open_failed thread_busy"],
            ),
        ],
    );
}

#[test]
fn an_unknown_resume_error_stops_at_once() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                ResumeError(-32000, "something new"),
                &["open_failed resume_failed"],
            ),
        ],
    );
}

/// `rethread exec` resumes by starting `codex exec ... resume <id>`; a process that exits
/// before `thread.started` answers the resume. What codex wrote on stderr is judged as the
/// same error on the wire: lost, temporary (retried, then the binding kept), or anything else
/// (stopped, the binding kept). An exit that names no resume error never loses the thread.
#[test]
fn a_resume_answered_by_a_process_exiting_is_judged_by_what_codex_wrote() {
    const GONE_EXIT: &str = "Reading prompt from stdin...\nError: thread/resume: thread/resume \
        failed: no rollout found for thread id t1 (code -32600)\n\nStack backtrace:\n  0: <unknown>\n";
    const BUSY_EXIT: &str = "Error: thread/resume: thread/resume failed: thread t1 already has \
        an active writer (code -32600)\n";
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeExited(GONE_EXIT), &["give_up t1 gone"]),
            (GivenUp, &["notice t1 gone", "read_transcript 40"]),
        ],
    );
    let mut options = rules();
    options.transient_retries = 1;
    table(
        options,
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeExited(BUSY_EXIT), &["wait 200ms"]),
            (WaitOver, &[RESUME_T1]),
            (ResumeExited(BUSY_EXIT), &["open_failed thread_busy"]),
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            // Bad arguments, a crash, no stderr: not evidence of a lost thread.
            (
                ResumeExited("error: unexpected argument '--bogus' found\n"),
                &["open_failed resume_failed"],
            ),
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeExited(""), &["open_failed resume_failed"]),
        ],
    );
}

/// An answer that comes when the machine waits for another one (a late or stray answer)
/// changes nothing.
#[test]
fn an_answer_out_of_turn_changes_nothing() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (Started("t9"), &[]),
            (GivenUp, &[]),
            (Transcript(Ok(Vec::new())), &[]),
            (WaitOver, &[]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
        ],
    );
}

/// A resume's answer that comes when no resume is in flight (a late or stray one) changes
/// nothing: the open under way goes on. (It used to reset the machine to idle, so the start's
/// answer that followed was dropped and the open never ended.)
#[test]
fn a_resume_answer_outside_a_resume_changes_nothing() {
    const GONE_EXIT: &str = "Error: thread/resume: thread/resume failed: no rollout found for \
        thread id t1 (code -32600)\n";
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(Stored::Unbound), &["start"]),
            (ResumeExited(GONE_EXIT), &[]),
            (ResumeError(-32600, GONE), &[]),
            (ResumeTimeout, &[]),
            (Resumed, &[]),
            (WaitOver, &[]),
            (GivenUp, &[]),
            (Transcript(Ok(Vec::new())), &[]),
            (
                Started("t2"),
                &[r#"opened {"outcome":"started","thread_id":"t2"}"#],
            ),
        ],
    );
}

#[test]
fn a_failed_give_up_says_nothing_and_keeps_the_binding() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeError(-32600, GONE), &["give_up t1 gone"]),
            (Failed, &["open_failed failed"]),
        ],
    );
}

#[test]
fn a_notice_an_earlier_process_did_not_deliver_is_said_with_its_reason() {
    table(
        no_seed(),
        vec![
            (Open, &["read_session"]),
            (
                Session(given_up("t1", ResumeFailure::Incompatible, false)),
                &["notice t1 incompatible pending", "start"],
            ),
            (Delivered, &["mark_delivered t1"]),
            (
                Started("t2"),
                &[
                    r#"opened {"outcome":"fell_back","thread_id":"t2","previous_thread_id":"t1","reason":"incompatible","message":"no rollout found for thread id t1","seeded":false}"#,
                ],
            ),
        ],
    );
}

#[test]
fn a_delivered_notice_is_never_said_again() {
    // The fallback's turn failed (or its process died) after the user had the notice: the
    // next open starts another seeded replacement and says nothing.
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (
                Session(given_up("t1", ResumeFailure::Gone, true)),
                &["read_transcript 40"],
            ),
            (
                Transcript(Ok(vec![json!({"role": "user", "text": "hi"})])),
                &["start seeded"],
            ),
            (
                Started("t3"),
                &[r#"opened {"outcome":"started","thread_id":"t3"}"#],
            ),
        ],
    );
}

#[test]
fn a_notice_delivered_in_this_process_is_not_said_again_when_its_record_failed() {
    // The user had the notice, but the store did not take its record (the mark's write
    // failed: only logged), and the replacement's start failed. The retry in the same process
    // reads the notice as pending: it is not said again, and its record is tried once more.
    table(
        no_seed(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (ResumeError(-32600, GONE), &["give_up t1 gone"]),
            (GivenUp, &["notice t1 gone", "start"]),
            (Delivered, &["mark_delivered t1"]),
            (Failed, &["open_failed failed"]),
            (Open, &["read_session"]),
            (
                Session(given_up("t1", ResumeFailure::Gone, false)),
                &["mark_delivered t1", "start"],
            ),
            (Delivered, &[]),
            (
                Started("t2"),
                &[
                    r#"opened {"outcome":"fell_back","thread_id":"t2","previous_thread_id":"t1","reason":"gone","message":"no rollout found for thread id t1","seeded":false}"#,
                ],
            ),
        ],
    );
}

#[test]
fn an_unreadable_transcript_costs_only_the_seed() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (
                Session(given_up("t1", ResumeFailure::Gone, true)),
                &["read_transcript 40"],
            ),
            (
                Transcript(Err("disk on fire")),
                &[
                    "say Could not read the transcript to seed the new thread: disk on fire",
                    "start",
                ],
            ),
        ],
    );
}

#[test]
fn only_the_sessions_own_thread_is_committed() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (Resumed, &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#]),
            // A second thread the client opened beside it: not recorded, said once.
            (
                ClientThread("t9", false, bound("t1")),
                &["say rethread keeps this session on thread t1; thread t9 is not recorded and will not be resumed after a restart."],
            ),
            (TurnCompleted("t9"), &[]),
            // An ephemeral one: never bound, nothing said.
            (ClientThread("e1", true, bound("t1")), &[]),
            (TurnCompleted("e1"), &[]),
            (TurnCompleted("t1"), &["commit t1 2"]),
        ],
    );
}

#[test]
fn a_thread_the_client_opens_first_is_the_sessions_only_when_it_may_be() {
    // Unbound: the client's own thread becomes the session's.
    table(
        rules(),
        vec![
            (ClientThread("c1", false, Stored::Unbound), &[]),
            (TurnCompleted("c1"), &["commit c1 2"]),
        ],
    );
    // Bound to another thread: the binding stays; the client's thread is not recorded.
    table(
        rules(),
        vec![
            (
                ClientThread("c1", false, bound("t1")),
                &["say rethread does not record thread c1 for this session: the session is bound to another thread, which a thread/start resumes."],
            ),
            (TurnCompleted("c1"), &[]),
        ],
    );
    // The bound thread itself: it is the session's; a pending notice is said with it.
    table(
        rules(),
        vec![
            (ClientThread("t1", false, bound("t1")), &[]),
            (TurnCompleted("t1"), &["commit t1 2"]),
        ],
    );
    table(
        rules(),
        vec![(
            ClientThread("c2", false, given_up("t1", ResumeFailure::Gone, false)),
            &["notice t1 gone pending"],
        )],
    );
}

#[test]
fn a_lost_lease_stops_recording_and_is_said_once_with_its_cause() {
    let taken = CommitFailure::LeaseLost(LeaseLostTo::Another {
        holder: "host b pid 7".into(),
    });
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(Stored::Unbound), &["start"]),
            (Started("t1"), &[r#"opened {"outcome":"started","thread_id":"t1"}"#]),
            (TurnCompleted("t1"), &["commit t1 2"]),
            (
                Committed("t1", Some(taken)),
                &["say rethread lost this session to another process (host b pid 7): turns on this connection are no longer recorded."],
            ),
            (TurnCompleted("t1"), &[]),
            (LeaseLost(LeaseLostTo::Forgotten), &[]),
        ],
    );
    table(
        rules(),
        vec![(
            LeaseLost(LeaseLostTo::Forgotten),
            &["say rethread: this session was forgotten (deleted from the store): turns on this connection are no longer recorded."],
        )],
    );
}

#[test]
fn a_thread_of_another_session_is_refused_at_commit() {
    let taken = CommitFailure::ThreadTaken {
        session_id: "other".into(),
    };
    table(
        rules(),
        vec![
            (ClientThread("t1", false, Stored::Unbound), &[]),
            (TurnCompleted("t1"), &["commit t1 2"]),
            (
                Committed("t1", Some(taken)),
                &["say thread t1 belongs to rethread session other; it is not recorded for this session."],
            ),
        ],
    );
}

#[test]
fn the_hosts_own_retire_ends_the_thread_without_a_notice_and_the_next_open_reads_again() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (Retire, &["retire t1"]),
            (Retire, &[]),
            (Open, &["read_session"]),
            (Session(Stored::Unbound), &["start"]),
        ],
    );
}

#[test]
fn reopening_on_a_new_connection_resumes_the_same_thread() {
    // A host whose codex died opens again: the machine reads the store as the first time.
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(Stored::Unbound), &["start"]),
            (
                Started("t1"),
                &[r#"opened {"outcome":"started","thread_id":"t1"}"#],
            ),
            (TurnCompleted("t1"), &["commit t1 2"]),
            (Committed("t1", None), &[]),
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
        ],
    );
}

#[test]
fn events_out_of_place_do_nothing() {
    table(
        rules(),
        vec![
            (Resumed, &[]),
            (GivenUp, &[]),
            (WaitOver, &[]),
            (Started("t1"), &[]),
            (Delivered, &[]),
            (Session(bound("t1")), &[]),
            (Open, &["read_session"]),
            (Open, &[]),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// The rollout mirror's rows (MachineOptions::default(): mirroring on).

fn restored() -> Result<Restored, &'static str> {
    Ok(Restored::default())
}

#[test]
fn a_bound_thread_is_restored_before_its_first_resume_and_every_commit_takes_the_mirror() {
    let machine = table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
            (Restore(restored()), &[RESUME_T1]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
            (Committed("t1", None), &[]),
            (Mirrored("t1", MirrorReport::Written), &[]),
            (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
        ],
    );
    assert!(machine.is_mirroring());
}

#[test]
fn a_failed_restore_is_said_and_codexs_answer_to_the_resume_decides() {
    table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
            (
                Restore(Err("store: disk on fire")),
                &[
                    "say rethread could not restore thread t1's rollout from the store (store: disk on fire); resuming it as codex has it.",
                    RESUME_T1,
                ],
            ),
            // Codex has it after all (an earlier copy on this machine): resumed, nothing more.
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
        ],
    );
    table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
            (Restore(Err("store: disk on fire")), &[
                "say rethread could not restore thread t1's rollout from the store (store: disk on fire); resuming it as codex has it.",
                RESUME_T1,
            ]),
            // Codex does not have it, and the restore failed for a reason that may pass (the
            // store's read, a full disk here): the thread may well be restorable later, so it
            // is kept, never given up, and the open stops with a retryable error.
            (ResumeError(-32600, GONE), &["open_failed resume_unavailable"]),
        ],
    );
    table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
            (RestoreRefused("store: mirror damaged"), &[
                "say rethread could not restore thread t1's rollout from the store (store: mirror damaged); resuming it as codex has it.",
                RESUME_T1,
            ]),
            // A mirror that can never give the thread back (damaged, or naming files a restore
            // refuses): codex's answer decides as without a mirror, the usual loss.
            (ResumeError(-32600, GONE), &["give_up t1 gone"]),
        ],
    );
}

#[test]
fn a_restored_thread_codex_still_refuses_falls_back_as_ever() {
    // The floor: a paginated thread restored under 0.144.6 is still refused; the restore hides
    // nothing.
    table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
            (Restore(restored()), &[RESUME_T1]),
            (
                ResumeError(-32601, "paginated_threads is not supported yet"),
                &["give_up t1 incompatible"],
            ),
        ],
    );
}

#[test]
fn only_the_first_resume_of_an_open_is_restored() {
    let overloaded = "Server overloaded; retry later.";
    table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
            (Restore(restored()), &[RESUME_T1]),
            (ResumeError(-32001, overloaded), &["wait 200ms"]),
            (WaitOver, &[RESUME_T1]),
            (
                ResumeError(
                    -32600,
                    "thread/resume.excludeTurns requires experimentalApi capability",
                ),
                &[r#"resume {"threadId":"t1"}"#],
            ),
            // An open on a new connection restores again (that home may lack the file).
            (Open, &[]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
        ],
    );
}

#[test]
fn a_thread_that_is_not_resumed_is_not_restored_but_is_mirrored() {
    // A new session, a fallback's replacement, the client's own thread: nothing to restore;
    // their commits take the mirror.
    table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(Stored::Unbound), &["start"]),
            (
                Started("t1"),
                &[r#"opened {"outcome":"started","thread_id":"t1"}"#],
            ),
            (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
        ],
    );
    let mut options = MachineOptions::default();
    options.seed = None;
    table(
        options,
        vec![
            (Open, &["read_session"]),
            (
                Session(given_up("t1", ResumeFailure::Gone, true)),
                &["start"],
            ),
            (
                Started("t2"),
                &[r#"opened {"outcome":"started","thread_id":"t2"}"#],
            ),
            (TurnCompleted("t2"), &["commit t2 2 +mirror"]),
        ],
    );
    table(
        MachineOptions::default(),
        vec![
            (ClientThread("c1", false, Stored::Unbound), &[]),
            (TurnCompleted("c1"), &["commit c1 2 +mirror"]),
        ],
    );
}

#[test]
fn past_the_cap_mirroring_stops_and_is_said_once() {
    let stopped = MirrorReport::StoppedNow {
        bytes: 67_108_900,
        cap: 67_108_864,
    };
    let machine = table(
        MachineOptions::default(),
        vec![
            (ClientThread("t1", false, bound("t1")), &[]),
            (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
            (Committed("t1", None), &[]),
            (
                Mirrored("t1", stopped),
                &["say rethread stopped mirroring this session's codex rollout: it would hold 67108900 bytes, past the cap of 67108864. Its thread resumes only where codex keeps its rollout."],
            ),
            (TurnCompleted("t1"), &["commit t1 2"]),
            (Mirrored("t1", MirrorReport::Stopped), &[]),
        ],
    );
    assert!(!machine.is_mirroring());
}

#[test]
fn a_session_whose_mirroring_stopped_earlier_mirrors_nothing_and_says_nothing() {
    let mut stopped = Restored::default();
    stopped.stopped = true;
    table(
        MachineOptions::default(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &["restore t1"]),
            (Restore(Ok(stopped)), &[RESUME_T1]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (TurnCompleted("t1"), &["commit t1 2"]),
        ],
    );
    // Found stopped at a commit instead (no restore ran): silent too.
    table(
        MachineOptions::default(),
        vec![
            (ClientThread("t1", false, bound("t1")), &[]),
            (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
            (Mirrored("t1", MirrorReport::Stopped), &[]),
            (TurnCompleted("t1"), &["commit t1 2"]),
        ],
    );
}

/// The cap stops mirroring for the capped thread only: once it is given up (in this
/// connection, or found stopped by a later open's restore) the thread that replaces it is
/// mirrored again.
#[test]
fn a_capped_thread_given_up_or_replaced_mirrors_its_successor() {
    let mut options = MachineOptions::default();
    options.seed = None;
    let stopped = MirrorReport::StoppedNow { bytes: 30, cap: 20 };
    const SAY_STOPPED: &str = "say rethread stopped mirroring this session's codex rollout: it would hold 30 bytes, past the cap of 20. Its thread resumes only where codex keeps its rollout.";
    const FELL_BACK: &str = r#"opened {"outcome":"fell_back","thread_id":"t2","previous_thread_id":"t1","reason":"gone","message":"no rollout found for thread id t1","seeded":false}"#;
    let replaced = || -> Vec<(Event, &[&str])> {
        vec![
            (ResumeError(-32600, GONE), &["give_up t1 gone"]),
            (GivenUp, &["notice t1 gone", "start"]),
            (Started("t2"), &[FELL_BACK]),
            (TurnCompleted("t2"), &["commit t2 2 +mirror"]),
            (Mirrored("t2", MirrorReport::Written), &[]),
        ]
    };
    // Capped in this connection; the next open gives the thread up.
    let mut steps: Vec<(Event, &[&str])> = vec![
        (ClientThread("t1", false, bound("t1")), &[]),
        (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
        (Mirrored("t1", stopped), &[SAY_STOPPED]),
        (TurnCompleted("t1"), &["commit t1 2"]),
        (Open, &["read_session"]),
        (Session(bound("t1")), &[RESUME_T1]),
    ];
    steps.extend(replaced());
    assert!(table(options.clone(), steps).is_mirroring());
    // Found capped by the open's restore.
    let mut capped = Restored::default();
    capped.stopped = true;
    let mut steps: Vec<(Event, &[&str])> = vec![
        (Open, &["read_session"]),
        (Session(bound("t1")), &["restore t1"]),
        (Restore(Ok(capped)), &[RESUME_T1]),
    ];
    steps.extend(replaced());
    assert!(table(options, steps).is_mirroring());
}

#[test]
fn a_turn_committed_without_its_rollout_is_said_once_and_mirroring_goes_on() {
    let failed =
        || MirrorReport::Failed("no rollout of thread t1 under /home/x/.codex/sessions".into());
    table(
        MachineOptions::default(),
        vec![
            (ClientThread("t1", false, bound("t1")), &[]),
            (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
            (
                Mirrored("t1", failed()),
                &["say rethread could not mirror thread t1's rollout (no rollout of thread t1 under /home/x/.codex/sessions): it resumes only where codex keeps it."],
            ),
            (TurnCompleted("t1"), &["commit t1 2 +mirror"]),
            (Mirrored("t1", failed()), &[]),
        ],
    );
}

#[test]
fn with_the_mirror_off_nothing_is_restored_or_mirrored() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (Restore(restored()), &[]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (TurnCompleted("t1"), &["commit t1 2"]),
        ],
    );
}

/// What codex 0.171.0 reports for a turn whose request the Responses API refused as
/// `invalid_encrypted_content` (issue 39).
const ENCRYPTED: &str = r#"{"error":{"message":"The encrypted content gAAA...Zg== could not be verified.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}"#;

/// Issue 39: a thread restored onto a home of another account resumes, and its first turn
/// fails. The thread is given up once, the notice said once, and the next open starts a
/// seeded thread that reports the fallback; nothing is said again.
#[test]
fn another_accounts_first_turn_gives_the_thread_up_and_the_next_open_replaces_it() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (
                TurnFailed("t1", ENCRYPTED),
                &["give_up t1 account_mismatch"],
            ),
            (GivenUp, &["notice t1 account_mismatch"]),
            (Delivered, &["mark_delivered t1"]),
            (Open, &["read_session"]),
            (
                Session(given_up("t1", ResumeFailure::AccountMismatch, true)),
                &["read_transcript 40"],
            ),
            (
                Transcript(Ok(vec![json!({"role": "user", "text": "hi"})])),
                &["start seeded"],
            ),
            (
                Started("t2"),
                &[
                    r#"opened {"outcome":"fell_back","thread_id":"t2","previous_thread_id":"t1","reason":"account_mismatch","message":"no rollout found for thread id t1","seeded":true}"#,
                ],
            ),
            // A thread this home made: the same failure later is only the turn's.
            (TurnFailed("t2", ENCRYPTED), &[]),
            (TurnCompleted("t2"), &["commit t2 2"]),
        ],
    );
}

/// Only the first turn after a resume can prove another account: once a turn on the resumed
/// thread completed, the same failure is the turn's (the binding kept, nothing said); a
/// failure for another reason is never a loss, and leaves the next turn still the first.
#[test]
fn only_the_first_turn_that_reaches_the_thread_after_a_resume_counts() {
    let resumed = || {
        let mut machine = SessionMachine::new("s", rules());
        for event in [Open, Session(bound("t1")), Resumed] {
            apply(&mut machine, event);
        }
        machine
    };
    let mut machine = resumed();
    assert_eq!(apply(&mut machine, TurnCompleted("t1")), ["commit t1 2"]);
    assert_eq!(
        apply(&mut machine, TurnFailed("t1", ENCRYPTED)),
        Vec::<String>::new()
    );
    assert_eq!(machine.thread_id(), Some("t1"));
    let mut machine = resumed();
    let network = "stream disconnected before completion";
    assert_eq!(
        apply(&mut machine, TurnFailed("t1", network)),
        Vec::<String>::new()
    );
    assert_eq!(
        apply(&mut machine, TurnFailed("t1", ENCRYPTED)),
        ["give_up t1 account_mismatch"]
    );
    // Another thread's failure (one the client opened beside the session's) is not the
    // session's.
    let mut machine = resumed();
    assert_eq!(
        apply(&mut machine, TurnFailed("t9", ENCRYPTED)),
        Vec::<String>::new()
    );
    // A thread the session started itself is this home's.
    let mut machine = SessionMachine::new("s", rules());
    for event in [Open, Session(Stored::Unbound), Started("t1")] {
        apply(&mut machine, event);
    }
    assert_eq!(
        apply(&mut machine, TurnFailed("t1", ENCRYPTED)),
        Vec::<String>::new()
    );
}

/// The give-up after a failed turn is one store write like any other: when it fails the
/// binding is kept and nothing is said; the next open resumes the thread again.
#[test]
fn a_failed_give_up_after_a_turn_says_nothing_and_the_next_open_resumes() {
    table(
        rules(),
        vec![
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
            (
                Resumed,
                &[r#"opened {"outcome":"resumed","thread_id":"t1"}"#],
            ),
            (
                TurnFailed("t1", ENCRYPTED),
                &["give_up t1 account_mismatch"],
            ),
            (Failed, &["open_failed failed"]),
            (Open, &["read_session"]),
            (Session(bound("t1")), &[RESUME_T1]),
        ],
    );
}

/// codex's resume-time refusal of another account's thread is a loss like `gone`.
#[test]
fn another_accounts_refusal_on_resume_falls_back() {
    let refusal = "This thread was created with a different ChatGPT account or workspace. \
                   Sign in with the original account to resume it.";
    let mut machine = SessionMachine::new("s", rules());
    apply(&mut machine, Open);
    apply(&mut machine, Session(bound("t1")));
    let got = apply(&mut machine, ResumeError(-32600, refusal));
    assert_eq!(got, ["give_up t1 account_mismatch"]);
}
