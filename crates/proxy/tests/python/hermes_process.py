"""One Hermes process, as `test_hermes.py` starts it: Hermes' own `AIAgent` (hermes-agent
0.19.0, unmodified) on its `codex_app_server` runtime, which runs `codex app-server` from
`PATH` (here rethread's `codex` link). `config.yaml`'s `model.openai_runtime:
codex_app_server` selects exactly this `api_mode` for an OpenAI login; offline there is no
login to resolve, so the agent is given the `api_mode` directly.

Usage: python hermes_process.py '{"session": ID, "say": [TEXT...], "compress": BOOL}'

Prints one JSON object: per turn what Hermes' user sees (`interim`: the messages the agent's
`interim_assistant_callback` got; `final_response`; `projected`: the assistant messages the
turn added to Hermes' transcript), and `compressed` (whether `/compress` ran, and its error).
"""

from __future__ import annotations

import json
import sys

from run_agent import AIAgent


def main() -> None:
    spec = json.loads(sys.argv[1])
    interim: list[str] = []
    agent = AIAgent(
        api_mode="codex_app_server",
        # Hermes' own call to a model is never made on this runtime; codex calls the model.
        base_url="http://127.0.0.1:9/v1",
        api_key="unused",
        model="gpt-test",
        session_id=spec["session"],
        quiet_mode=True,
        skip_context_files=True,
        interim_assistant_callback=lambda text, **_: interim.append(text),
    )
    assert agent.api_mode == "codex_app_server", agent.api_mode
    history: list[dict] = []
    turns = []
    for text in spec["say"]:
        interim.clear()
        result = agent.run_conversation(text, conversation_history=history)
        added = result["messages"][len(history) :]
        history = result["messages"]
        turns.append(
            {
                "final_response": result["final_response"],
                "error": result.get("error"),
                "interim": list(interim),
                "projected": [
                    m.get("content") for m in added if m.get("role") == "assistant"
                ],
            }
        )
    compressed = None
    if spec.get("compress"):
        # What Hermes' `/compress` runs (cli.py `_manual_compress`): on this runtime, codex's own
        # `thread/compact/start` on the agent's thread.
        before = agent._codex_session
        agent._compress_context(history, None, force=True)
        compressed = {"ran": before is not None}
    session = getattr(agent, "_codex_session", None)
    if session is not None:
        session.close()
    print(json.dumps({"turns": turns, "compressed": compressed}))


if __name__ == "__main__":
    main()
