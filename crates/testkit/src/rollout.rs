//! Codex-shaped rollout JSONL of any size, generated deterministically from a seed: for the
//! mirror's compression tests and `cargo xtask bench mirror`, where a repeated byte or a
//! repeated line would compress to nothing and say nothing.
//!
//! The line shapes are 0.171.0's (`session_meta`, `turn_context`, `event_msg` of
//! `task_started` / `item_completed` / `token_count` / `task_complete`, `response_item` of
//! `message`, `reasoning`, `function_call`, `function_call_output`); the content varies as a
//! working session's does: prose of a few hundred words, shell commands, tool output of source
//! lines, paths and compiler messages, and before every other tool call a reasoning item
//! whose `encrypted_content` is base64 of 400 to 3,000 random bytes (incompressible, as the
//! real ciphertext is). Ids
//! are random UUID-like strings, counters grow, timestamps advance.

use std::fmt::Write;

/// A small deterministic generator (splitmix64): the same seed gives the same rollout.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `range` (empty ranges give their start).
    pub fn range(&mut self, range: std::ops::Range<usize>) -> usize {
        let span = range.end.saturating_sub(range.start).max(1);
        range.start + (self.next_u64() % span as u64) as usize
    }

    /// One of `words`, the earlier ones more often (as in text, where a few words are most
    /// of it): the smaller of two uniform picks.
    fn pick<'a>(&mut self, words: &[&'a str]) -> &'a str {
        let (a, b) = (self.range(0..words.len()), self.range(0..words.len()));
        words[a.min(b)]
    }
}

const WORDS: &[&str] = &[
    "the",
    "a",
    "store",
    "thread",
    "session",
    "turn",
    "commit",
    "rollout",
    "mirror",
    "chunk",
    "file",
    "test",
    "error",
    "lease",
    "binding",
    "codex",
    "resume",
    "restore",
    "home",
    "path",
    "fails",
    "passes",
    "returns",
    "writes",
    "reads",
    "keeps",
    "drops",
    "because",
    "when",
    "after",
    "before",
    "which",
    "that",
    "this",
    "each",
    "every",
    "one",
    "two",
    "first",
    "last",
    "new",
    "old",
    "same",
    "other",
    "function",
    "method",
    "struct",
    "field",
    "value",
    "bytes",
    "length",
    "checksum",
    "backend",
    "engine",
    "transaction",
    "fence",
    "token",
    "model",
    "request",
    "response",
    "handler",
    "queue",
    "socket",
    "process",
    "signal",
    "timeout",
    "retry",
    "cache",
    "index",
    "table",
    "row",
    "column",
    "schema",
    "version",
    "release",
    "build",
    "crate",
    "module",
    "is",
    "are",
    "was",
    "be",
    "not",
    "so",
    "then",
    "now",
    "still",
    "only",
    "also",
    "here",
    "there",
    "we",
    "it",
    "they",
    "should",
    "could",
    "must",
    "will",
    "can",
    "let",
    "me",
    "check",
    "look",
    "at",
    "in",
    "on",
    "of",
    "for",
    "with",
    "from",
    "into",
    "by",
    "to",
    "and",
    "or",
    "but",
    "if",
    "I",
    "see",
    "think",
    "need",
    "change",
    "fix",
    "add",
    "remove",
    "update",
    "run",
    "open",
    "close",
    "line",
    "number",
    "case",
    "branch",
    "merge",
    "diff",
    "patch",
    "hunk",
    "output",
    "input",
    "config",
    "option",
    "flag",
    "default",
    "limit",
    "cap",
    "size",
    "time",
    "latency",
    "median",
];

const IDENTS: &[&str] = &[
    "store",
    "record",
    "session_id",
    "thread_id",
    "txn",
    "file",
    "chunk",
    "lens",
    "bytes",
    "commit",
    "mirror",
    "plan",
    "outcome",
    "fence",
    "lease",
    "grant",
    "now",
    "label",
    "path",
    "home",
    "options",
    "cap",
    "crc",
    "len",
    "seq",
    "range",
    "sink",
    "buf",
    "out",
    "err",
    "rows",
    "engine",
    "request",
    "answer",
    "clock",
    "handle",
    "reader",
    "writer",
    "state",
    "binding",
];

const TYPES: &[&str] = &[
    "SessionRecord",
    "MirroredFile",
    "StoreError",
    "FileKey",
    "TurnCommit",
    "Vec<u8>",
    "String",
    "BindingStore",
    "Option<u64>",
    "Result<()>",
    "Lease",
    "Grant",
    "Duration",
    "PathBuf",
    "u64",
];

const COMMANDS: &[&str] = &[
    "cargo test -p rethread-store --test conformance",
    "rg -n \"fn merge_tail\" crates/store/src",
    "sed -n '120,220p' crates/store/src/logic/mirror.rs",
    "git diff --stat",
    "cargo clippy -p rethread-runtime --all-targets -- -D warnings",
    "ls -la crates/runtime/src",
    "cat crates/proxy/src/session/turns.rs",
    "git log --oneline -n 20",
    "cargo build --release -p rethread",
    "grep -rn DEFAULT_MIRROR_CAP crates docs",
];

