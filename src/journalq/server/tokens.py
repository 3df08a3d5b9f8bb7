"""Bearer tokens (RFC 6750), as the REST API and the hub check them."""

from __future__ import annotations

import hmac


def bearer_matches(authorization: bytes, token: str) -> bool:
    """Whether an ``Authorization`` header's value carries ``token`` in the Bearer scheme, whose
    name is case-insensitive (RFC 9110: ``bearer TOKEN`` is as good); compared in constant time."""
    scheme, _, credentials = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token.encode())
