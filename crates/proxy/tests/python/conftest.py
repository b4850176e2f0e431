"""Fixtures for driving `rethread app-server` with the unmodified `openai-codex` Python SDK.

`cargo xtask ci` runs these tests in a venv under `target/` with:

- `RETHREAD_BIN`: the `rethread` binary (what the SDK is told is codex);
- `RETHREAD_STAND_IN_BIN`: the `responses_stand_in` example of `rethread-proxy` (the offline
  model: it writes each CODEX_HOME's config.toml and logs what the model saw);
- `RETHREAD_TEST_CODEX`: the real codex behind the proxy, and `RETHREAD_TEST_CODEX_VERSION`
  its version (xtask passes the current release of `codex-releases.txt`).

A missing variable skips the tests, unless `RETHREAD_REQUIRE_REAL_CODEX=1` or `CI=true`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NEEDED = (
    "RETHREAD_BIN",
    "RETHREAD_STAND_IN_BIN",
    "RETHREAD_TEST_CODEX",
    "RETHREAD_TEST_CODEX_VERSION",
)


def _required() -> bool:
    return os.environ.get("RETHREAD_REQUIRE_REAL_CODEX") == "1" or os.environ.get(
        "CI", ""
    ).lower() == "true"


@pytest.fixture(scope="session")
def binaries() -> dict[str, str]:
    missing = [name for name in NEEDED if not os.environ.get(name)]
    if missing:
        message = f"unset: {', '.join(missing)} (run through `cargo xtask ci`)"
        if _required():
            pytest.fail(message)
        pytest.skip(message)
    return {name: os.environ[name] for name in NEEDED}


@dataclass
class Model:
    """The running Responses-API stand-in and what it saw."""

    process: subprocess.Popen
    log: Path
    base_url: str
    homes: list[Path] = field(default_factory=list)

    def conversations(self, at_least: int, timeout: float = 10.0) -> list[list[dict]]:
        """The conversations of the model requests so far (waits for `at_least` of them)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.log.read_text().splitlines() if self.log.exists() else []
            if len(lines) >= at_least or time.monotonic() > deadline:
                return [json.loads(line)["conversation"] for line in lines]
            time.sleep(0.02)


@pytest.fixture
def model(binaries: dict[str, str], tmp_path: Path):
    """The offline model, with `tmp_path/codex-home` configured to use it."""
    home = tmp_path / "codex-home"
    log = tmp_path / "model-requests.jsonl"
    process = subprocess.Popen(
        [binaries["RETHREAD_STAND_IN_BIN"], "--codex-home", str(home), "--log", str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    first = process.stdout.readline()
    base_url = json.loads(first)["base_url"]
    yield Model(process=process, log=log, base_url=base_url, homes=[home])
    process.stdin.close()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
