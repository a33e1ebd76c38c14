"""The pipeline dashboard in a real browser (Debian's headless Chromium through Selenium) on
the real stack: `serve reads` and a streaming `projection run` as CLI processes. The page
loads, shows the app's projection, the host streaming it and the topic with the right numbers
after some commands, and keeps updating while commands flow. A screenshot is kept in
``test-artifacts/``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventfold.local_stack.process import free_port, port_is_open, stop_pid, wait_until
from tests.packaging import ROOT
from tests.pipeline_helpers import wait_for
from tests.support.cli import stack_env

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "scripts/setup.sh installs both"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1400,900",
                 f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    service = Service(str(CHROMEDRIVER), port=free_port())
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()
        if service.process is not None:
            stop_pid(service.process.pid, what="chromedriver", timeout_s=10)


def text(driver, selector: str) -> str | None:
    """An element's text, read in one step: the page redraws every second, so an element
    found now may be gone by the next call."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
        selector)


def figure(driver, selector: str) -> int | None:
    found = text(driver, selector)
    return int(found.replace(",", "")) if found else None


def test_the_dashboard_shows_the_pipeline_and_follows_it(inventory_app, stack_settings,
                                                         tmp_path, unique, browser) -> None:

    from examples.inventory import ReceiveStock

    port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_READ_API_PORT=str(port),
                    EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds")
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("reads", "run")}
    reads = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve", "reads"],
                             env=env, stdout=logs["reads"], stderr=subprocess.STDOUT)
    run = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                            "inventory_totals"], env=env, stdout=logs["run"],
                           stderr=subprocess.STDOUT)
    bus = inventory_app.runtime(stack_settings).command_bus()
    try:
        wait_until(lambda: port_is_open(port), what="read API", timeout_s=90, pid=reads.pid)
        browser.get(f"http://127.0.0.1:{port}/ui")
        assert browser.title == "Eventfold pipeline"
        projection = '[data-projection="inventory_totals"]'
        topic = '[data-topic="eventfold.events.Product"]'
        wait_for(lambda: figure(browser, f"{projection} .applied") is not None,
                 "the page to show the projection", timeout_s=60)

        before = figure(browser, f"{topic} .end-offset") or 0
        for n in range(10):
            bus.execute(ReceiveStock(product=f"{unique}-{n}", quantity=1))
        # CDC published them and the projection folded them: the page says so.
        wait_for(lambda: (figure(browser, f"{topic} .end-offset") or 0) >= before + 10
                 and figure(browser, f"{projection} .lag") == 0, "the page to show the 10 "
                 "commands published and folded", timeout_s=120)
        applied = figure(browser, f"{projection} .applied")
        assert applied is not None and applied >= 10
        assert text(browser, "#health") == "healthy"
        assert "RUNNING" in text(browser, '[data-component="connector"]')
        # `projection run` is a host of one: the page shows it, and which host streams what.
        assert text(browser, f"{projection} .host").startswith("streamed by host ")
        host = text(browser, f"{projection} .host").removeprefix("streamed by host ")
        assert "streams inventory_totals" in text(browser, f'[data-host="{host}"]')

        # While commands flow, the figures move from one poll to the next.
        stop = threading.Event()

        def send() -> None:
            n = 0
            while not stop.is_set():
                bus.execute(ReceiveStock(product=f"{unique}-flow-{n % 5}", quantity=1))
                n += 1
                time.sleep(0.05)
        sender = threading.Thread(target=send)
        sender.start()
        try:
            seen = []
            for _ in range(8):
                time.sleep(1.5)
                seen.append((figure(browser, f"{projection} .applied"),
                             text(browser, "#updated-at")))
        finally:
            stop.set()
            sender.join()
        assert len({value for value, _ in seen}) >= 3, seen
        assert len({at for _, at in seen}) >= 3, seen
        points = browser.execute_script(
            "return document.querySelector(arguments[0]).getAttribute('points');",
            f"{projection} svg.spark polyline")
        assert len(points.split()) >= 5
        assert text(browser, f"{projection} .rate").endswith("events/s")

        ARTIFACTS.mkdir(exist_ok=True)
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot))
        shutil.copy(shot, ARTIFACTS / "dashboard.png")
    finally:
        stop_pid(run.pid, what="projection run", timeout_s=90)
        stop_pid(reads.pid, what="serve reads", timeout_s=30)


def test_the_dashboard_shows_each_reaction_and_a_process_managers_timers(
        stack_settings, tmp_path, browser) -> None:
    from examples import fulfilment

    fulfilment.app.runtime(stack_settings).setup()
    port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_READ_API_PORT=str(port),
                    EVENTFOLD_APP="examples.fulfilment:app")
    reads = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve", "reads"],
                             env=env, stdout=(tmp_path / "reads.log").open("w"),
                             stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: port_is_open(port), what="read API", timeout_s=90, pid=reads.pid)
        browser.get(f"http://127.0.0.1:{port}/ui")
        wait_for(lambda: text(browser, '[data-reaction="payment_deadline"]') is not None,
                 "the page to show the reactions", timeout_s=60)
        assert browser.execute_script("return document.getElementById('reactions').hidden") \
            is False
        assert "refused" in text(browser, '[data-reaction="reserve_stock"]')
        assert "timers pending" in text(browser, '[data-reaction="payment_deadline"]')
        assert "timers pending" not in text(browser, '[data-reaction="reserve_stock"]')
    finally:
        stop_pid(reads.pid, what="eventfold serve reads")
