"""What error answers tell clients: the problem, never where the server keeps its data; the busy
answer past the concurrency limit (under httptools and the h11 fallback alike); a Query-protocol
request told that the endpoint speaks SQS's JSON protocol."""

from __future__ import annotations

from pathlib import Path

import httpx
from test_server_direct import serving

from journalq.server.h11_protocol import StoppingH11Protocol
from journalq.server.polling import BUSY_BODY
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


def _damage_second_message(queue_dir: Path) -> None:
    """Flip the bytes of the second message's key length in the queue's journal."""
    (segment,) = (queue_dir / "jnl").glob("*.jnl")
    content = bytearray(segment.read_bytes())
    first_size = len(content) // 3  # three messages of one size
    for i in range(first_size + 16, first_size + 20):  # its key length (sej's header)
        content[i] ^= 0xFF
    segment.write_bytes(bytes(content))


def test_damaged_stored_data_is_a_server_error_that_names_no_file(tmp_path: Path) -> None:
    """A queue whose journal is damaged was answered 400 (as if the request were wrong) with the
    segment's absolute path, and SQS's InternalFailure named the file too. Now: 500, the
    reason, no path (the log has the whole story), once the message before the damage is taken."""
    data = tmp_path / "secret-place" / "data"
    with serving(data, DirectHttpToolsProtocol) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        assert client.put("/damaged").status_code == 201
        for body in (b"first", b"other", b"third"):
            assert client.post("/damaged/messages", content=body).status_code == 201
        _damage_second_message(data / "damaged")
        first = client.get("/damaged/messages")  # the whole message before the damage still goes out
        assert (first.status_code, first.content) == (200, b"first"), first.text
        rest = client.get("/damaged/messages")
        sqs = client.post("/", headers={"X-Amz-Target": "AmazonSQS.ReceiveMessage",
                                        "Content-Type": "application/x-amz-json-1.0"},
                          json={"QueueUrl": f"http://127.0.0.1:{port}/000000000000/damaged",
                                "MaxNumberOfMessages": 10})
    assert rest.status_code == 500, rest.text
    assert sqs.status_code == 500 and sqs.json()["__type"].endswith("InternalFailure"), sqs.text
    for answer in (rest.text, sqs.text):
        assert "secret-place" not in answer and ".jnl" not in answer, answer
        assert "key length" in answer, answer  # the reason


def test_sqs_json_nested_too_deep_is_invalid_request(tmp_path: Path) -> None:
    """A body of JSON nested deeper than Python's recursion limit (a few kB) made the JSON decoder
    raise RecursionError, which is no ValueError: the direct path's parser callback failed (a
    plain-text 400 from uvicorn, not SQS's shape) and the ASGI path answered 500 with a
    traceback in the log. It is a body that is not a JSON object: SQS's InvalidRequest, 400."""
    deep = b'{"QueueUrl": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with serving(tmp_path / "data", DirectHttpToolsProtocol) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        for target in ("SendMessage", "ListQueues"):
            for extra in ({}, {"Expect": "100-continue"}):  # the direct path, and the ASGI one
                answer = client.post("/", content=deep, headers={
                    "X-Amz-Target": f"AmazonSQS.{target}", "Content-Type": "application/x-amz-json-1.0", **extra})
                assert answer.status_code == 400, (target, extra, answer.text)
                assert answer.json()["__type"].endswith("InvalidRequest"), (target, extra, answer.text)
        assert client.get("/healthz").status_code == 200


def test_sqs_attribute_names_that_are_not_strings_are_invalid_parameter_value(tmp_path: Path) -> None:
    """GetQueueAttributes with ``AttributeNames: [{}]`` looked the dict up in a set: TypeError,
    a 500 with a traceback in the log. Found by feeding every action values of the wrong types."""
    with serving(tmp_path / "data", DirectHttpToolsProtocol) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        def sqs(action: str, payload: dict[str, object]) -> httpx.Response:
            return client.post("/", json=payload, headers={
                "X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"})

        url = sqs("CreateQueue", {"QueueName": "typed"}).json()["QueueUrl"]
        for names in ([{}], [["All"]], [1]):
            answer = sqs("GetQueueAttributes", {"QueueUrl": url, "AttributeNames": names})
            assert answer.status_code == 400, (names, answer.text)
            assert answer.json()["__type"].endswith("InvalidParameterValue"), (names, answer.text)
        assert sqs("GetQueueAttributes", {"QueueUrl": url, "AttributeNames": ["All"]}).status_code == 200


