"""`xdiag mcp --http` keeps a bounded number of MCP sessions: a flood of `initialize` calls from a local process ends
the least recently used sessions and never locks a client out (issue 72, item 16). Loopback only, a bounded number
of requests."""

from __future__ import annotations

from tests.test_agent import _http_server
from xdiag.agent.http_guard import MAX_SESSIONS

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_a_flood_of_sessions_ends_the_least_recently_used_and_a_client_still_opens_one(tmp_path):
    # Before: the SDK kept 10,000 sessions for 30 minutes each and answered every new one 503 past them: the flood
    # below kept every session (the first still answered), and 10,000 of them locked the real client out.
    import httpx2

    server, url = _http_server(tmp_path)
    try:
        with httpx2.Client(timeout=30) as http:
            opened = []
            for _ in range(MAX_SESSIONS + 16):
                answered = http.post(url, json=INITIALIZE, headers=HEADERS)
                assert answered.status_code == 200, answered.text
                opened.append(answered.headers["mcp-session-id"])
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

            def list_tools(session_id: str) -> int:
                return http.post(url, json=listing, headers={**HEADERS, "mcp-session-id": session_id,
                                                             "mcp-protocol-version": "2025-11-25"}).status_code

            assert list_tools(opened[0]) == 404  # the least recently used ended: the client opens another
            assert list_tools(opened[-1]) == 200
            client = http.post(url, json=INITIALIZE, headers=HEADERS)
            assert client.status_code == 200, client.text
            assert list_tools(client.headers["mcp-session-id"]) == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
