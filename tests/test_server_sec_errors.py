"""What error answers tell clients: the problem, never where the server keeps its data."""

from __future__ import annotations

from pathlib import Path

import httpx
from test_server_direct import serving

from journalq.server.protocol import DirectHttpToolsProtocol


def test_an_answer_about_a_missing_queue_does_not_name_the_data_directory(tmp_path: Path) -> None:
    """A 404 for a queue that is not there said ``no queue or topic 'nope' in /srv/data``: the
    data directory's path, the server's business only. Every REST path that meets the missing
    queue (FastAPI's routes, the plain ASGI POST, the direct POST) answers without it."""
    data = tmp_path / "secret-place" / "data"
    with serving(data, DirectHttpToolsProtocol) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        answers = {
            "get queue": client.get("/nope"),
            "delete queue": client.delete("/nope"),
            "fetch": client.get("/nope/messages"),
            "direct post": client.post("/nope/messages", content=b"x"),
            "asgi post": client.post("/nope/messages", content=b"x", headers={"Expect": "100-continue"}),
            "delete message": client.delete("/nope/messages/0"),
        }
    for what, answer in answers.items():
        assert answer.status_code == 404, (what, answer.text)
        error = answer.json()["error"]
        assert "'nope'" in error, (what, error)  # still names the queue
        assert "secret-place" not in error and str(tmp_path) not in error, (what, error)
