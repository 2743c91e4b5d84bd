"""URLs are shown without their secrets, however the password is written."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.brokers.base import Secrets
from autoscaler.settings import redact_url

CASES = [
    ("redis://:p@ss@host:6379/0", "redis://:***@host:6379/0", "p@ss"),
    (
        "rediss://host/0?password=s3cret&ssl_cert_reqs=none",
        "rediss://host/0?password=***&ssl_cert_reqs=none",
        "s3cret",
    ),
    ("postgresql+psycopg://u:pw-9@h/db", "postgresql+psycopg://u:***@h/db", "pw-9"),
    ("amqp://guest:gu%40est@127.0.0.1:5672//", "amqp://guest:***@127.0.0.1:5672//", "gu@est"),
]


@pytest.mark.parametrize(("url", "shown", "secret"), CASES)
def test_secrets_are_redacted(url, shown, secret):
    assert redact_url(url) == shown
    text = f"cannot connect to {url}: refused"
    scrubbed = Secrets.from_urls(url).scrub(text)
    assert secret not in scrubbed and secret not in redact_url(url)


@pytest.mark.parametrize("url", ["sqlite:////tmp/x.db", "sqla+sqlite:///a.db", "redis://h:1/2"])
def test_urls_without_secrets_are_kept_byte_for_byte(url):
    assert redact_url(url) == url


PASSWORD = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#[]"),
    min_size=4,
    max_size=20,
)


@given(PASSWORD)
def test_no_password_survives_redaction_or_scrubbing(password):
    url = f"redis://user:{password}@example.internal:6379/0"
    assert redact_url(url) == "redis://user:***@example.internal:6379/0"
    assert password not in Secrets.from_urls(url).scrub(f"error talking to {url}")
