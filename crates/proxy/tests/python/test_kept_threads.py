"""README's host that keeps codex thread ids in its own database (`examples/python/
keep_thread_ids.py`, no rethread session) against the real codex: a turn on one home, the home
deleted, the thread resumed by its id on a second, empty home sharing the store; the model's
request there holds the first turn. On SQLite, and on PostgreSQL when
`RETHREAD_TEST_POSTGRES_URL` is set (required under CI)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import _required

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "python" / "keep_thread_ids.py"


def example():
    spec = importlib.util.spec_from_file_location("keep_thread_ids", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def store_url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:{tmp_path / 'rethread.sqlite'}"
    base = os.environ.get("RETHREAD_TEST_POSTGRES_URL")
    if not base:
        if _required():
            pytest.fail("RETHREAD_TEST_POSTGRES_URL is required under CI")
        pytest.skip("RETHREAD_TEST_POSTGRES_URL is not set")
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}schema=kept_py_{os.getpid()}_{time.time_ns()}"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_host_that_keeps_thread_ids_resumes_on_a_second_home(binaries, model, tmp_path, backend):
    store = store_url(backend, tmp_path)
    first, second = model.homes[0], tmp_path / "machine-2"
    second.mkdir()
    shutil.copy(first / "config.toml", second / "config.toml")  # the same model, offline
    threads = example().run(
        tmp_path, binaries["RETHREAD_BIN"], binaries["RETHREAD_TEST_CODEX"], store, [first, second]
    )
    assert threads[0] == threads[1]
    assert not first.exists()
    moved = model.conversations(at_least=2)[1]
    assert any(m["text"] == "My order number is 4711." for m in moved), moved
    assert any(m["text"] == "What is my order number?" for m in moved), moved
