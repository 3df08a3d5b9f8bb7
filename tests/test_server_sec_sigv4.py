"""SigV4 of the SQS API against the real server, signed by botocore's own signer: the canonical
request the server computes must be the one AWS defines, for every request a client can sign."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from test_server_harness import ServerProcess, module_server

KEY, SECRET = "AKIDSIGV4", "sigv4-secret"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory, "--aws-key", f"{KEY}:{SECRET}")


def _post_signed(url: str, action: str, payload: dict[str, object], secret: str = SECRET) -> httpx.Response:
    request = AWSRequest(
        method="POST", url=url, data=json.dumps(payload).encode(),
        headers={"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"},
    )
    SigV4Auth(Credentials(KEY, secret), "sqs", "us-east-1").add_auth(request)
    # The URL as signed, percent-encoding and all: httpx sends its path as it is.
    return httpx.post(request.url, content=request.body, headers=dict(request.headers.items()))


@pytest.mark.parametrize("path", ["/my%20endpoint/", "/%C3%A9t%C3%A9/", "/a%2Fb", "/sqs%3Bv1/"])
def test_a_path_with_percent_escapes_is_verified_as_signed(server: ServerProcess, path: str) -> None:
    """The canonical URI is made from the path as sent (still percent-encoded), encoded once more;
    the server checked the decoded path instead, and refused these requests (403)."""
    answer = _post_signed(f"{server.url}{path}", "ListQueues", {})
    assert answer.status_code == 200, answer.text
    # Still checked: another secret over the same path is refused.
    wrong = _post_signed(f"{server.url}{path}", "ListQueues", {}, secret="not-the-secret")
    assert wrong.status_code == 403 and wrong.json()["__type"].endswith("SignatureDoesNotMatch")


def test_an_action_outside_the_signature_is_refused(server: ServerProcess) -> None:
    """``X-Amz-Target`` names the action: a request whose signature does not cover it could be
    replayed (within the 5 minutes the date allows) as another action on the same body, a
    ReceiveMessage's ``{"QueueUrl": ...}`` as a PurgeQueue or a DeleteQueue. AWS wants every
    ``x-amz-*`` header of a request signed; the server checked only that ``host`` was."""
    queue_url = _post_signed(f"{server.url}/", "CreateQueue", {"QueueName": "kept"}).json()["QueueUrl"]
    assert _post_signed(f"{server.url}/", "SendMessage", {"QueueUrl": queue_url, "MessageBody": "m"}).status_code == 200
    body = json.dumps({"QueueUrl": queue_url}).encode()
    request = AWSRequest(method="POST", url=f"{server.url}/", data=body,
                         headers={"Content-Type": "application/x-amz-json-1.0"})
    SigV4Auth(Credentials(KEY, SECRET), "sqs", "us-east-1").add_auth(request)
    assert "x-amz-target" not in request.headers["Authorization"]
    headers = {**dict(request.headers.items()), "X-Amz-Target": "AmazonSQS.DeleteQueue"}  # added after signing
    replayed = httpx.post(request.url, content=body, headers=headers)
    assert replayed.status_code == 400, replayed.text
    assert replayed.json()["__type"].endswith("IncompleteSignature"), replayed.text
    assert "x-amz-target" in replayed.json()["message"].lower()
    attributes = _post_signed(f"{server.url}/", "GetQueueAttributes",
                              {"QueueUrl": queue_url, "AttributeNames": ["ApproximateNumberOfMessages"]})
    assert attributes.status_code == 200, attributes.text  # the queue is still there, its message too
    assert attributes.json()["Attributes"]["ApproximateNumberOfMessages"] == "1"
