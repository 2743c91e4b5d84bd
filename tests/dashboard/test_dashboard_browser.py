"""The dashboard in a real headless Chromium (Debian's, driven by Playwright; scripts/browser.sh
installs it where missing, and this test fails, never skips, without it), against
`autoscaler serve`'s app on a real port.

An operator opens the page, gives the admin key (kept in sessionStorage, never in the page or
its URL), reads the queue table and the chart, edits q1's autoscale block, is refused with the
line `autoscaler validate` prints, previews a good edit (its dry run and what changes), applies
it (version 2 with who and why), rolls back to version 1 (version 3) and reads q1's warm pool
and its stopped machine once a newer version gives q1 one. Screenshots of each
step are saved (DASHBOARD_SHOTS, default the test's tmp dir) and checked: the elements that
matter are on them, in their colours.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from playwright.sync_api import Page, expect, sync_playwright

from autoscaler.api.app import create_app
from autoscaler.store import config_versions
from tests.api.apikit import World, add_warm_pool, stop_machine, warm_events
from tests.dashboard.dashkit import HISTORY, PENDING_NOW, dashboard_world

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PENDING_RGB = (0xD9, 0x48, 0x0F)  # style.css --pending
WORKERS_RGB = (0x1C, 0x7E, 0xD6)  # style.css --workers
ERROR_RGB = (0xC9, 0x2A, 0x2A)  # style.css --err
WARM_RGB = (0x5F, 0x3D, 0xC4)  # style.css --warm

SLOW_POLL = "max_workers: 3\npoll_interval: 10m"
"""An edit `validate` refuses: a poll longer than heartbeat_timeout (5 min)."""


# ------------------------------------------------------------------ screenshots


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and RGB pixels of an 8-bit RGB/RGBA non-interlaced PNG (what Chromium
    writes), decoded here so the test needs no imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 4 if ctype == 6 else 3
    raw, stride = zlib.decompress(idat), width * bpp
    prev, out = bytearray(stride), []
    for y in range(height):
        f, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        out += [tuple(line[i : i + 3]) for i in range(0, stride, bpp)]  # type: ignore[misc]
        prev = line
    return width, height, out


def count_near(pixels: list[tuple[int, int, int]], rgb: tuple[int, int, int], tol: int = 40) -> int:
    return sum(1 for p in pixels if all(abs(p[i] - rgb[i]) <= tol for i in range(3)))


def shot(page: Page, selector: str, path: Path) -> tuple[int, int, list[tuple[int, int, int]]]:
    data = page.locator(selector).first.screenshot(path=str(path))
    w, h, px = png_pixels(data)
    assert w > 100 and h > 20, (selector, w, h)
    assert len(set(px)) > 5, f"{selector}: a blank screenshot"
    return w, h, px


# ------------------------------------------------------------------ the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, world: World) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            create_app(world.rt), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def world(sqlite_url, tmp_path) -> Iterator[World]:
    w = dashboard_world(sqlite_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    where = Path(os.environ.get("DASHBOARD_SHOTS") or tmp_path / "shots")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def page(world) -> Iterator[tuple[Page, Server]]:
    assert os.access(CHROMIUM, os.X_OK), (
        f"no Chromium at {CHROMIUM}: run 'bash scripts/browser.sh' (scripts/test.sh does), or "
        "set CHROMIUM to a Chromium binary"
    )
    server = Server(world)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
            )
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            pg = context.new_page()
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            refusal = "Failed to load resource: the server responded with a status of 4"
            pg.on(
                "console",  # a 4xx answer is logged by Chromium; it is part of the test
                lambda m: (
                    errors.append(m.text)
                    if m.type == "error" and not m.text.startswith(refusal)
                    else None
                ),
            )
            yield pg, server
            assert not errors, errors  # no script error, no CSP violation
            browser.close()
    finally:
        server.close()


def validate_says(world: World, document: dict[str, Any], tmp_path: Path) -> str:
    """What `autoscaler validate` prints for `document` (stderr: its refusals)."""
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(document))
    exe = shutil.which("autoscaler", path=str(Path(sys.executable).parent)) or "autoscaler"
    env = {
        **os.environ,
        "AUTOSCALER_DATABASE_URL": world.rt.settings.database_url,
        "AUTOSCALER_HOME": str(tmp_path / "home"),
        "AUTOSCALER_BROKER_URL": world.rt.settings.broker_url,
    }
    done = subprocess.run(
        [exe, "validate", str(path)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    return done.stderr


# ------------------------------------------------------------------ the test


def test_dashboard_in_headless_chromium(world, page, shots, tmp_path):
    pg, server = page
    pg.goto(server.url + "/")

    # 1. the page asks for the key; nothing of the store is on it yet
    expect(pg.locator("#login")).to_be_visible()
    expect(pg.locator("#board")).to_be_hidden()
    shot(pg, "body", shots / "01-login.png")
    pg.fill("#key", "asga_" + "x" * 43)
    pg.click("#login-form button")
    expect(pg.locator("#login-error")).to_contain_text("refused")
    pg.fill("#key", world.admin)
    pg.click("#login-form button")

    # 2. the queue table and the chart
    row = pg.locator('#queues tr[data-queue="q1"]')
    expect(row).to_be_visible()
    expect(row.locator("td.pending")).to_have_text(str(PENDING_NOW))
    expect(row.locator("td.workers")).to_have_text("2 (0 busy)")
    expect(row.locator("td.desired")).to_have_text("2")
    expect(row.locator("td.bounds")).to_have_text("0..3")
    expect(pg.locator("#config-line")).to_contain_text("config version 1")
    chart = pg.locator('svg.chart[data-queue="q1"]')
    expect(chart.locator(".pending circle")).to_have_count(len(HISTORY))
    expect(chart.locator(".workers circle")).to_have_count(len(HISTORY))
    expect(chart.locator(".pending polyline")).to_have_count(1)
    expect(pg.locator("#instances tbody tr")).to_have_count(2)
    expect(pg.locator("#events tbody tr").first).to_be_visible()
    assert world.admin not in pg.url and world.admin not in pg.content()
    assert pg.evaluate("sessionStorage.getItem('asg-admin-key')") == world.admin
    assert pg.evaluate("localStorage.length") == 0
    pg.screenshot(path=str(shots / "02-board.png"), full_page=True)
    _, _, px = shot(pg, "#queues", shots / "02-queues.png")
    _, _, px = shot(pg, 'svg.chart[data-queue="q1"]', shots / "02-chart.png")
    assert count_near(px, PENDING_RGB) > 150, "the pending line is not on the chart"
    assert count_near(px, WORKERS_RGB) > 150, "the workers line is not on the chart"
    # the highest pending point (30) is drawn above the highest workers point (3)
    ys = {
        s: [float(c.get_attribute("cy") or 0) for c in chart.locator(f".{s} circle").all()]
        for s in ("pending", "workers")
    }
    assert min(ys["pending"]) < min(ys["workers"])

    # 3. an edit that `validate` refuses: the same line, and nothing stored
    row.locator("button.edit").click()
    expect(pg.locator("#editor")).to_be_visible()
    text = pg.input_value("#edit-yaml")
    assert "max_workers: 3" in text
    pg.fill("#edit-yaml", text.replace("max_workers: 3", SLOW_POLL))
    pg.click("#edit-preview")
    refusal = pg.locator("#refusals li").first
    expect(refusal).to_contain_text("queues.q1.autoscale.poll_interval")
    with world.rt.transaction() as session:
        doc = config_versions.latest(session).document  # type: ignore[union-attr]
    doc = yaml.safe_load(yaml.safe_dump(doc))
    doc["queues"]["q1"]["autoscale"]["poll_interval"] = "10m"
    cli = validate_says(world, doc, tmp_path)
    assert f"  - {refusal.inner_text()}" in cli, (refusal.inner_text(), cli)
    expect(pg.locator("#edit-message")).to_contain_text("nothing is stored")
    _, _, px = shot(pg, "#editor", shots / "03-refused.png")
    assert count_near(px, ERROR_RGB, 30) > 50, "the refusal is not shown in red"
    pg.click("#edit-apply")
    expect(pg.locator("#edit-message")).to_contain_text("refused")
    expect(pg.locator("#versions tbody tr")).to_have_count(1)

    # 4. a good edit: dry run and what changes, then a new version with who and why
    pg.fill("#edit-yaml", text.replace("max_workers: 3", "max_workers: 5"))
    pg.fill("#edit-by", "alice")
    pg.fill("#edit-comment", "evening burst")
    pg.click("#edit-preview")
    expect(pg.locator("#changes li")).to_have_text(["queues.q1.autoscale.max_workers: 3 → 5"])
    expect(pg.locator("#dry-run")).to_contain_text("bounds: 0..5 machines")
    expect(pg.locator("#versions tbody tr")).to_have_count(1)  # a preview stores nothing
    shot(pg, "#editor", shots / "04-preview.png")
    pg.click("#edit-apply")
    expect(pg.locator("#edit-message")).to_have_text("recorded as version 2")
    v2 = pg.locator('#versions tr[data-version="2"]')
    expect(v2).to_contain_text("alice (admin key ops)")
    expect(v2).to_contain_text("evening burst")
    expect(row.locator("td.bounds")).to_have_text("0..5")
    expect(pg.locator("#config-line")).to_contain_text("config version 2")

    # 5. roll back to version 1: version 3, with who and why
    pg.fill("#rollback-reason", "burst is over")
    pg.click('#versions tr[data-version="1"] button.rollback')
    expect(pg.locator("#rollback-message")).to_contain_text("version 1's config is now version 3")
    v3 = pg.locator('#versions tr[data-version="3"]')
    expect(v3).to_contain_text("rollback to version 1: burst is over")
    expect(v3).to_contain_text("alice (admin key ops)")
    expect(row.locator("td.bounds")).to_have_text("0..3")
    expect(pg.locator("#editor")).to_be_hidden()  # its edit was made on version 2
    shot(pg, "#versions", shots / "05-versions.png")
    with world.rt.transaction() as session:
        latest = config_versions.latest(session)
        assert latest is not None and latest.version == 3
        assert latest.document["queues"]["q1"]["autoscale"]["max_workers"] == 3
    pg.screenshot(path=str(shots / "06-after-rollback.png"), full_page=True)

    # 6. a warm pool (a newer version gives q1 one): the queue's pool, the stopped machine
    # with its storage price, since when and when it will be destroyed, in the pool's colour
    add_warm_pool(world, size=2, keep_for=3600)
    stop_machine(world, "m2", 0.004, datetime.now(UTC) - timedelta(minutes=10))
    warm_events(world, "hit", "miss", "miss")
    pg.select_option("#hours", "1")  # any refresh
    expect(row.locator("td.warm")).to_have_text("1/2 stopped, $0.004/h · 1 hit, 2 misses today")
    expect(row.locator("td.workers")).to_have_text("1 (0 busy)")  # stopped: not capacity
    m2 = pg.locator('#instances tr[data-launch="m2"]')
    expect(m2.locator("td.state")).to_have_text("stopped")
    expect(m2.locator("td.storage")).to_have_text("$0.004")
    expect(m2.locator("td.stopped-since")).to_have_text(re.compile(r"UTC \(10m \d+s ago\)$"))
    expect(m2.locator("td.destroy-at")).to_have_text(re.compile(r"UTC \(in (49m \d+s|50m 0s)\)$"))
    m1 = pg.locator('#instances tr[data-launch="m1"]')
    expect(m1.locator("td.destroy-at")).to_have_text("–")
    _, _, px = shot(pg, "#instances", shots / "07-warm-pool.png")
    assert count_near(px, WARM_RGB, 30) > 20, "the stopped state is not in the pool's colour"

    # 7. a revoked key: back to the key form, the key forgotten
    from autoscaler.access import keys

    with world.rt.transaction() as session:
        keys.revoke_key(session, "ops", datetime.now(UTC))
    pg.select_option("#hours", "24")  # any refresh
    expect(pg.locator("#login")).to_be_visible()
    expect(pg.locator("#login-error")).to_contain_text("refused")
    assert pg.evaluate("sessionStorage.getItem('asg-admin-key')") is None
