"""The web dashboard (/ui) and the API document (/docs) in a real browser: Debian's chromium, headless,
driven by Selenium through Debian's chromium-driver, against a real `switchyard serve` and the fake hub.

Flows: the library lists a model with its fit, a lane loads (logs shown) and unloads, a chat answers, a
download from the fake hub starts, shows progress and is cancelled, /docs renders the OpenAPI 3.1
document, and a LAN-style bind refuses until a key is given (kept in session storage, never in the URL).
Screenshots at 1024x640 and 1600x1000 go to the test's folder (and SWITCHYARD_SCREENSHOT_DIR when set).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import REPO, ServerProcess, running_server
from tests.support.appstore_layouts import ollama_model
from tests.support.fakehub import FakeHub
from tests.support.tinymodels import CHAT, write_tiny_gguf

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SMALL, LARGE = (1024, 640), (1600, 1000)
HUB_REPO = "switchyard-test/slow-GGUF"
WAIT_S = 60


def _missing_browser() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} is missing: `make test` installs Debian's chromium and chromium-driver"
    return None


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    with FakeHub() as hub:
        data = write_tiny_gguf(Path(os.environ.get("TMPDIR", "/tmp")) / "dash-slow.gguf", CHAT).read_bytes()
        hub.add_repo(HUB_REPO, {"slow-Q8_0.gguf": data})
        # a download that takes long enough to be seen running and cancelled
        hub.faults.rate_bps = 40_000
        yield hub


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, hub: FakeHub) -> Iterator[ServerProcess]:
    models = tmp_path_factory.mktemp("dash-models")
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    home = tmp_path_factory.mktemp("dash-home")
    # the page's chat names no output limit, so the model's cap applies (1024 tokens by default): random
    # weights seldom end earlier, and 1024 of them took over a minute beside the installer build in CI
    (home / "settings.json").write_text(json.dumps({"model_overrides": {"tiny": {"max_output": 48}}}))
    apps = tmp_path_factory.mktemp("dash-apps")  # an Ollama store, listed beside the models folder
    ollama_model(apps / ".ollama" / "models", models / "tiny.gguf", name="tiny-ollama")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWITCHYARD_APPS_HOME", str(apps))
        mp.setenv("HF_ENDPOINT", hub.url)
        mp.setenv("HF_HUB_OFFLINE", "0")
        mp.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("dash-hf")))
        with running_server(home, models) as s:
            yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if (why := _missing_browser()) is not None:
        pytest.fail(why)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    opts.add_argument(f"--window-size={SMALL[0]},{SMALL[1]}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: WebDriver, what: str, test, timeout: float = WAIT_S):  # type: ignore[no-untyped-def]
    # the page redraws its tables on live events: an element found a moment ago may be replaced
    ignored = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(
        lambda d: test(d), message=what
    )


def _click(driver: WebDriver, css: str) -> None:
    """Click the element `css` names, finding it again if a redraw replaced it meanwhile."""

    def attempt(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    _wait(driver, f"click {css}", attempt)


def _shoot(driver: WebDriver, out: Path, name: str) -> None:
    """The page at the small and the large size, into `out` (and SWITCHYARD_SCREENSHOT_DIR)."""
    for w, h in (SMALL, LARGE):  # the page's own viewport at exactly that size
        metrics = {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)  # type: ignore[attr-defined]
        path = out / f"{name}-{w}x{h}.png"
        assert driver.save_screenshot(str(path)), path
        if os.environ.get("SWITCHYARD_SCREENSHOT_DIR"):
            shutil.copy(path, Path(os.environ["SWITCHYARD_SCREENSHOT_DIR"]) / path.name)
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})  # type: ignore[attr-defined]


def _severe(driver: WebDriver) -> list[str]:
    """Console errors the page logged (a CSP violation, a script error), since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _row(driver: WebDriver, attr: str, value: str):  # type: ignore[no-untyped-def]
    found = driver.find_elements(By.CSS_SELECTOR, f'tr[data-{attr}="{value}"]')
    return found[0] if found else None


