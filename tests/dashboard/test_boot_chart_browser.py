"""The dashboard's boot chart in headless Chromium (the fixtures of test_dashboard_browser.py):
one bar per (provider, GPU), the median over its p90, labelled with both and the number of
boots — the numbers `autoscaler status` prints (store/boots.py) — drawn with no script error
or CSP violation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playwright.sync_api import expect
from sqlalchemy import update

from autoscaler.lifecycle import InstanceState as S
from autoscaler.store.models import Instance
from tests.api.apikit import World, add_machine
from tests.dashboard import test_dashboard_browser as browser
from tests.dashboard.test_dashboard_browser import WORKERS_RGB, count_near, shot

world, page, shots = browser.world, browser.page, browser.shots  # its fixtures, here too

BOOTS = {("gpu-vast", "RTX 4090"): (100, 200, 300, 400), ("gpu-runpod", "A100"): (60,)}


def add_boots(world: World) -> None:
    now = datetime.now(UTC)
    for (provider, gpu), seconds in BOOTS.items():
        for i, s in enumerate(seconds):
            lid = f"boot-{provider}-{i}"
            add_machine(world.rt, lid, S.TERMINATED)
            ready = now - timedelta(hours=1 + i)
            with world.rt.transaction() as session:
                session.execute(
                    update(Instance)
                    .where(Instance.launch_id == lid)
                    .values(
                        provider=provider,
                        gpu=gpu,
                        created_at=ready - timedelta(seconds=s),
                        ready_at=ready,
                    )
                )


def test_the_boot_chart_shows_median_and_p90_per_provider_and_gpu(world, page, shots):
    add_boots(world)
    pg, server = page
    pg.goto(server.url + "/")
    pg.fill("#key", world.admin)
    pg.click("#login-form button")
    chart = pg.locator("#boots svg.chart.boots")
    expect(chart.locator("g.boot")).to_have_count(2)
    vast = chart.locator('g.boot[data-key="gpu-vast / RTX 4090"]')
    # median of 100..400 s: 250 s; p90 (nearest rank of 4): 400 s
    expect(vast.locator("text.legend")).to_have_text("4m10s · p90 6m40s · 4 boots")
    runpod = chart.locator('g.boot[data-key="gpu-runpod / A100"]')
    expect(runpod.locator("text.legend")).to_have_text("1m00s · p90 1m00s · 1 boot")
    median = float(vast.locator("rect.median").get_attribute("width") or 0)
    p90 = float(vast.locator("rect.p90").get_attribute("width") or 0)
    assert 0 < median < p90
    _, _, px = shot(pg, "#boots", shots / "boots.png")
    assert count_near(px, WORKERS_RGB) > 150, "the median bars are not on the chart"
