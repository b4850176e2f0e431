// The unmodified `@openai/codex-sdk` (npm) drives `rethread exec` instead of codex, across
// host processes, against the real current codex (offline: a Responses-API stand-in is the
// model). `cargo xtask ci` runs it (`cargo xtask node` alone) with:
//
// - RETHREAD_BIN: the `rethread` binary (what the SDK is told is codex);
// - RETHREAD_STAND_IN_BIN: the `responses_stand_in` example of `rethread-proxy`;
// - RETHREAD_TEST_CODEX: the real codex behind rethread;
// - RETHREAD_CODEX_SDK: the SDK's `dist/index.js`, installed by xtask under `target/`.
//
// A missing variable skips the tests, unless RETHREAD_REQUIRE_REAL_CODEX=1 or CI=true.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { mkdtempSync, mkdirSync, readFileSync, rmSync, existsSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const NOTICE = "Codex thread could not be resumed; starting a new one.";
const NEEDED = ["RETHREAD_BIN", "RETHREAD_STAND_IN_BIN", "RETHREAD_TEST_CODEX", "RETHREAD_CODEX_SDK"];
const missing = NEEDED.filter((name) => !process.env[name]);
const required = process.env.RETHREAD_REQUIRE_REAL_CODEX === "1" || (process.env.CI ?? "").toLowerCase() === "true";
if (missing.length > 0 && required) {
  throw new Error(`unset: ${missing.join(", ")} (run through \`cargo xtask ci\`)`);
}
const skip = missing.length > 0 ? `unset: ${missing.join(", ")}` : false;
const here = dirname(fileURLToPath(import.meta.url));

/** The stand-in model, with `home` and `otherHome` (another machine's, never used until a test
 * names it) configured to use it; `conversations()` reads its log. */
