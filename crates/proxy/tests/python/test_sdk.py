"""The unmodified `openai-codex` Python SDK drives `rethread app-server` instead of codex."""

from __future__ import annotations

import json
import queue
import subprocess
from pathlib import Path

from openai_codex import Codex, CodexConfig

NO_SESSION_WARNING = (
    "No rethread session is named (set RETHREAD_SESSION): nothing is kept, so this "
    "conversation will not be resumed after a restart."
)
FALLBACK_NOTICE = "Codex thread could not be resumed; starting a new one."


def config(binaries, model, tmp_path: Path, **env: str) -> CodexConfig:
    """The SDK's configuration: `rethread` as its codex, the real codex behind it."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return CodexConfig(
        codex_bin=binaries["RETHREAD_BIN"],
        cwd=str(work),
        env={
            "CODEX_HOME": str(model.homes[0]),
            "RETHREAD_CODEX_BIN": binaries["RETHREAD_TEST_CODEX"],
            "RUST_LOG": "error",
            **env,
        },
    )


def warnings(codex: Codex) -> list[dict]:
    """The `warning` notifications received so far outside any turn.

    The SDK queues notifications that name no turn on its global queue; it has no public
    non-blocking read of it, so this drains the queue of the pinned SDK (0.163.0) directly.
    """
    pending = codex._client._router._global_notifications
    seen = []
    while True:
        try:
            item = pending.get_nowait()
        except queue.Empty:
            return seen
        if getattr(item, "method", None) == "warning":
            payload = item.payload
            seen.append(
                {"message": payload.message, "threadId": getattr(payload, "thread_id", None)}
            )


def test_a_turn_through_rethread_without_a_session(binaries, model, tmp_path):
    with Codex(config(binaries, model, tmp_path)) as codex:
        # `initialize` is answered by codex itself: the SDK reads its version from userAgent.
        assert binaries["RETHREAD_TEST_CODEX_VERSION"] in codex.metadata.userAgent
        thread = codex.thread_start()
        result = thread.run("hello from python")
        assert result.final_response == "echo: hello from python"
        ours = [w for w in warnings(codex) if w["message"] == NO_SESSION_WARNING]
        assert ours == [{"message": NO_SESSION_WARNING, "threadId": None}]
    assert any(
        m["text"] == "hello from python" for m in model.conversations(at_least=1)[0]
    )


def test_three_processes_keep_one_conversation(binaries, model, tmp_path):
    session = {
        "RETHREAD_SESSION": "python-chat-1",
        "RETHREAD_STORE": f"sqlite:{tmp_path / 'rethread.sqlite'}",
    }
    # Process 1 runs a turn.
    with Codex(config(binaries, model, tmp_path, **session)) as codex:
        first = codex.thread_start()
        assert first.run("remember zebra").final_response == "echo: remember zebra"
        seen = warnings(codex)
        assert [w for w in seen if w["message"] == NO_SESSION_WARNING] == []
        assert [w for w in seen if w["message"] == FALLBACK_NOTICE] == []
    # Process 2 starts a thread and gets the same one back; the model sees turn 1.
    with Codex(config(binaries, model, tmp_path, **session)) as codex:
        second = codex.thread_start()
        assert second.id == first.id
        assert second.run("what did I say?").final_response == "echo: what did I say?"
        assert [w for w in warnings(codex) if w["message"] == FALLBACK_NOTICE] == []
    seen = model.conversations(at_least=2)[1]
    assert any(m["text"] == "remember zebra" for m in seen)
    # The rollout is gone from this home (a new container): the store's mirror puts it back
    # and process 3 gets the same thread, with its memory, and no notice.
    def lose_rollouts():
        rollouts = list((model.homes[0] / "sessions").rglob("rollout-*.jsonl"))
        assert rollouts
        for rollout in rollouts:
            rollout.unlink()

    lose_rollouts()
    with Codex(config(binaries, model, tmp_path, **session)) as codex:
        moved = codex.thread_start()
        assert moved.id == first.id
        assert moved.run("where were we?").final_response == "echo: where were we?"
        assert [w for w in warnings(codex) if w["message"] == FALLBACK_NOTICE] == []
    assert any(m["text"] == "remember zebra" for m in model.conversations(at_least=3)[2])
    # Without the mirror the rollout is lost: process 4 gets a new thread and exactly one
    # warning naming it.
    lose_rollouts()
    with Codex(config(binaries, model, tmp_path, RETHREAD_MIRROR="off", **session)) as codex:
        third = codex.thread_start()
        assert third.id != first.id
        result = third.run("still there?")
        assert result.final_response == "echo: still there?"
        # Nothing the SDK makes public carries the notice: `run()`'s items are the turn's
        # typed items only (none of them is a notice), and the `warning` went to the
        # SDK's private global queue (read here through `_client`).
        assert [i for i in result.items if FALLBACK_NOTICE in i.model_dump_json()] == []
        fallbacks = [w for w in warnings(codex) if w["message"] == FALLBACK_NOTICE]
        assert fallbacks == [{"message": FALLBACK_NOTICE, "threadId": third.id}]
    # The way out for a Python host: `rethread sessions show --json` names the last fallback.
    shown = subprocess.run(
        [binaries["RETHREAD_BIN"], "--store", session["RETHREAD_STORE"], "sessions", "show",
         "python-chat-1", "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    fallback = json.loads(shown.stdout)["last_fallback"]
    assert fallback["thread_id"] == first.id
    assert fallback["reason"] == "gone"
    assert fallback["pending"] is False
    assert isinstance(fallback["at_ms"], int)
    # The new thread was seeded from the session's transcript (quoted: one JSON row a line).
    seen = model.conversations(at_least=4)[3]
    assert any('{"role":"user","text":"remember zebra"}' in m["text"] for m in seen)
    # Process 5 resumes the new thread, with no warning.
    with Codex(config(binaries, model, tmp_path, **session)) as codex:
        fourth = codex.thread_start()
        assert fourth.id == third.id
        assert [w for w in warnings(codex) if w["message"] == FALLBACK_NOTICE] == []


def test_with_notice_item_the_fallback_is_among_the_turns_items(binaries, model, tmp_path):
    session = {
        "RETHREAD_SESSION": "python-chat-2",
        "RETHREAD_STORE": f"sqlite:{tmp_path / 'rethread.sqlite'}",
        "RETHREAD_MIRROR": "off",
        "RETHREAD_NOTICE": "item",
    }
    with Codex(config(binaries, model, tmp_path, **session)) as codex:
        first = codex.thread_start()
        first.run("remember zebra")
    for rollout in (model.homes[0] / "sessions").rglob("rollout-*.jsonl"):
        rollout.unlink()
    with Codex(config(binaries, model, tmp_path, **session)) as codex:
        thread = codex.thread_start()
        assert thread.id != first.id
        result = thread.run("still there?")
        # The notice is one of `run()`'s items, before the model's reply, which stays the
        # final response.
        texts = [getattr(i.root, "text", None) for i in result.items]
        assert texts.count(FALLBACK_NOTICE) == 1, result.items
        assert texts.index(FALLBACK_NOTICE) < texts.index("echo: still there?")
        assert result.final_response == "echo: still there?"
        again = thread.run("and now?")
        assert [i for i in again.items if FALLBACK_NOTICE in i.model_dump_json()] == []
