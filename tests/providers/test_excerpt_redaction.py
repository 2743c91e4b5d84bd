"""An error message quoting a provider's answer never carries any part of the key: the body is
redacted first, then cut."""

from __future__ import annotations

import pytest
import requests

from autoscaler.providers.http import HttpClient

KEY = "vast_SECRET_0123456789abcdef_never_print_me"


def response(body: str) -> requests.Response:
    resp = requests.Response()
    resp.status_code = 500
    resp._content = body.encode()
    resp.encoding = "utf-8"
    return resp


@pytest.mark.parametrize("limit", [120, 160, 300])
@pytest.mark.parametrize("offset", range(-len(KEY), 8))
def test_a_key_straddling_the_cut_leaks_no_prefix(limit, offset):
    client = HttpClient("vast", "http://127.0.0.1:1", KEY)
    body = "x" * (limit + offset) + KEY + " trailing words"
    shown = client.excerpt(response(body), limit)
    assert len(shown) <= limit
    for n in range(6, len(KEY) + 1):
        assert KEY[:n] not in shown, (offset, shown[-40:])


def test_a_key_split_by_whitespace_folding_is_still_redacted():
    client = HttpClient("vast", "http://127.0.0.1:1", KEY)
    shown = client.excerpt(response("error:\n\n   " + KEY + "\n"), 300)
    assert KEY not in shown and "***" in shown
