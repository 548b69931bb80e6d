"""The upstream agents a gateway may run: --agents and --agents-file."""

from __future__ import annotations

from pathlib import Path

import pytest

from agui_hub.bridge.agents import AgentEndpoint, load_agents, parse_agents

pytestmark = pytest.mark.timeout(30)


def test_agents_from_the_flag_and_credentials_out_of_the_url() -> None:
    agents = parse_agents("a=http://127.0.0.1:1/x, b=https://user:pw@agents.example/b")
    assert agents["a"].url == "http://127.0.0.1:1/x" and agents["a"].raw_events is None
    assert agents["b"].url == "https://agents.example/b"
    assert dict(agents["b"].headers)["Authorization"].startswith("Basic ")
    for spec, why in [
        ("a", "NAME=URL"),
        ("a=ftp://h/", "not an http"),
        ("a=http://h,a=http://h", "twice"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_agents(spec)


def test_an_agents_file_sets_headers_timeouts_and_raw_events(tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(
        '[agents.lg]\nurl = "http://127.0.0.1:8000/"\nheaders = { X-Key = "k" }\n'
        'idle_timeout = 60\nraw_events = "strip"\n'
    )
    (agent,) = load_agents(str(path)).values()
    assert (agent.headers, agent.idle_timeout, agent.raw_events) == ((("X-Key", "k"),), 60, "strip")
    path.write_text('[agents.lg]\nurl = "http://127.0.0.1:8000/"\nraw_events = "some"\n')
    with pytest.raises(ValueError, match="raw_events is one of keep, strip, drop"):
        load_agents(str(path))
    path.write_text('[agents.lg]\nurl = "http://127.0.0.1:8000/"\nraw = "drop"\n')
    with pytest.raises(ValueError, match="unknown key 'raw'"):
        load_agents(str(path))
    with pytest.raises(ValueError, match="idle_timeout"):
        AgentEndpoint("x", "http://h/", idle_timeout=0)
