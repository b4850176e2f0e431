"""Hermes (hermes-agent 0.19.0 from PyPI, unmodified) through rethread, set up as README.md's
"Use it with Hermes" says: a plain `codex` link to rethread ahead of the real codex on `PATH`,
`RETHREAD_SESSION_VAR=HERMES_SESSION_ID`, `RETHREAD_NOTICE=item`, a SQLite store; the real
current codex behind it, offline against the Responses stand-in. Each Hermes process is
`hermes_process.py` in the venv `cargo xtask ci` installs Hermes into (run alone: `cargo xtask
hermes`); the SDK stage leaves this file out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

FALLBACK_NOTICE = "Codex thread could not be resumed; starting a new one."
HERE = Path(__file__).resolve().parent


def link(binaries, tmp_path: Path) -> Path:
    """`ln -s $(which rethread) bin/codex`: the directory to put first on `PATH`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    codex = bin_dir / "codex"
    if not codex.exists():
        codex.symlink_to(binaries["RETHREAD_BIN"])
    return bin_dir


def environment(binaries, tmp_path: Path, home: Path, **extra: str) -> dict[str, str]:
    """Hermes' environment: the link, then the real codex (found next on `PATH`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETHREAD_")}
    real = str(Path(binaries["RETHREAD_TEST_CODEX"]).parent)
    env["PATH"] = os.pathsep.join([str(link(binaries, tmp_path)), real, env.get("PATH", "")])
    env.update(
        {
            "CODEX_HOME": str(home),
            "HERMES_HOME": str(tmp_path / "hermes-home"),
            "RETHREAD_STORE": f"sqlite:{tmp_path / 'rethread.sqlite'}",
            "RETHREAD_SESSION_VAR": "HERMES_SESSION_ID",
            "RETHREAD_NOTICE": "item",
            **extra,
        }
    )
    return env


def hermes(env: dict[str, str], session: str, say: list[str], compress: bool = False) -> dict:
    """One Hermes process: its turns, as its user saw them."""
    spec = json.dumps({"session": session, "say": say, "compress": compress})
    done = subprocess.run(
        [sys.executable, str(HERE / "hermes_process.py"), spec],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def rethread(binaries, env: dict[str, str], *args: str):
    done = subprocess.run(
        [binaries["RETHREAD_BIN"], "--store", env["RETHREAD_STORE"], *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout)


def another_home(model, tmp_path: Path, name: str) -> Path:
    """An empty CODEX_HOME on the same offline model (a new machine)."""
    home = tmp_path / name
    home.mkdir()
    shutil.copy(model.homes[0] / "config.toml", home / "config.toml")
    return home


def test_codex_version_is_the_real_codexs(binaries, model, tmp_path):
    env = environment(binaries, tmp_path, model.homes[0])
    shown = subprocess.run(["codex", "--version"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("codex-cli ")
    assert binaries["RETHREAD_TEST_CODEX_VERSION"] in shown.stdout


def test_a_restart_and_a_new_machine_keep_the_conversation(binaries, model, tmp_path):
    env = environment(binaries, tmp_path, model.homes[0])
    session = "20261207_101500_a1b2c3"
    first = hermes(env, session, ["remember zebra"])
    assert first["turns"][0]["final_response"] == "echo: remember zebra"
    # (a) Hermes restarts: its next process, on the same session, is on the same thread.
    second = hermes(env, session, ["what did I say?"])
    assert second["turns"][0]["final_response"] == "echo: what did I say?"
    seen = model.conversations(at_least=2)[1]
    assert any(m["text"] == "remember zebra" for m in seen), seen
    # (b) A new machine: an empty CODEX_HOME sharing the store.
    moved = dict(env, CODEX_HOME=str(another_home(model, tmp_path, "machine-2")))
    third = hermes(moved, session, ["and now?"])
    assert third["turns"][0]["final_response"] == "echo: and now?"
    seen = model.conversations(at_least=3)[2]
    assert any(m["text"] == "remember zebra" for m in seen), seen
    # Nobody was told of a fallback.
    for run in (first, second, third):
        for turn in run["turns"]:
            assert FALLBACK_NOTICE not in json.dumps(turn)


def test_a_fallback_is_shown_once_and_the_reply_stays_the_models(binaries, model, tmp_path):
    # Without the mirror a lost rollout is lost: the next open falls back.
    env = environment(binaries, tmp_path, model.homes[0], RETHREAD_MIRROR="off")
    session = "20261207_102000_fa11ba"
    hermes(env, session, ["remember kiwi"])
    for rollout in (model.homes[0] / "sessions").rglob("rollout-*.jsonl"):
        rollout.unlink()
    run = hermes(env, session, ["still there?", "and now?"])
    fallback, after = run["turns"]
    # (c) Where Hermes' user sees it: shown as the agent's interim message, and in the turn's
    # projected messages, once, before the model's reply; the final reply is the model's.
    assert fallback["final_response"] == "echo: still there?"
    assert fallback["interim"].count(FALLBACK_NOTICE) == 1, fallback
    assert fallback["projected"][0] == FALLBACK_NOTICE, fallback
    assert fallback["projected"][-1] == "echo: still there?", fallback
    assert FALLBACK_NOTICE not in json.dumps(after), after
    shown = rethread(binaries, env, "sessions", "show", session, "--json")
    assert shown["last_fallback"]["pending"] is False
    # The new thread was seeded from the transcript, and the notice is not in it.
    seen = model.conversations(at_least=2)[1]
    assert any("remember kiwi" in m["text"] for m in seen), seen
    rows = rethread(binaries, env, "sessions", "show", session, "--rows", "--json")["rows"]
    assert all(r["row"].get("text") != FALLBACK_NOTICE for r in rows), rows
    # The next Hermes process resumes the new thread and is told nothing; (d) its `/compress`
    # (codex's own compaction, a turn with no user input) adds no user row.
    again = hermes(env, session, ["hello again"], compress=True)
    assert FALLBACK_NOTICE not in json.dumps(again)
    assert again["compressed"] == {"ran": True}
    rows = rethread(binaries, env, "sessions", "show", session, "--rows", "--json")["rows"]
    users = [r["row"]["text"] for r in rows if r["row"].get("role") == "user"]
    assert users == ["remember kiwi", "still there?", "and now?", "hello again"], rows
