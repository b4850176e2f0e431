//! Every row of the error table in `docs/architecture.md` ("Fault model"), classified.

use rethread_protocol::{
    classify_resume_error, classify_turn_error, exec_resume_error, ResumeFailure, RpcError,
};

#[test]
fn every_row_of_the_notes_table_is_classified() {
    let rows: &[(i64, &str, ResumeFailure)] = &[
        (-32600, "no rollout found for thread id 0199a", ResumeFailure::Gone),
        (-32600, "failed to resolve rollout path `/h/sessions/x.jsonl`: file does not exist", ResumeFailure::Gone),
        (-32600, "invalid session id: not-a-uuid", ResumeFailure::Gone),
        // thread/read (doctor's probe) on a deleted rollout or a malformed id.
        (-32600, "thread not loaded: 0199a", ResumeFailure::Gone),
        (-32600, "invalid thread id: not-a-uuid", ResumeFailure::Gone),
        // 0.169.0, thread/read with turns of a paginated thread whose rollout was deleted.
        (-32603, "invalid paginated history lineage for 0199a: missing source rollout", ResumeFailure::Gone),
        (-32603, "invalid paginated history lineage for 0199a: segment 3 out of order", ResumeFailure::Unreadable),
        (-32603, "failed to read thread: thread-store internal error: failed to read session metadata from /h/x", ResumeFailure::Unreadable),
        (-32601, "paginated_threads is not supported yet", ResumeFailure::Incompatible),
        (-32603, "failed to load thread: unknown thread history mode `v3`", ResumeFailure::Incompatible),
        // 0.169.0's actual wording for an unknown stored mode (0.144.6 reports the metadata
        // unreadable, which also fails closed).
        (-32603, "failed to read thread: thread-store internal error: failed to read session metadata from /h/x: invalid session metadata history_mode: unknown variant `v3`, expected `legacy` or `paginated`", ResumeFailure::Incompatible),
        (-32603, "failed to read thread: thread-store internal error: failed to read session metadata from /h/x: does not start with session metadata", ResumeFailure::Unreadable),
        (-32600, "thread 0199a already has an active writer", ResumeFailure::Busy),
        (-32001, "server overloaded; retry later", ResumeFailure::Overloaded),
        // codex wraps any I/O error in its "failed to read thread" wording: transient, never a
        // damaged rollout (the thread may be intact).
        (-32603, "failed to read thread: thread-store internal error: failed to read session metadata from /h/x: Permission denied (os error 13)", ResumeFailure::Io),
        (-32603, "failed to read thread: Too many open files (os error 24)", ResumeFailure::Io),
        (-32603, "failed to read thread 0199a: Input/output error (os error 5)", ResumeFailure::Io),
        // Structurally unreadable rollouts (empty, no session meta, bad JSON) stay unreadable.
        (-32603, "failed to read thread: thread-store internal error: failed to read session metadata /h/x: thread-store internal error: failed to read session metadata /h/x: rollout at /h/x is empty", ResumeFailure::Unreadable),
        (-32603, "failed to read thread: thread-store internal error: failed to read session metadata /h/x: expected value at line 1 column 1", ResumeFailure::Unreadable),
        // "os error" alone, without Rust's `(os error N)` shape, is not an I/O error.
        (-32603, "failed to read thread: the os error log said hi", ResumeFailure::Unreadable),
        (-32600, "thread/resume.excludeTurns requires experimentalApi capability", ResumeFailure::CapabilityRequired),
        (-32600, "thread/start.historyMode requires experimentalApi capability", ResumeFailure::CapabilityRequired),
        (-32600, "Not initialized", ResumeFailure::Other),
        (-32601, "unknown method", ResumeFailure::Other),
        (-32602, "invalid params", ResumeFailure::Other),
        (-32603, "something else broke", ResumeFailure::Other),
    ];
    for (code, message, expected) in rows {
        let got = classify_resume_error(&RpcError::new(*code, *message));
        assert_eq!(got, *expected, "{code} {message:?}");
    }
}

#[test]
fn only_lost_threads_fail_closed_and_only_transient_failures_are_retried() {
    use ResumeFailure::*;
    for failure in [
        Gone,
        Incompatible,
        Unreadable,
        AccountMismatch,
        Busy,
        Overloaded,
        Io,
        Timeout,
        CapabilityRequired,
        Other,
    ] {
        assert_eq!(
            failure.thread_is_lost(),
            matches!(failure, Gone | Incompatible | Unreadable | AccountMismatch),
            "{failure}"
        );
        assert_eq!(
            failure.is_transient(),
            matches!(failure, Busy | Overloaded | Io | Timeout),
            "{failure}"
        );
        assert!(
            !(failure.thread_is_lost() && failure.is_transient()),
            "{failure}"
        );
    }
}

