"""kjob-queue's web view (`/ui/` on its admin port) in a real headless browser: Debian's
`chromium` driven through `chromium-driver` by selenium.

kjob-queue runs as the built binary over its own redis-server (the fixture of
test_explain_api.py). A Job is put into request backoff through kjob-queue's gRPC API (Lease,
then Done with the rate-limited outcome and an error), and the pages are read as a person sees
them: the Job page shows state "delayed", the failures, the next retry and the history, and
follows a further failure by itself (no reload); the overview follows new work, leases and
workers; the search goes to the Job page, or says the queue does not know the Job. The page is
also opened through `kubectl kjob ui` (the plugin's forwarder). A screenshot of each page goes
to target/ui-screenshots/.

Load times (navigation start to the page's first rendered content) are printed, not asserted:
`pytest -s` shows them; the second test measures them with 10,000 queued Jobs and writes them
to target/ui-screenshots/load-times.txt.
"""

import os
import pathlib
import re
import shutil
import statistics
import subprocess
import time

import grpc
import pytest

from test_explain_api import field, fields, get, queue, rpc  # noqa: F401 (queue: a fixture)
from test_queue_auth import free_port, wait_listening

REPO = pathlib.Path(__file__).resolve().parents[2]
SHOTS = REPO / "target" / "ui-screenshots"
KEY = "py-web/backoff"
# The page refreshes every 2 s; a change shows within two refreshes and a slow machine's slack.
UPDATE_TIMEOUT_S = 8
# A page's first render, with a cold browser on a loaded 2-core machine.
LOAD_TIMEOUT_S = 15
# Jobs queued for the load measurement (the target: pages load in < 1 s with them).
MANY = 10_000
# Most items one Add may carry (kjob_core::MAX_ADD_ITEMS).
ADD_BATCH = 1000


def chromium_paths() -> tuple[str, str]:
    """Debian's chromium and chromedriver; missing ones fail the test, saying how to get them."""
    browser = shutil.which(os.environ.get("KJOB_CHROMIUM", "chromium"))
    driver = shutil.which(os.environ.get("KJOB_CHROMEDRIVER", "chromedriver"))
    if not browser or not driver:
        pytest.fail(
            "chromium and chromedriver not found: run scripts/setup.sh (it installs Debian's "
            "`chromium` and `chromium-driver`) or set KJOB_CHROMIUM / KJOB_CHROMEDRIVER"
        )
    return browser, driver


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = chromium_paths()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium not installed: run scripts/setup.sh (pip install -r tests/python/requirements.txt)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,800", "--hide-scrollbars", "--lang=en-US"):
        opts.add_argument(a)
    # Console errors (a CSP refusal, a script error) are read back and must be none.
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
    driver.set_window_size(1280, 800)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def lease_and_fail(ch: grpc.Channel, key: str, error: str) -> None:
    """Leases `key` (the only key ready, or due within 10 s) and finishes it as a failed sync."""
    lease = rpc(
        ch, "Lease", field(1, "job") + field(2, 1) + field(3, 60_000) + field(4, 10_000) + field(5, "py-worker")
    )
    items = [dict(fields(v)) for n, v in fields(lease) if n == 1]
    assert len(items) == 1 and items[0][1] == key.encode(), items
    done = field(1, "job") + field(2, key) + field(3, items[0][2].decode()) + field(4, 2) + field(9, error)
    rpc(ch, "Done", done)


def add(ch: grpc.Channel, keys: list[str], delay_ms: int = 0) -> None:
    for i in range(0, len(keys), ADD_BATCH):
        items = b"".join(
            field(1, field(1, "job") + field(2, k) + (field(3, delay_ms) if delay_ms else b""))
            for k in keys[i : i + ADD_BATCH]
        )
        rpc(ch, "Add", items)


