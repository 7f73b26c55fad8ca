"""A cancelled MCP `analyze` leaves nothing that blocks the next call: the retry of the same call (the same `out`)
is answered (issue 72, item 9)."""

from __future__ import annotations

import json
import shutil

import anyio

from tests.test_agent import LONG_ANALYSIS, _serving, _until, _wire_server
from xdiag.cloud.embedded import OUT_LOCK


def test_the_retry_of_a_cancelled_analysis_into_the_same_folder_is_answered(tmp_path):
    # Before: the cancelled analysis left its lock file and a partial folder, and every retry was refused "a folder
    # that holds files but no analysis", with no tool to clear it.
    import psutil

    shutil.copyfile(LONG_ANALYSIS, tmp_path / LONG_ANALYSIS.name)
    server, send, response = _wire_server(tmp_path)
    arguments = {"path": str(tmp_path / LONG_ANALYSIS.name), "out": str(tmp_path / "out")}
    try:
        send({"id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                          "clientInfo": {"name": "test", "version": "0"}}})
        response(1, [])
        send({"method": "notifications/initialized"})
        send({"id": 2, "method": "tools/call", "params": {"name": "analyze", "arguments": arguments}})
        worker = anyio.run(_until, lambda: _serving(psutil.Process(server.pid)), "the analysis's worker")[0]
        anyio.run(_until, lambda: (tmp_path / "out" / OUT_LOCK).exists(), "the analysis's lock")
        send({"method": "notifications/cancelled", "params": {"requestId": 2, "reason": "the user stopped it"}})
        worker.wait(timeout=60)
        assert (tmp_path / "out" / OUT_LOCK).exists() and not (tmp_path / "out" / "analysis.json").exists()
        send({"id": 3, "method": "tools/call", "params": {"name": "analyze", "arguments": arguments}})
        answered = response(3, [])["result"]
        assert not answered.get("isError"), answered["content"][0]["text"]
        assert json.loads(answered["content"][0]["text"])["status"] in ("OPTIMAL", "NEEDS_ATTENTION")
        assert (tmp_path / "out" / "analysis.json").is_file() and not (tmp_path / "out" / OUT_LOCK).exists()
    finally:
        server.kill()
        server.wait(timeout=30)