async function model(dir) {
  const home = join(dir, "codex-home");
  const otherHome = join(dir, "codex-home-2");
  const log = join(dir, "model-requests.jsonl");
  const args = ["--codex-home", home, "--codex-home", otherHome, "--log", log];
  const child = spawn(process.env.RETHREAD_STAND_IN_BIN, args, {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const first = await new Promise((resolve) => createInterface({ input: child.stdout }).once("line", resolve));
  JSON.parse(first);
  return {
    home,
    otherHome,
    conversations() {
      if (!existsSync(log)) return [];
      return readFileSync(log, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l).conversation);
    },
    /** Ends the stand-in and waits for it to exit. */
    async stop() {
      const exited = child.exitCode !== null || child.signalCode !== null;
      child.stdin.end();
      if (!exited) await new Promise((resolve) => child.once("exit", resolve));
    },
  };
}

/** One world: a stand-in model, a store, a working directory, all under one temporary
 * directory that `end()` removes (each test ends its world in `finally`, failed or not). */
async function world() {
  const dir = mkdtempSync(join(tmpdir(), "rethread-node-"));
  const work = join(dir, "work");
  mkdirSync(work);
  let m;
  try {
    m = await model(dir);
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
  const store = `sqlite:${join(dir, "rethread.sqlite")}`;
  const env = (session, extra) => ({
    PATH: process.env.PATH,
    HOME: process.env.HOME ?? dir,
    CODEX_HOME: m.home,
    RETHREAD_CODEX_BIN: process.env.RETHREAD_TEST_CODEX,
    RETHREAD_STORE: store,
    RUST_LOG: "error",
    ...(session ? { RETHREAD_SESSION: session } : {}),
    ...extra,
  });
  return {
    dir,
    model: m,
    /** Stops the stand-in, then removes the world's directory. */
    async end() {
      await m.stop();
      rmSync(dir, { recursive: true, force: true });
    },
    /** Runs `prompts` in a new host process; returns what the SDK returned for each. */
    host(session, prompts, resume, extra = {}) {
      const step = { sdk: process.env.RETHREAD_CODEX_SDK, rethread: process.env.RETHREAD_BIN, env: env(session, extra), work, prompts, resume };
      const out = execFileSync(process.execPath, [join(here, "turn.mjs"), JSON.stringify(step)], { encoding: "utf8" });
      return JSON.parse(out.trim().split("\n").pop());
    },
    session(id) {
      const out = execFileSync(process.env.RETHREAD_BIN, ["--store", store, "sessions", "show", id, "--json"], { encoding: "utf8" });
      return JSON.parse(out);
    },
    loseRollouts() {
      const sessions = join(m.home, "sessions");
      assert.ok(statSync(sessions).isDirectory());
      rmSync(sessions, { recursive: true });
    },
  };
}

const notices = (run) => run.items.filter((item) => item.type === "error" && item.message === NOTICE);
const saw = (conversation, text) => conversation.some((m) => m.text.includes(text));

test("a turn through rethread exec without a session", { skip }, async () => {
  const w = await world();
  try {
    const [run] = w.host(null, ["hello from node"]);
    assert.equal(run.final, "echo: hello from node");
    assert.ok(run.thread_id);
    assert.deepEqual(notices(run), []);
  } finally {
    await w.end();
  }
});

test("host processes keep one conversation; a lost thread falls back with its notice in items", { skip }, async () => {
  const w = await world();
  try {
    const [first] = w.host("node-chat-1", ["remember zebra"]);
    assert.equal(first.final, "echo: remember zebra");
    assert.equal(w.session("node-chat-1").thread_id, first.thread_id);

    // A restarted host: a new thread object, the session's thread back, with its memory; its
    // second run (the SDK's own `resume <id>`) is recorded too.
    const second = w.host("node-chat-1", ["what did I say?", "and again?"]);
    assert.deepEqual(second.map((r) => r.thread_id), [first.thread_id, first.thread_id]);
    assert.deepEqual(second.flatMap(notices), []);
    const seen = w.model.conversations();
    assert.ok(saw(seen[1], "remember zebra"), JSON.stringify(seen[1]));
    assert.equal(w.session("node-chat-1").row_count, 6);

    // The rollout is gone from this home (a new container): the store's mirror puts it back
    // and the same thread goes on, with its memory, nothing said.
    w.loseRollouts();
    const [moved] = w.host("node-chat-1", ["where were we?"]);
    assert.equal(moved.thread_id, first.thread_id);
    assert.deepEqual(notices(moved), []);
    assert.ok(saw(w.model.conversations().pop(), "remember zebra"));

    // Without the mirror the rollout is lost: a new thread, the notice once in `items`,
    // seeded from the transcript.
    w.loseRollouts();
    const [third] = w.host("node-chat-1", ["still there?"], undefined, { RETHREAD_MIRROR: "off" });
    assert.notEqual(third.thread_id, first.thread_id);
    assert.equal(notices(third).length, 1, JSON.stringify(third.items));
    assert.equal(third.final, "echo: still there?");
    const seeded = w.model.conversations().pop();
    assert.ok(saw(seeded, '{"role":"user","text":"remember zebra"}'), JSON.stringify(seeded));
    const shown = w.session("node-chat-1");
    assert.equal(shown.thread_id, third.thread_id);
    assert.equal(shown.last_fallback.thread_id, first.thread_id);
    assert.equal(shown.last_fallback.reason, "gone");

    // Said once: the next host resumes the new thread and hears nothing.
    const [fourth] = w.host("node-chat-1", ["and now?"]);
    assert.equal(fourth.thread_id, third.thread_id);
    assert.deepEqual(notices(fourth), []);
  } finally {
    await w.end();
  }
});

test("a thread the host resumes itself passes through, not recorded for another session's thread", { skip }, async () => {
  const w = await world();
  try {
    // A thread nobody keeps: without a session and without the mirror (with it, the thread
    // would be kept by its own id, and a session's run refused it as another's).
    const [own] = w.host(null, ["a thread of my own"], undefined, { RETHREAD_MIRROR: "off" });
    const [bound] = w.host("node-chat-2", ["the session's"]);
    const before = w.session("node-chat-2");
    const [resumed] = w.host("node-chat-2", ["back to mine"], own.thread_id);
    assert.equal(resumed.thread_id, own.thread_id);
    assert.equal(resumed.final, "echo: back to mine");
    assert.ok(saw(w.model.conversations().pop(), "a thread of my own"));
    const after = w.session("node-chat-2");
    assert.equal(after.thread_id, bound.thread_id);
    assert.equal(after.row_count, before.row_count);
  } finally {
    await w.end();
  }
});

test("resumeThread(id) on a second, empty home resumes the session's thread with its memory", { skip }, async () => {
  const w = await world();
  try {
    const [first] = w.host("node-chat-3", ["remember okapi"]);
    // Another machine: its own CODEX_HOME, which never saw the thread, and the same store. The
    // host kept the thread id and resumes it by id: the store's mirror puts the rollout back
    // before codex resumes it.
    const other = { CODEX_HOME: w.model.otherHome };
    const [moved] = w.host("node-chat-3", ["which animal?"], first.thread_id, other);
    assert.equal(moved.thread_id, first.thread_id);
    assert.equal(moved.final, "echo: which animal?");
    assert.deepEqual(notices(moved), []);
    assert.ok(saw(w.model.conversations().pop(), "remember okapi"));
    const shown = w.session("node-chat-3");
    assert.equal(shown.thread_id, first.thread_id);
    assert.equal(shown.row_count, 4);
  } finally {
    await w.end();
  }
});
