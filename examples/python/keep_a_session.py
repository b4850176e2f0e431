"""Keep one conversation across host restarts with the openai-codex Python SDK, offline.

The unmodified SDK drives `rethread app-server` as its codex; rethread keeps the session's
codex thread in a store and runs `fake-codex` (rethread's stand-in for codex, with an echo
model) behind it. Swap `fake-codex` for the real `codex` and nothing else changes.

Install (once), then run, from the clone's root (the SDK in a venv outside the clone):

    cargo install --path crates/cli              # rethread
    cargo install --path crates/fake-appserver   # fake-codex
    python3 -m venv ~/rethread-venv && . ~/rethread-venv/bin/activate
    pip install 'pydantic>=2.12' 'packaging>=26.2'   # the SDK's dependencies, with theirs
    pip install --no-deps openai-codex==0.163.0      # the SDK without its own codex
    python3 examples/python/keep_a_session.py

The Python SDK shows its user no fallback (its `warning` goes to a queue it keeps private),
so the last step asks rethread: `rethread sessions show ID --json` reports `last_fallback`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from openai_codex import Codex, CodexConfig

SESSION = "support-ticket-7"


def main() -> None:
    rethread, fake_codex = shutil.which("rethread"), shutil.which("fake-codex")
    if not (rethread and fake_codex):
        sys.exit("put `rethread` and `fake-codex` on PATH (see the install commands above)")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "codex-home"
        store = f"sqlite:{Path(tmp) / 'rethread.sqlite'}"
        env = {
            "RETHREAD_SESSION": SESSION,  # the conversation to keep
            "RETHREAD_STORE": store,
            "RETHREAD_CODEX_BIN": fake_codex,  # the codex behind rethread
            "CODEX_HOME": str(home),
        }
        config = CodexConfig(codex_bin=rethread, cwd=tmp, env=env)  # rethread instead of codex

        # A host process runs a turn, then exits.
        with Codex(config) as codex:
            first = codex.thread_start()
            print("turn 1:", first.run("My order number is 4711.").final_response)

        # The host restarts: a new SDK client, a new thread_start, and rethread hands back the
        # session's thread. The model sees the first turn (fake-codex logs what it saw).
        with Codex(config) as codex:
            again = codex.thread_start()
            assert again.id == first.id, (again.id, first.id)
            print("turn 2:", again.run("What is my order number?").final_response)
        seen = (home / "fake-model-requests.jsonl").read_text().splitlines()[-1]
        assert "My order number is 4711." in seen
        print(f"after a restart: thread {again.id}, and the model remembered the order number")

        # A new container (or a pruned ~/.codex): codex's rollout is gone, but the store
        # mirrors it with every turn, so rethread puts it back and the thread goes on.
        shutil.rmtree(home / "sessions")
        with Codex(config) as codex:
            moved = codex.thread_start()
            assert moved.id == first.id, (moved.id, first.id)
            print("turn 3:", moved.run("Still my order?").final_response)
        print(f"a home without the rollout: thread {moved.id} restored from the store")

        # Without the mirror (RETHREAD_MIRROR=off) a lost rollout is a lost thread: rethread
        # starts a new one, seeded from the transcript it kept, and records the fallback.
        shutil.rmtree(home / "sessions")
        off = CodexConfig(codex_bin=rethread, cwd=tmp, env={**env, "RETHREAD_MIRROR": "off"})
        with Codex(off) as codex:
            third = codex.thread_start()
            print("turn 4:", third.run("Are you still there?").final_response)
        assert third.id != first.id

        # The way out for Python hosts: ask rethread what happened to the session.
        shown = subprocess.run(
            [rethread, "--store", store, "sessions", "show", SESSION, "--json"],
            check=True,
            capture_output=True,
            text=True,
        )
        fallback = json.loads(shown.stdout)["last_fallback"]
        assert fallback["thread_id"] == first.id and fallback["reason"] == "gone", fallback
        print(
            f"fell back: thread {fallback['thread_id']} was {fallback['reason']}; "
            f"the conversation goes on in {third.id}, seeded from the transcript"
        )


if __name__ == "__main__":
    main()