def _tab(driver: WebDriver, page: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#tabs button[data-page="{page}"]').click()


def test_library_lane_chat_and_download(server: ServerProcess, browser: WebDriver, tmp_path: Path) -> None:
    d = browser
    d.get(server.url + "/ui")
    _wait(d, "the library lists tiny", lambda d: _row(d, "model", "tiny"))
    fit = _wait(d, "tiny's fit is shown", lambda d: d.find_element(By.CSS_SELECTOR, '[data-fit="tiny"]').text)
    assert "CPU" in fit or "GPU" in fit, fit
    _click(d, 'tr[data-model="tiny"] button[data-action="explain"]')
    _wait(d, "the explanation", lambda d: d.find_element(By.ID, "explain-reasons").text)
    ollama = _wait(d, "the Ollama model", lambda d: _row(d, "model", "ollama:tiny-ollama:latest"))
    assert "Ollama (tiny-ollama:latest)" in ollama.text
    assert "llama.cpp" in d.find_element(By.ID, "explain-reasons").text
    _shoot(d, tmp_path, "dashboard-library")

    _click(d, 'tr[data-model="tiny"] button[data-action="load"]')
    _wait(
        d,
        "the lane is ready",
        lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-lane="tiny"][data-state="ready"]'),
    )
    _click(d, 'tr[data-lane="tiny"] button[data-action="logs"]')
    _wait(d, "the lane's log", lambda d: d.find_element(By.ID, "logs-text").text.strip())
    _shoot(d, tmp_path, "dashboard-lanes")

    _tab(d, "chat")
    _wait(d, "tiny is a chat choice", lambda d: "tiny" in d.find_element(By.ID, "chat-model").text)
    d.find_element(By.ID, "chat-input").send_keys("Say something")
    d.find_element(By.ID, "chat-send").click()
    answer = _wait(
        d, "the answer ends", lambda d: d.find_elements(By.CSS_SELECTOR, '.msg.assistant[data-done="true"]')
    )
    assert answer[0].find_element(By.CSS_SELECTOR, ".text").text.strip()
    _shoot(d, tmp_path, "dashboard-chat")

    _tab(d, "lanes")
    _click(d, 'tr[data-lane="tiny"] button[data-action="unload"]')
    _wait(
        d,
        "the lane unloads",
        lambda d: (r := _row(d, "lane", "tiny")) is None or r.get_attribute("data-state") == "stopped",
    )

    _tab(d, "downloads")
    d.find_element(By.ID, "download-repo").send_keys(HUB_REPO)
    _click(d, "#download-form button")
    running = _wait(
        d,
        "the download runs with progress",
        lambda d: next(
            (
                r
                for r in d.find_elements(By.CSS_SELECTOR, "#downloads-table tr[data-download]")
                if float(r.find_element(By.TAG_NAME, "progress").get_attribute("value") or 0) > 0
            ),
            None,
        ),
    )
    _shoot(d, tmp_path, "dashboard-downloads")
    job = running.get_attribute("data-download")
    _click(d, f'tr[data-download="{job}"] button[data-action="cancel"]')
    _wait(
        d,
        "the download is cancelled",
        lambda d: (r := _row(d, "download", job)) is None or r.get_attribute("data-state") == "cancelled",
    )

    _tab(d, "hardware")
    _wait(d, "a live CPU sample", lambda d: d.find_element(By.ID, "cpu-now").text.endswith("%"))
    _shoot(d, tmp_path, "dashboard-hardware")
    assert _severe(d) == []


def test_docs_render_the_openapi_document(server: ServerProcess, browser: WebDriver, tmp_path: Path) -> None:
    d = browser
    d.get(server.url + "/docs")
    ops = _wait(d, "Swagger UI lists operations", lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock"))
    assert len(ops) > 20
    assert "Unable to render" not in d.find_element(By.TAG_NAME, "body").text
    _shoot(d, tmp_path, "docs")
    assert _severe(d) == []


def test_lan_bind_refuses_without_a_key(tmp_path: Path, browser: WebDriver, model_store: Path) -> None:
    home = tmp_path / "lan-home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"allow_plain_lan": True}))
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    made = subprocess.run(
        [str(REPO / ".venv" / "bin" / "switchyard"), "keys", "create", "browser"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key = next(w for w in made.stdout.split() if w.startswith("sy-"))
    models = tmp_path / "models"
    models.mkdir()
    os.link(model_store / "tiny.gguf", models / "tiny.gguf")
    with running_server(home, models, "--host", "0.0.0.0") as s:
        url = f"http://127.0.0.1:{s.url.rsplit(':', 1)[1]}"
        d = browser
        d.get(url + "/ui")
        gate = _wait(
            d, "the key is asked for", lambda d: (g := d.find_element(By.ID, "keygate")).is_displayed() and g
        )
        assert "needs an API key" in gate.text
        _shoot(d, tmp_path, "dashboard-key")
        d.find_element(By.ID, "keyinput").send_keys("sy-not-a-key")
        d.find_element(By.CSS_SELECTOR, "#keyform button").click()
        _wait(d, "a wrong key is refused", lambda d: "not valid" in d.find_element(By.ID, "keygate-why").text)
        d.find_element(By.ID, "keyinput").send_keys(key)
        d.find_element(By.CSS_SELECTOR, "#keyform button").click()
        _wait(d, "the library lists tiny", lambda d: _row(d, "model", "tiny"))
        assert key not in d.current_url
        assert d.execute_script("return sessionStorage.getItem('switchyard.key')") == key
        assert d.execute_script("return localStorage.length") == 0
        # the pages load without a key, the data never does
        with urllib.request.urlopen(url + "/ui") as resp:
            assert resp.status == 200
        try:
            urllib.request.urlopen(url + "/api/library")
            raise AssertionError("the library answered without a key")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        d.execute_script("sessionStorage.clear()")
