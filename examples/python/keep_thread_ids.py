"""A host that keeps codex thread ids in its own database, with the openai-codex Python SDK.

The host names no rethread session: it stores each conversation's codex thread id in a table
of its own and resumes by that id (`thread_resume`). With a store named (`RETHREAD_STORE`),
`rethread app-server` keeps every thread by its own id: its rollout goes into the store with
each turn and comes back before a resume, so the conversation survives its CODEX_HOME (a
replaced container, another machine of a fleet sharing the store). Offline it runs on
`fake-codex`; swap it for the real `codex` and nothing else changes (CI does, on SQLite and
PostgreSQL).

Install (once), then run, from the clone's root (the SDK in a venv outside the clone):

    cargo install --path crates/cli              # rethread
    cargo install --path crates/fake-appserver   # fake-codex
    python3 -m venv ~/rethread-venv && . ~/rethread-venv/bin/activate
    pip install 'pydantic>=2.12' 'packaging>=26.2'   # the SDK's dependencies, with theirs
    pip install --no-deps openai-codex==0.163.0      # the SDK without its own codex
    python3 examples/python/keep_thread_ids.py
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

from openai_codex import Codex, CodexConfig


class Host:
    """The host: its own database maps a conversation to the codex thread id it got."""

    def __init__(self, db: Path, rethread: str, codex: str, store: str) -> None:
        self.db = sqlite3.connect(db)
        self.db.execute("CREATE TABLE IF NOT EXISTS chats (name TEXT PRIMARY KEY, thread TEXT)")
        self.rethread, self.codex, self.store = rethread, codex, store

    def ask(self, chat: str, text: str, home: Path) -> tuple[str, str]:
        """One turn of `chat` on the machine whose CODEX_HOME is `home`: (thread id, reply)."""
        env = {
            "RETHREAD_STORE": self.store,  # no RETHREAD_SESSION: threads kept by their ids
            "RETHREAD_CODEX_BIN": self.codex,  # the codex behind rethread
            "CODEX_HOME": str(home),
        }
        config = CodexConfig(codex_bin=self.rethread, cwd=str(home.parent), env=env)
        row = self.db.execute("SELECT thread FROM chats WHERE name = ?", (chat,)).fetchone()
        with Codex(config) as codex:
            if row:
                thread = codex.thread_resume(row[0])  # restored from the store if need be
            else:
                thread = codex.thread_start()
                with self.db:
                    self.db.execute("INSERT INTO chats VALUES (?, ?)", (chat, thread.id))
            return thread.id, thread.run(text).final_response


def run(tmp: Path, rethread: str, codex: str, store: str, homes: list[Path]) -> list[str]:
    """The story on two machines: a turn on the first, which is then lost, and one on the
    second, resumed by the id the host kept. Returns the thread id of each turn."""
    host = Host(tmp / "host.sqlite", rethread, codex, store)
    first, reply = host.ask("ticket-7", "My order number is 4711.", homes[0])
    print("machine 1:", reply)
    shutil.rmtree(homes[0])  # the container is replaced: its CODEX_HOME is gone
    again, reply = host.ask("ticket-7", "What is my order number?", homes[1])
    print("machine 2:", reply)
    assert again == first, (again, first)
    return [first, again]


def main() -> None:
    rethread, fake_codex = shutil.which("rethread"), shutil.which("fake-codex")
    if not (rethread and fake_codex):
        sys.exit("put `rethread` and `fake-codex` on PATH (see the install commands above)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        homes = [tmp / "machine-1", tmp / "machine-2"]
        store = f"sqlite:{tmp / 'rethread.sqlite'}"
        thread = run(tmp, rethread, fake_codex, store, homes)[0]
        # fake-codex logs what its model saw: the second machine's turn carried the first.
        seen = (homes[1] / "fake-model-requests.jsonl").read_text().splitlines()[-1]
        assert "My order number is 4711." in seen
        print(f"thread {thread} resumed by its id on a new machine, with its memory")


if __name__ == "__main__":
    main()