fn words(rng: &mut Rng, out: &mut String, n: std::ops::Range<usize>) {
    let n = rng.range(n);
    for i in 0..n {
        if i > 0 {
            out.push(if rng.range(0..12) == 0 { '\n' } else { ' ' });
        }
        out.push_str(rng.pick(WORDS));
        if rng.range(0..14) == 0 {
            out.push_str(if rng.range(0..2) == 0 { "." } else { "," });
        }
    }
}

/// Lines of tool output: source lines, compiler messages, listings, test results.
fn tool_output(rng: &mut Rng, out: &mut String, bytes: usize) {
    let start = out.len();
    while out.len() - start < bytes {
        let (a, b, t) = (rng.pick(IDENTS), rng.pick(IDENTS), rng.pick(TYPES));
        let n = rng.range(1..900);
        match rng.range(0..8) {
            0 => writeln!(
                out,
                "    let {a} = {b}.{}({}, {n})?;",
                rng.pick(IDENTS),
                rng.pick(IDENTS)
            ),
            1 => writeln!(
                out,
                "fn {a}_{b}(&self, {a}: &{t}) -> Result<{}> {{",
                rng.pick(TYPES)
            ),
            2 => writeln!(
                out,
                "crates/{}/src/{a}.rs:{n}:{}: error[E0{}]: mismatched types: expected `{t}`",
                rng.pick(IDENTS),
                rng.range(1..80),
                rng.range(100..800)
            ),
            3 => writeln!(out, "test {a}::{b}_{} ... ok", rng.pick(IDENTS)),
            4 => writeln!(
                out,
                "-rw-r--r-- 1 root root {:>7} Dec  {} {:02}:{:02} {a}_{b}.rs",
                rng.range(100..90_000),
                rng.range(1..9),
                rng.range(0..24),
                rng.range(0..60)
            ),
            5 => writeln!(out, "        // {}", {
                let mut s = String::new();
                words(rng, &mut s, 4..14);
                s.replace('\n', " ")
            }),
            6 => writeln!(out, "    {a}: {t},"),
            _ => writeln!(out, "}}"),
        }
        .expect("a String takes any write");
    }
}

