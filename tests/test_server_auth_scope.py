"""What a server guarded by ``--token`` (or AWS keys) leaves open, and what it does not."""

from __future__ import annotations

from pathlib import Path

import httpx
from test_server_rest_ids import served

TOKEN = "s3cret-token"


def test_metrics_need_the_token_and_the_probes_stay_open(tmp_path: Path) -> None:
    """``/metrics`` names every queue and its depths: it was open with ``--token`` set.
    Prometheus sends a bearer token (``authorization`` in a scrape config): it needs the token
    now; ``/healthz`` and ``/readyz`` (probes, which name nothing) stay open."""

    async def talk(client: httpx.AsyncClient) -> dict[str, httpx.Response]:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        await client.put("/secret-queue", headers=auth)
        return {
            "anonymous": await client.get("/metrics"),
            "wrong": await client.get("/metrics", headers={"Authorization": "Bearer nope"}),
            "token": await client.get("/metrics", headers=auth),
            "healthz": await client.get("/healthz"),
            "readyz": await client.get("/readyz"),
            "openapi": await client.get("/openapi.json"),
        }

    answers = served(tmp_path, talk, rest_token=TOKEN)
    for refused in ("anonymous", "wrong"):
        assert answers[refused].status_code == 401, answers[refused].text
        assert "secret-queue" not in answers[refused].text
        assert answers[refused].headers["www-authenticate"].startswith("Bearer")
    assert answers["token"].status_code == 200 and 'queue="secret-queue"' in answers["token"].text
    assert answers["healthz"].status_code == 200 and answers["readyz"].status_code == 200
    documented = answers["openapi"].json()["paths"]["/metrics"]["get"]
    assert "401" in documented["responses"] and documented["security"] == [{"bearer": []}]


def test_metrics_are_open_without_a_token(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        return await client.get("/metrics")

    assert served(tmp_path, talk).status_code == 200