def lease(ch: grpc.Channel, n: int, worker: str) -> list[str]:
    reply = rpc(ch, "Lease", field(1, "job") + field(2, n) + field(3, 300_000) + field(4, 5_000) + field(5, worker))
    return [dict(fields(v))[1].decode() for num, v in fields(reply) if num == 1]


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def renders(driver) -> int:
    return int(js(driver, "return Number(document.body.dataset.renders || 0)"))


def wait_until(what: str, fn, timeout: float = UPDATE_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # an element replaced between two reads
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def open_page(driver, url: str, page: str) -> float:
    """Loads `url` as a fresh document; the ms from navigation start to the page's first
    rendered content (the script's `kjob-rendered` performance mark)."""
    driver.get("about:blank")
    driver.get(url)
    wait_until(f"{page} rendered", lambda: js(driver, "return document.body.dataset.page") == page and renders(driver) >= 1,
               timeout=LOAD_TIMEOUT_S)
    return float(js(driver, "return performance.getEntriesByName('kjob-rendered')[0].startTime"))


def text(driver, element_id: str) -> str:
    return js(driver, "return document.getElementById(arguments[0]).textContent", element_id)


def rows(driver, table_id: str) -> list[list[str]]:
    return js(
        driver,
        "return [...document.getElementById(arguments[0]).tBodies[0].rows]"
        ".map(r => [...r.cells].map(c => c.textContent))",
        table_id,
    )


def shot(driver, name: str) -> None:
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, f"{path} looks empty"


def no_console_errors(driver) -> None:
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    # An unknown Job's 404 and a malformed name's 400 are answers the page shows, not errors
    # of the page (the browser logs every 4xx fetch).
    errors = [
        e for e in errors
        if not (e["source"] == "network" and re.search(r"status of (400|404)", e["message"]))
        and "favicon" not in e["message"]
    ]
    assert not errors, errors


def seconds(s: str) -> float:
    m = re.fullmatch(r"in (\d+(?:\.\d+)?) s", s.strip())
    assert m, f"next retry {s!r} is not 'in N s'"
    return float(m.group(1))


def test_the_web_view_shows_a_job_in_backoff(queue, browser):  # noqa: F811
    address, admin = queue
    ui = f"{admin}/ui/"
    times = {}
    with grpc.insecure_channel(address) as ch:
        add(ch, [KEY])
        lease_and_fail(ch, KEY, "first failure")
        lease_and_fail(ch, KEY, "second failure")  # waits out the 1 s backoff
        lease_and_fail(ch, KEY, 'pods "p" is forbidden: exceeded quota')  # and the 2 s one
        # Three failures in a row: due in 4 s.

        times["job"] = open_page(browser, f"{ui}#/jobs/py-web/backoff", "job")
        assert text(browser, "job-state") == "delayed"
        assert text(browser, "job-failures") == "3"
        assert 0 < seconds(text(browser, "job-due")) <= 4.0
        # A mark a reload would drop: the page must follow the next failure by itself.
        js(browser, "window.kjobNoReload = true")
        before = renders(browser)

        lease_and_fail(ch, KEY, 'pods "p" is forbidden: exceeded quota')  # waits out the 4 s
        failed_at = time.monotonic()
        wait_until("the Job page showing the fourth failure", lambda: text(browser, "job-failures") == "4")
        assert js(browser, "return window.kjobNoReload === true"), "the page reloaded"
        assert renders(browser) > before
        assert text(browser, "job-state") == "delayed"
        assert text(browser, "job-next-delay") == "next error waits 16 s"
        # The fourth failure waits 8 s: the page says so, less the time since.
        due = seconds(text(browser, "job-due"))
        elapsed = time.monotonic() - failed_at
        assert 8.0 - elapsed - 1.0 <= due <= 8.0, (due, elapsed)
        reason = text(browser, "job-reason")
        assert "request backoff" in reason and "4 failures in a row" in reason, reason
        assert text(browser, "job-last") == "failed"
        assert "exceeded quota" in text(browser, "job-last-sub")
        history = rows(browser, "history")
        assert len(history) == 4, history
        assert all(r[1] == "sync failed" and r[2] == "py-worker" for r in history), history
        # Newest first; the error text is shown as text.
        assert 'pods "p" is forbidden: exceeded quota' in history[0][3], history
        assert "first failure" in history[-1][3], history
        status, x = get(f"{admin}/api/v1/jobs/{KEY}")
        assert status == 200 and x["backoff"]["failures"] == 4, x
        shot(browser, "job")

        # The overview, then work arrives: ready and delayed Jobs, and a worker leasing two.
        times["overview"] = open_page(browser, ui, "overview")
        js(browser, "window.kjobNoReload = true")
        add(ch, [f"py-web-busy/r{i}" for i in range(5)])
        add(ch, [f"py-web-later/d{i}" for i in range(3)], delay_ms=600_000)
        held = lease(ch, 2, "py-holder")
        assert len(held) == 2 and all(k.startswith("py-web-busy/") for k in held), held

        def busy_row():
            r = [r for r in rows(browser, "ns-table") if r[0] == "py-web-busy"]
            return r and r[0][1:4] == ["3", "0", "2"]

        wait_until("the overview showing py-web-busy's 3 ready and 2 leased", busy_row)
        assert js(browser, "return window.kjobNoReload === true"), "the overview reloaded"
        assert rows(browser, "ns-table")[0][0] == "py-web-busy", rows(browser, "ns-table")
        later = [r for r in rows(browser, "ns-table") if r[0] == "py-web-later"]
        assert later and later[0][2] == "3", rows(browser, "ns-table")
        assert text(browser, "ov-leased") == "2"
        workers = rows(browser, "workers-table")
        assert len(workers) == 1 and workers[0][0] == "py-holder" and workers[0][1] == "2", workers
        assert all(k in workers[0][2] for k in held), workers
        lines = js(browser, "return document.querySelectorAll('#chart svg polyline').length")
        assert lines == 3
        shot(browser, "overview")

        # A leased Job's link from the workers table opens its page.
        js(browser, "document.querySelector('#workers-table a').click()")
        wait_until("a leased Job's page", lambda: text(browser, "job-state") == "leased")
        assert text(browser, "job-lease") == "py-holder"

        # Search: the form goes to the Job page; an unknown Job is said to be unknown.
        times["search"] = open_page(browser, f"{ui}#/search", "search")
        chips = js(browser, "return [...document.querySelectorAll('#search-namespaces .chip')].map(c => c.textContent)")
        assert {"py-web", "py-web-busy", "py-web-later"} <= set(chips), chips
        # A namespace chip fills the namespace field.
        js(browser, "[...document.querySelectorAll('#search-namespaces .chip')].find(c => c.textContent === 'py-web-busy').click()")
        assert browser.find_element("id", "search-namespace").get_attribute("value") == "py-web-busy"
        browser.find_element("id", "search-namespace").clear()
        browser.find_element("id", "search-namespace").send_keys("py-web")
        browser.find_element("id", "search-name").send_keys("backoff")
        shot(browser, "search")
        browser.find_element("css selector", "#search button").click()
        wait_until("the searched Job's page", lambda: text(browser, "job-key") == "backoff"
                   and text(browser, "job-state") in ("delayed", "ready"))
        browser.get(f"{ui}#/search")
        wait_until("the search page", lambda: js(browser, "return !document.getElementById('page-search').hidden"))
        for field_id, value in (("search-namespace", "py-web"), ("search-name", "never-seen")):
            browser.find_element("id", field_id).clear()
            browser.find_element("id", field_id).send_keys(value)
        browser.find_element("css selector", "#search button").click()
        wait_until("the unknown Job's notice", lambda: "not known to the queue" in text(browser, "job-missing"))
        assert text(browser, "job-state") == "unknown"
        assert "Job py-web/never-seen is not known to the queue" in text(browser, "job-missing")
        assert js(browser, "return document.getElementById('job-body').hidden")
        shot(browser, "job-unknown")

        # A name crafted as markup is shown as text, never run or parsed.
        browser.get(f"{ui}#/jobs/py-web/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
        wait_until("the crafted name's page", lambda: text(browser, "job-state") == "invalid")
        assert text(browser, "job-key") == "<img src=x onerror=alert(1)>"
        assert js(browser, "return document.querySelectorAll('main img').length") == 0
        no_console_errors(browser)

    print("\nweb view load (navigation start → first rendered content): "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in times.items()))


def test_the_web_view_through_kubectl_kjob_ui(queue, browser):  # noqa: F811
    """`kubectl kjob ui` forwards the page with its content types, policy and redirect."""
    _, admin = queue
    plugin = pathlib.Path(os.environ.get("KJOB_KUBECTL_KJOB_BIN", REPO / "target" / "debug" / "kubectl-kjob"))
    if not plugin.exists():
        pytest.fail(f"kubectl-kjob not found at {plugin}: run `cargo build --bins` or set KJOB_KUBECTL_KJOB_BIN")
    port = free_port()
    proc = subprocess.Popen(
        [str(plugin), f"--queue-admin-url={admin}", "ui", f"--listen=127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        wait_listening(port, proc, "kubectl kjob ui")
        # `/` redirects to the view, relative, as it would under the service proxy's prefix.
        open_page(browser, f"http://127.0.0.1:{port}/", "overview")
        assert browser.current_url == f"http://127.0.0.1:{port}/ui/"
        assert js(browser, "return document.querySelectorAll('#chart svg polyline').length") == 3
        no_console_errors(browser)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_web_view_with_10000_queued_jobs(queue, browser):  # noqa: F811
    """The issue's target is < 1 s per page with 10,000 queued Jobs: measured and printed (a
    timing assertion would be a flaky test on a shared machine), with what the pages show."""
    address, admin = queue
    ui = f"{admin}/ui/"
    with grpc.insecure_channel(address) as ch:
        keys = [f"load-{i % 100:02d}/job-{i}" for i in range(MANY)]
        add(ch, keys[: MANY * 7 // 10])
        add(ch, keys[MANY * 7 // 10 :], delay_ms=600_000)
    status, o = get(f"{admin}/api/v1/overview")
    assert status == 200, o
    assert o["depth"]["ready"] + o["depth"]["delayed"] >= MANY, o["depth"]
    # What the overview's JSON costs kjob-queue and Redis, alone.
    api_ms = []
    for _ in range(20):
        t0 = time.monotonic()
        assert get(f"{admin}/api/v1/overview")[0] == 200
        api_ms.append((time.monotonic() - t0) * 1000)
    pages = {"overview": ui, "job": f"{ui}#/jobs/load-07/job-7", "search": f"{ui}#/search"}
    times = {k: [] for k in pages}
    for _ in range(5):
        for page, url in pages.items():
            times[page].append(open_page(browser, url, page))
    open_page(browser, pages["overview"], "overview")
    ready = int(text(browser, "ov-ready").replace(",", ""))
    delayed = int(text(browser, "ov-delayed").replace(",", ""))
    assert ready + delayed >= MANY, (ready, delayed)
    assert len(rows(browser, "ns-table")) == 10
    shot(browser, "overview-10000")
    open_page(browser, pages["job"], "job")
    assert text(browser, "job-state") == "ready"
    report = "\n".join(
        f"{page}: median {statistics.median(t):.0f} ms, max {max(t):.0f} ms over {len(t)} loads "
        f"(navigation start → first rendered content, {MANY} queued Jobs)"
        for page, t in times.items()
    )
    report += (f"\nGET /api/v1/overview: median {statistics.median(api_ms):.0f} ms, "
               f"max {max(api_ms):.0f} ms over {len(api_ms)} requests")
    (SHOTS / "load-times.txt").write_text(report + "\n")
    print("\nweb view load with 10,000 queued Jobs:\n" + report)