fn uuid(rng: &mut Rng) -> String {
    let (a, b) = (rng.next_u64(), rng.next_u64());
    format!(
        "{:08x}-{:04x}-7{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

fn base64(rng: &mut Rng, bytes: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let chars = bytes.div_ceil(3) * 4;
    let mut out = String::with_capacity(chars + 6);
    out.push_str("gAAAAA");
    while out.len() < chars {
        let mut bits = rng.next_u64();
        for _ in 0..10 {
            out.push(ALPHABET[(bits & 63) as usize] as char);
            bits >>= 6;
        }
    }
    out
}

/// Appends one JSON line `{"timestamp":..,"type":kind,"payload":payload}`.
fn line(out: &mut Vec<u8>, clock: &mut u64, kind: &str, payload: serde_json::Value) {
    *clock += 37;
    let (s, ms) = (*clock / 1000, *clock % 1000);
    let stamp = format!(
        "2026-12-{:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        1 + (s / 86_400) % 28,
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60
    );
    let record = serde_json::json!({"timestamp": stamp, "type": kind, "payload": payload});
    serde_json::to_writer(&mut *out, &record).expect("JSON to a Vec");
    out.push(b'\n');
}

/// A generator of one thread's rollout, turn by turn.
#[derive(Debug)]
pub struct Rollout {
    rng: Rng,
    thread: String,
    clock: u64,
    tokens: u64,
}

impl Rollout {
    /// A thread's rollout from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let thread = uuid(&mut rng);
        Rollout {
            rng,
            thread,
            clock: 1_796_656_807_000,
            tokens: 0,
        }
    }

    /// The first line (`session_meta`, about 21 KB: codex's base instructions).
    pub fn meta(&mut self) -> Vec<u8> {
        let mut instructions = String::new();
        words(&mut self.rng, &mut instructions, 3200..3201);
        let mut out = Vec::new();
        let payload = serde_json::json!({
            "account_scoped": true, "session_id": self.thread, "id": self.thread,
            "cwd": "/work/project", "originator": "codex_cli_rs", "cli_version": "0.171.0",
            "source": "cli", "model_provider": "openai",
            "base_instructions": {"text": instructions},
        });
        line(&mut out, &mut self.clock, "session_meta", payload);
        out
    }

    /// One turn of at least `bytes` bytes (a turn is whole lines: it may run a little over).
    pub fn turn(&mut self, bytes: usize) -> Vec<u8> {
        let rng = &mut self.rng;
        let clock = &mut self.clock;
        let turn_id = uuid(rng);
        let mut out = Vec::with_capacity(bytes + 8192);
        line(
            &mut out,
            clock,
            "event_msg",
            serde_json::json!({
            "type": "task_started", "turn_id": turn_id, "started_at": *clock / 1000,
            "model_context_window": 258400, "collaboration_mode_kind": "default"}),
        );
        line(
            &mut out,
            clock,
            "turn_context",
            serde_json::json!({
            "turn_id": turn_id, "cwd": "/work/project", "approval_policy": "on-request",
            "sandbox_policy": {"type": "workspace-write"}, "model": "gpt-5.5-codex",
            "summary": "auto", "collaboration_mode": {"mode": "default"}}),
        );
        let mut prompt = String::new();
        words(rng, &mut prompt, 8..80);
        line(
            &mut out,
            clock,
            "response_item",
            serde_json::json!({
            "type": "message", "id": format!("msg_{}", uuid(rng)), "role": "user",
            "content": [{"type": "input_text", "text": prompt}]}),
        );
        line(
            &mut out,
            clock,
            "event_msg",
            serde_json::json!({
            "type": "item_completed", "thread_id": self.thread, "turn_id": turn_id,
            "item": {"type": "UserMessage", "id": uuid(rng), "content": [{"type": "text", "text": prompt}]}}),
        );
        while out.len() < bytes {
            let mut summary = String::new();
            words(rng, &mut summary, 10..60);
            let ciphertext = rng.range(400..3000);
            // Not every call is preceded by reasoning of its own.
            if rng.range(0..2) == 0 {
                line(
                    &mut out,
                    clock,
                    "response_item",
                    serde_json::json!({
                "type": "reasoning", "id": format!("rs_{:016x}", rng.next_u64()),
                "summary": [{"type": "summary_text", "text": summary}], "content": null,
                "encrypted_content": base64(rng, ciphertext)}),
                );
            }
            let call_id = format!("call_{:016x}", rng.next_u64());
            let command = rng.pick(COMMANDS);
            let arguments = serde_json::json!({"cmd": command, "workdir": "/work/project",
                                               "yield_time_ms": 10000})
            .to_string();
            line(
                &mut out,
                clock,
                "response_item",
                serde_json::json!({
                "type": "function_call", "name": "exec_command", "arguments": arguments,
                "call_id": call_id}),
            );
            let mut output = format!("Chunk ID: {:06x}\nWall time: 0.{:03} seconds\nProcess exited with code 0\nOutput:\n",
                                     rng.next_u64() & 0xff_ffff, rng.range(0..1000));
            let size = rng.range(300..12_000);
            tool_output(rng, &mut output, size);
            line(
                &mut out,
                clock,
                "response_item",
                serde_json::json!({
                "type": "function_call_output", "call_id": call_id, "output": output}),
            );
        }
        let mut answer = String::new();
        words(rng, &mut answer, 40..400);
        line(
            &mut out,
            clock,
            "response_item",
            serde_json::json!({
            "type": "message", "id": format!("msg_{}", uuid(rng)), "role": "assistant",
            "content": [{"type": "output_text", "text": answer}]}),
        );
        let used = rng.range(2_000..40_000) as u64;
        self.tokens += used;
        line(
            &mut out,
            clock,
            "event_msg",
            serde_json::json!({
            "type": "token_count", "info": {
                "total_token_usage": {"input_tokens": self.tokens, "cached_input_tokens": self.tokens / 2,
                                      "output_tokens": self.tokens / 20, "total_tokens": self.tokens + self.tokens / 20},
                "last_token_usage": {"input_tokens": used, "output_tokens": used / 20},
                "model_context_window": 258400}}),
        );
        line(
            &mut out,
            clock,
            "event_msg",
            serde_json::json!({
            "type": "task_complete", "turn_id": turn_id, "last_agent_message": answer.chars().take(120).collect::<String>(),
            "duration_ms": rng.range(900..90_000)}),
        );
        out
    }

    /// A whole rollout of at least `bytes` bytes: the first line, then turns of 5 to 60 KB.
    pub fn whole(&mut self, bytes: usize) -> Vec<u8> {
        let mut out = self.meta();
        while out.len() < bytes {
            let size = self.rng.range(5_000..60_000);
            out.extend_from_slice(&self.turn(size));
        }
        out
    }
}

/// A rollout of at least `bytes` bytes from `seed`, as the appends of its turns: the first
/// line, then turns of 5 to 60 KB (what a mirror receives commit by commit).
pub fn turns(seed: u64, bytes: usize) -> Vec<Vec<u8>> {
    let mut rollout = Rollout::new(seed);
    let mut sizes = Rng::new(seed);
    let mut turns = vec![rollout.meta()];
    let mut total = turns[0].len();
    while total < bytes {
        let turn = rollout.turn(sizes.range(5_000..60_000));
        total += turn.len();
        turns.push(turn);
    }
    turns
}
