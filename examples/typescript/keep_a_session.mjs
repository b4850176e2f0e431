// Keep one conversation across host restarts with the TypeScript SDK, offline.
//
// The unmodified `@openai/codex-sdk` runs `rethread exec` as its codex (one process per
// turn); rethread keeps the session's codex thread in a store and runs `fake-codex`
// (rethread's stand-in for codex, with an echo model) behind it. Swap `fake-codex` for the
// real `codex` and nothing else changes.
//
// Install (once), then run from the clone's root (the SDK goes into a folder outside the
// clone, and this file beside it, where node finds the SDK):
//
//     cargo install --path crates/cli              # rethread
//     cargo install --path crates/fake-appserver   # fake-codex
//     npm install --prefix ~/rethread-node --omit=optional @openai/codex-sdk@0.163.0
//     cp examples/typescript/keep_a_session.mjs ~/rethread-node/ && node ~/rethread-node/keep_a_session.mjs
//
// A fallback reaches the SDK's user in `run()`'s `items`, as codex reports non-fatal errors:
// `{ type: "error", message: "Codex thread could not be resumed; starting a new one." }`.
import { Codex } from "@openai/codex-sdk";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { accessSync, constants } from "node:fs";
import assert from "node:assert/strict";

const NOTICE = "Codex thread could not be resumed; starting a new one.";

/** The program `name` on PATH. */
function which(name) {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    try {
      accessSync(join(dir, name), constants.X_OK);
      return join(dir, name);
    } catch {}
  }
  throw new Error(`put \`${name}\` on PATH (see the install commands above)`);
}

const dir = mkdtempSync(join(tmpdir(), "keep-a-session-"));
const home = join(dir, "codex-home");
const env = {
  ...process.env,
  RETHREAD_SESSION: "support-ticket-7", // the conversation to keep
  RETHREAD_STORE: `sqlite:${join(dir, "rethread.sqlite")}`,
  RETHREAD_CODEX_BIN: which("fake-codex"), // the codex behind rethread
  CODEX_HOME: home,
};
const codex = new Codex({ codexPathOverride: which("rethread"), env }); // rethread instead of codex
const options = { workingDirectory: dir, skipGitRepoCheck: true };

try {
  // A host runs a turn. The SDK keeps nothing: a restarted host starts a thread again.
  const first = codex.startThread(options);
  console.log("turn 1:", (await first.run("My order number is 4711.")).finalResponse);

  // After a restart: a new thread object, and rethread hands back the session's thread. The
  // model sees the first turn (fake-codex logs what it saw).
  const again = codex.startThread(options);
  console.log("turn 2:", (await again.run("What is my order number?")).finalResponse);
  assert.equal(again.id, first.id);
  const seen = readFileSync(join(home, "fake-model-requests.jsonl"), "utf8").trim().split("\n").pop();
  assert.ok(seen.includes("My order number is 4711."));
  console.log(`after a restart: thread ${again.id}, and the model remembered the order number`);

  // A new container (or a pruned ~/.codex): codex's rollout is gone, but the store mirrors it
  // with every turn, so rethread puts it back and the thread goes on, nothing said.
  rmSync(join(home, "sessions"), { recursive: true });
  const moved = codex.startThread(options);
  const restored = await moved.run("Still my order?");
  assert.equal(moved.id, first.id);
  assert.equal(restored.items.filter((item) => item.type === "error").length, 0);
  console.log(`turn 3: ${restored.finalResponse}\na home without the rollout: thread ${moved.id} restored from the store`);

  // Without the mirror (RETHREAD_MIRROR=off) a lost rollout is a lost thread: a new thread,
  // seeded from the transcript rethread kept, and the notice once, in `items`.
  rmSync(join(home, "sessions"), { recursive: true });
  const off = new Codex({ codexPathOverride: which("rethread"), env: { ...env, RETHREAD_MIRROR: "off" } });
  const third = off.startThread(options);
  const result = await third.run("Are you still there?");
  const notices = result.items.filter((item) => item.type === "error" && item.message === NOTICE);
  assert.equal(notices.length, 1);
  assert.notEqual(third.id, first.id);
  console.log(`turn 4: ${result.finalResponse}\nfell back: "${notices[0].message}" (now thread ${third.id})`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
