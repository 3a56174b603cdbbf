"""The HTML report in a real browser: every chart renders, nothing is fetched, no console error.

Outside the default suite (``browser`` marker); needs Chromium and its driver
(Debian: ``apt-get install chromium chromium-driver``) and selenium (the dev
extra). Run it with::

    .venv/bin/pytest -m browser

It saves a screenshot of the example's page as ``docs/html-report.png`` (the
README shows it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesim import Report, Role, RunConfig, parse_engine_args, run
from servesim.metrics.html import charts

pytestmark = pytest.mark.browser

pytest.importorskip("selenium")
from selenium.webdriver import Chrome  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).parents[2]
EXAMPLE = Path("examples") / "mooncake_conversation_200.jsonl"  # as the README runs it
SCREENSHOT = ROOT / "docs" / "html-report.png"


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        f"none of {', '.join(names)} is installed (apt-get install chromium chromium-driver)"
    )


@pytest.fixture(scope="module")
def driver() -> Iterator[Chrome]:
    options = Options()
    options.binary_location = _binary("chromium", "chromium-browser", "google-chrome")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver is given: selenium must not look for (or download) one.
    service = Service(executable_path=_binary("chromedriver"))
    chrome = Chrome(options=options, service=service)
    try:
        yield chrome
    finally:
        chrome.quit()


def _aggregated() -> Report:
    return run(RunConfig(trace=EXAMPLE, num_workers=4))


def _disaggregated() -> Report:
    keys = {"kv_transfer_bandwidth": 64, "kv_transfer_bytes_per_token": 131072}
    return run(
        RunConfig(
            trace=EXAMPLE,
            prefill_engine=parse_engine_args(keys, role=Role.PREFILL),
            decode_engine=parse_engine_args(keys, role=Role.DECODE),
            num_prefill_workers=2,
            num_decode_workers=2,
            router_mode="kv_router",
        )
    )


@pytest.mark.parametrize("make", [_aggregated, _disaggregated], ids=["aggregated", "disaggregated"])
def test_every_chart_renders_without_console_errors(
    driver: Chrome, make: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert callable(make)
    monkeypatch.chdir(ROOT)
    report: Report = make()
    page = tmp_path / "report.html"
    report.save(html_path=page)
    driver.get(page.as_uri())
    expected = [c.id for c in charts(report.document())]
    plots = driver.find_elements(By.CSS_SELECTOR, "div.plot")
    assert [p.get_attribute("id") for p in plots] == expected

    def all_rendered(d: Chrome) -> bool:
        return all(p.get_attribute("data-rendered") == "true" for p in plots)

    WebDriverWait(driver, 60).until(all_rendered)
    for plot in plots:
        # Plotly drew its SVG and at least one trace of the chart's data.
        assert plot.find_elements(By.CSS_SELECTOR, "svg.main-svg"), plot.get_attribute("id")
        drawn = plot.find_elements(By.CSS_SELECTOR, ".scatterlayer .trace, .barlayer .trace")
        assert drawn, plot.get_attribute("id")
    fetched = driver.execute_script(
        "return performance.getEntriesByType('resource').map(function (e) { return e.name; });"
    )
    assert fetched == []
    logs = driver.get_log("browser")  # type: ignore[no-untyped-call]  # selenium leaves it unannotated
    assert [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")] == []
    if make is _aggregated:
        driver.execute_script("window.scrollTo(0, 0);")
        SCREENSHOT.parent.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(SCREENSHOT))