def test_a_request_past_the_concurrency_limit_is_answered_503_with_retry_after(tmp_path: Path) -> None:
    """Past uvicorn's ``limit_concurrency`` (``journalq serve``'s connection limit) the answer was
    uvicorn's plain-text 503 with no Retry-After, unlike every other 503 of the server. With a
    limit of one, a request's own connection fills it: every request, the direct path's POST
    too, is turned away, and nothing is stored."""
    with serving(tmp_path / "data", DirectHttpToolsProtocol, limit_concurrency=1) as port:
        base = f"http://127.0.0.1:{port}"
        for method, path, body in [("PUT", "/q", b""), ("POST", "/q/messages", b"hello"), ("GET", "/healthz", b"")]:
            answer = httpx.request(method, base + path, content=body)
            assert answer.status_code == 503, (method, path)
            assert answer.headers["retry-after"] == "1"
            assert answer.headers["connection"] == "close"
            assert answer.json() == {"error": "the server is busy: too many requests under way; send again later",
                                     "kind": "busy"}
    assert not (tmp_path / "data" / "q").exists()


def test_the_h11_fallback_answers_a_request_past_the_concurrency_limit_as_httptools_does(tmp_path: Path) -> None:
    """Under h11 (``journalq serve`` without httptools) a request past ``limit_concurrency`` got
    uvicorn's own plain 503, with no Retry-After; it now gets the server's busy answer, as under
    httptools. With a limit of one, a request's own connection fills it; below it, all is served."""
    with serving(tmp_path / "data", StoppingH11Protocol, limit_concurrency=1) as port:
        base = f"http://127.0.0.1:{port}"
        for method, path, body in [("PUT", "/q", b""), ("POST", "/q/messages", b"hello"), ("GET", "/healthz", b"")]:
            answer = httpx.request(method, base + path, content=body)
            assert answer.status_code == 503, (method, path)
            assert answer.headers["retry-after"] == "1" and answer.headers["connection"] == "close"
            assert answer.content == BUSY_BODY
    assert not (tmp_path / "data" / "q").exists()
    with serving(tmp_path / "data", StoppingH11Protocol, limit_concurrency=2) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
        assert [http.put("/q").status_code, http.post("/q/messages", content=b"hi").status_code] == [201, 201]
        assert http.get("/q/messages").content == b"hi"


def test_an_sqs_request_that_names_no_action_is_told_how_to_name_one(tmp_path: Path) -> None:
    """A POST to ``/`` with neither an X-Amz-Target (SQS's JSON protocol) nor a form (its Query
    protocol) is told both ways of naming an action; a form without ``Action`` is told so in the
    Query protocol's XML."""
    with serving(tmp_path / "data", StoppingH11Protocol) as port:
        answer = httpx.post(f"http://127.0.0.1:{port}/", content=b"{}",
                            headers={"Content-Type": "application/x-amz-json-1.0"})
        assert answer.status_code == 400 and answer.headers["x-amzn-query-error"] == "InvalidAction;Sender"
        message = answer.json()["message"]
        assert "X-Amz-Target" in message and "JSON protocol" in message and "Action parameter" in message
        form = httpx.post(f"http://127.0.0.1:{port}/", content=b"Version=2012-11-05",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 400 and form.headers["content-type"] == "text/xml"
        assert "<Code>MissingAction</Code>" in form.text and "names no action" in form.text
        named = httpx.post(f"http://127.0.0.1:{port}/", content=b"{}", headers={"X-Amz-Target": "Other.Thing"})
        assert named.json()["message"] == "X-Amz-Target 'Other.Thing' is not an Amazon SQS action"
