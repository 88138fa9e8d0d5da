"""What a bearer token may hold, one rule for every place that takes one."""

from __future__ import annotations


def token_problem(token: str | None) -> str | None:
    """Why ``token`` cannot be sent as ``Authorization: Bearer <token>``, or None. An HTTP
    header holds visible ASCII: a token with a space, a newline (one read from a file
    keeps its last) or a non-ASCII character cannot be sent, and the HTTP library's
    refusal quotes the header, token and all, which the controller passed on in its
    502 and in the host's disconnect reason. The answer never quotes the token."""
    if not token:
        return None
    bad = next((ch for ch in token if not 0x21 <= ord(ch) <= 0x7E), None)
    if bad is None:
        return None
    what = {" ": "a space", "\n": "a newline", "\r": "a carriage return", "\t": "a tab"}.get(bad) or (
        "a control character" if ord(bad) < 0x20 or ord(bad) == 0x7F else "a non-ASCII character")
    return (f"holds {what}: a bearer token is visible ASCII characters only (no spaces or newlines; "
            "a token read from a file keeps its last newline)")
