"""Checking AWS Signature Version 4 ``Authorization`` headers, as Amazon SQS does.

Pure functions over the request's parts (no HTTP framework): ``verify`` recomputes the signature
of a request from the secret configured for its access key id and compares it in constant time.

What is signed (https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html)::

    canonical request = METHOD \\n canonical URI \\n canonical query string \\n
                        canonical headers \\n \\n signed headers \\n payload hash
    string to sign    = AWS4-HMAC-SHA256 \\n X-Amz-Date \\n DATE/REGION/SERVICE/aws4_request \\n
                        hex SHA-256 of the canonical request
    signing key       = HMAC chain of "AWS4" + secret over DATE, REGION, SERVICE, "aws4_request"

The canonical URI is computed the way AWS services other than S3 (and botocore) do: dot segments
and empty segments removed from the path *as sent* (still percent-encoded), then percent-encoded
again. ``path`` must therefore be the raw request path; for the paths SQS clients use (``/`` or
``/ACCOUNT/QUEUE`` with queue names of letters, digits, ``-``, ``_`` and ``.``) the decoded path
is the same string.

Only the header form is supported (no presigned query-string signatures, no SigV4a). ``host``
and, when the request has one, ``x-amz-target`` (the action) must be signed headers. A payload
must be signed: ``x-amz-content-sha256: UNSIGNED-PAYLOAD`` (or a streaming variant) is refused,
and when that header carries a hash it must be the body's.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Mapping
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
_DATE_FORMAT = "%Y%m%dT%H%M%SZ"


class AuthError(Exception):
    """A request whose authentication fails, with the code Amazon SQS answers with:

    ``MissingAuthenticationToken`` (no ``Authorization`` header), ``IncompleteSignature`` (a
    header that is not a well-formed SigV4 one, or no ``X-Amz-Date``), ``InvalidClientTokenId``
    (an access key id that is not configured), ``SignatureDoesNotMatch``, ``RequestExpired``
    (``X-Amz-Date`` further than ``max_skew`` seconds from now). ``status`` is the HTTP status
    AWS uses for the code."""

    STATUS = {
        "MissingAuthenticationToken": 403,
        "IncompleteSignature": 400,
        "InvalidClientTokenId": 403,
        "SignatureDoesNotMatch": 403,
        "RequestExpired": 400,
    }

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = self.STATUS.get(code, 403)


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The SigV4 signing key of ``secret`` for a day (``YYYYMMDD``), region and service."""
    key = _hmac(("AWS4" + secret).encode("utf-8"), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, also dropping empty segments (AWS collapses ``//``)."""
    if not path:
        return "/"
    segments: list[str] = []
    for segment in path.split("/"):
        if not segment or segment == ".":
            continue
        if segment == "..":
            if segments:
                segments.pop()
        else:
            segments.append(segment)
    first = "/" if path.startswith("/") else ""
    last = "/" if path.endswith("/") and segments else ""
    return first + "/".join(segments) + last


def canonical_uri(path: str) -> str:
    """The canonical URI of a raw (percent-encoded) request path, for services other than S3."""
    return quote(_remove_dot_segments(path), safe="/~")


def canonical_query_string(query: str) -> str:
    """Each ``name=value`` pair decoded, encoded again the canonical way (RFC 3986 unreserved
    characters left as they are, everything else ``%XX``), sorted by name, then value."""
    if not query:
        return ""
    pairs = []
    for pair in query.split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        pairs.append((quote(unquote(name), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def canonical_headers(headers: Mapping[str, str], signed: list[str]) -> str:
    """``name:value`` lines of the signed headers, values trimmed and inner runs of spaces made
    one, each line ending with a newline."""
    return "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in signed)


def canonical_request(
    method: str, path: str, query: str, headers: Mapping[str, str], signed: list[str], payload_hash: str
) -> str:
    """The canonical request; ``headers`` with lowercase names, ``signed`` in signed order."""
    return "\n".join(
        (
            method.upper(),
            canonical_uri(path),
            canonical_query_string(query),
            canonical_headers(headers, signed),
            ";".join(signed),
            payload_hash,
        )
    )


def string_to_sign(amz_date: str, scope: str, request: str) -> str:
    return "\n".join((ALGORITHM, amz_date, scope, hashlib.sha256(request.encode("utf-8")).hexdigest()))


def _parse_authorization(value: str) -> tuple[str, list[str], str]:
    """(credential, signed header names, signature) of an ``Authorization`` header."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthError(
            "IncompleteSignature", f"unsupported authorization algorithm {algorithm!r}: only {ALGORITHM} is"
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, field_value = part.strip().partition("=")
        if sep:
            fields[name.strip()] = field_value.strip()
    missing = [n for n in ("Credential", "SignedHeaders", "Signature") if not fields.get(n)]
    if missing:
        raise AuthError(
            "IncompleteSignature",
            f"Authorization header requires {', '.join(missing)} (Credential=, SignedHeaders=, Signature=)",
        )
    return fields["Credential"], fields["SignedHeaders"].split(";"), fields["Signature"]


def _parse_date(amz_date: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(amz_date, _DATE_FORMAT)))
    except ValueError:
        raise AuthError(
            "IncompleteSignature",
            f"X-Amz-Date {amz_date!r} is not an ISO 8601 basic date such as 20150830T123600Z",
        ) from None


def verify(
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    body: bytes,
    credentials: Mapping[str, str],
    *,
    service: str = "sqs",
    max_skew: float = 300,
    now: float | None = None,
) -> str:
    """Check the SigV4 ``Authorization`` header of a request; returns its access key id.

    ``path``: the raw request path; ``query``: the raw query string (without ``?``);
    ``headers``: the request headers (any case; each name once, repeated headers joined with
    ``,``); ``credentials``: access key id -> secret access key. Any region is accepted (the
    signature covers the one the client chose). Raises ``AuthError``.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    authorization = lowered.get("authorization")
    if not authorization:
        raise AuthError("MissingAuthenticationToken", "Request is missing Authentication Token")
    credential, signed, signature = _parse_authorization(authorization)

    scope_parts = credential.rsplit("/", 4)
    if len(scope_parts) != 5 or scope_parts[4] != "aws4_request" or not all(scope_parts):
        raise AuthError(
            "IncompleteSignature",
            f"Credential {credential!r} is not of the form ACCESS_KEY_ID/YYYYMMDD/REGION/SERVICE/aws4_request",
        )
    key_id, scope_date, region, scope_service, _ = scope_parts
    if not signed or any(not n or n != n.lower() for n in signed):
        raise AuthError(
            "IncompleteSignature", "SignedHeaders must be lowercase header names separated by ';'."
        )
    if "host" not in signed:
        raise AuthError("IncompleteSignature", "'Host' must be a signed header in the Authorization header.")
    if "x-amz-target" in lowered and "x-amz-target" not in signed:
        # It names the action: unsigned, a captured request could be replayed as another action
        # on the same body (a ReceiveMessage's QueueUrl as a DeleteQueue). AWS wants every x-amz-*
        # header signed; this one is what matters here (proxies add others, CloudFront's own).
        raise AuthError(
            "IncompleteSignature", "'X-Amz-Target' must be a signed header in the Authorization header."
        )
    secret = credentials.get(key_id)
    if secret is None:
        raise AuthError("InvalidClientTokenId", "The security token included in the request is invalid.")
    if scope_service != service:
        raise AuthError(
            "SignatureDoesNotMatch", f"Credential should be scoped to correct service: {service!r}."
        )

    amz_date = lowered.get("x-amz-date")
    if not amz_date:
        raise AuthError(
            "IncompleteSignature", "Authorization header requires existence of a 'X-Amz-Date' header."
        )
    signed_at = _parse_date(amz_date.strip())
    if scope_date != amz_date.strip()[:8]:
        raise AuthError(
            "SignatureDoesNotMatch",
            f"Date in Credential scope ({scope_date}) does not match YYYYMMDD from X-Amz-Date ({amz_date}).",
        )
    current = time.time() if now is None else now
    if abs(current - signed_at) > max_skew:
        now_text = time.strftime(_DATE_FORMAT, time.gmtime(current))
        raise AuthError(
            "RequestExpired",
            f"Request has expired: signed at {amz_date}, now {now_text}, more than {max_skew:g} seconds apart.",
        )

    absent = [name for name in signed if name not in lowered]
    if absent:
        raise AuthError(
            "SignatureDoesNotMatch", f"signed header(s) missing from the request: {', '.join(absent)}"
        )

    body_hash = hashlib.sha256(body).hexdigest()
    declared = lowered.get("x-amz-content-sha256")
    if declared is not None:
        declared = declared.strip()
        if not hmac.compare_digest(declared.lower(), body_hash):
            if declared.upper().startswith(("UNSIGNED-PAYLOAD", "STREAMING-")):
                reason = "the payload must be signed (x-amz-content-sha256 cannot be UNSIGNED-PAYLOAD or streaming)"
            else:
                reason = "x-amz-content-sha256 is not the SHA-256 of the request body"
            raise AuthError("SignatureDoesNotMatch", reason)
        payload_hash = declared
    else:
        payload_hash = body_hash

    request = canonical_request(method, path, query, lowered, signed, payload_hash)
    scope = f"{scope_date}/{region}/{service}/aws4_request"
    expected = hmac.new(
        signing_key(secret, scope_date, region, service),
        string_to_sign(amz_date.strip(), scope, request).encode("utf-8"),
        hashlib.sha256,
    ).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "replace")):
        raise AuthError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )
    return key_id


__all__ = [
    "ALGORITHM",
    "AuthError",
    "canonical_query_string",
    "canonical_request",
    "canonical_uri",
    "signing_key",
    "verify",
]