#[test]
fn the_same_code_means_different_things_by_message() {
    let gone = RpcError::new(-32600, "no rollout found for thread id a");
    let busy = RpcError::new(-32600, "thread a already has an active writer");
    assert_ne!(classify_resume_error(&gone), classify_resume_error(&busy));
}

/// `codex exec ... resume <id>` reports a failed resume on stderr and exits 1; these are its
/// words as codex-cli 0.171.0 printed them (paths and ids shortened), read back as the error
/// codex got and judged like one on the wire.
#[test]
fn codex_exec_resume_failures_are_read_from_its_stderr() {
    let preamble = "WARNING: proceeding, even though we could not create PATH aliases\nReading prompt from stdin...\n";
    type Expected = Option<(i64, &'static str, ResumeFailure)>;
    let rows: &[(&str, Expected)] = &[
        (
            "Error: thread/resume: thread/resume failed: no rollout found for thread id 01a2 (code -32600)\n\nStack backtrace:\n   0: <unknown>\n",
            Some((-32600, "no rollout found for thread id 01a2", ResumeFailure::Gone)),
        ),
        (
            "Error: thread/resume: thread/resume failed: failed to read thread: thread-store internal error: failed to read session metadata /h/r.jsonl: rollout at /h/r.jsonl is empty (code -32603)\n",
            Some((-32603, "failed to read thread: thread-store internal error: failed to read session metadata /h/r.jsonl: rollout at /h/r.jsonl is empty", ResumeFailure::Unreadable)),
        ),
        // A message that holds parentheses of its own keeps them.
        (
            "Error: thread/resume: thread/resume failed: failed to read thread: Permission denied (os error 13) (code -32603)",
            Some((-32603, "failed to read thread: Permission denied (os error 13)", ResumeFailure::Io)),
        ),
        ("No prompt provided via stdin.\n", None),
        ("Error: thread/start: thread/start failed: boom (code -32603)\n", None),
        ("Error: thread/resume: thread/resume failed: no code here\n", None),
        ("Error: thread/resume: thread/resume failed: x (code minus one)\n", None),
        ("", None),
    ];
    for (stderr, expected) in rows {
        let got = exec_resume_error(&format!("{preamble}{stderr}"));
        let got = got.map(|e| {
            let failure = classify_resume_error(&e);
            (e.code.code(), e.message, failure)
        });
        let expected = expected.map(|(c, m, f)| (c, m.to_string(), f));
        assert_eq!(got, expected, "{stderr:?}");
    }
}

/// Issue 39: a thread restored onto a home logged into another account or organisation.
/// codex's resume-time refusal (behind a check that is off today, whatever code it comes
/// with) is `account_mismatch`, a loss.
#[test]
fn another_accounts_refusal_on_resume_is_account_mismatch() {
    let message = "This thread was created with a different ChatGPT account or workspace. \
                   Sign in with the original account to resume it.";
    for code in [-32600, -32603] {
        let got = classify_resume_error(&RpcError::new(code, message));
        assert_eq!(got, ResumeFailure::AccountMismatch, "{code}");
    }
    assert!(ResumeFailure::AccountMismatch.thread_is_lost());
    assert!(!ResumeFailure::AccountMismatch.is_transient());
    assert_eq!(ResumeFailure::AccountMismatch.as_str(), "account_mismatch");
    let json = serde_json::to_value(ResumeFailure::AccountMismatch).unwrap();
    assert_eq!(json, "account_mismatch");
}

/// A failed turn's error, as codex 0.171.0 reports the Responses API's HTTP 400
/// `invalid_encrypted_content` (observed: the `error` notification's and the failed
/// `turn/completed`'s `error.message` is the API's body, `codexErrorInfo: "other"`); every
/// other failure of a turn is not a lost thread.
#[test]
fn a_turn_failing_on_another_accounts_encrypted_content_is_account_mismatch() {
    let observed = r#"{"error":{"message":"The encrypted content gAAA...Zg== could not be verified.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}"#;
    let pretty = "{\n  \"error\": {\n    \"message\": \"The encrypted content gAAA...6Dg= could not be verified.\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"invalid_encrypted_content\"\n  }\n}";
    let refusal = "This thread was created with a different ChatGPT account or workspace. Sign in with the original account to resume it.";
    for message in [observed, pretty, refusal] {
        assert_eq!(
            classify_turn_error(message),
            Some(ResumeFailure::AccountMismatch),
            "{message}"
        );
    }
    for message in [
        "",
        "stream disconnected before completion: error sending request",
        r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#,
        r#"{"error":{"message":"Invalid 'input[3].content'","type":"invalid_request_error","code":"invalid_value"}}"#,
        "unexpected status 401 Unauthorized",
    ] {
        assert_eq!(classify_turn_error(message), None, "{message}");
    }
}
