"""Evidence in a real browser (Debian's Chromium via Playwright, against a real
``vigil server``): each incident kind gets the chart that fits it, a Flight Recorder import
its table and no empty chart, stack dumps show where each rank is stuck, and the job page's
marks, ticks and bars are readable (labels apart, whole-number ranks, bar labels inside the
chart). Screenshots land in each test's output folder.

The data is written first, through the API and the detectors of an in-process app on the
same SQLite file (``tests.frontend.evidence_data``); the server then only shows it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from backend.api import create_app
from backend.db import make_engine, make_sessionmaker
from backend.migrate import upgrade
from backend.settings import Settings
from tests.frontend import evidence_data as data
from tests.frontend.test_browser import CHROMIUM, charts_drawn
from tests.frontend.test_browser import browser as browser  # a fixture
from tests.frontend.test_browser import page as page  # a fixture
from tests.servers import live_server

pytestmark = pytest.mark.slow
QUIET = {"VIGIL_DETECT_INTERVAL_S": "3600", "VIGIL_SWEEP_INTERVAL_S": "3600"}
CHART_OF = {
    "straggler": "compute",
    "nan": "numerics",
    "hang": "liveness",
    "comm_anomaly": "bandwidth",
    "flight_recorder": "none",
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, int]]]:
    """``(server URL, incident id by scenario)``."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set VIGIL_CHROMIUM)")
    url = f"sqlite:///{tmp_path_factory.mktemp('evidence') / 'vigil.db'}"
    upgrade(url)
    settings = Settings(database_url=url, env="development", token_cache_s=0, detect_interval_s=0)
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    app = create_app(settings, engine=engine, session_factory=factory)
    with TestClient(app) as client, factory() as session:
        ids = data.seed(client, session, settings, now=time.time())
    engine.dispose()
    with live_server(url, **QUIET) as base:
        yield base, ids


@pytest.mark.parametrize("kind", CHART_OF)
def test_each_incident_gets_the_chart_that_fits_it(
    seeded: tuple[str, dict[str, int]], page: Any, tmp_path: Path, kind: str
) -> None:
    base, ids = seeded
    page.goto(f"{base}/incidents/{ids[kind]}")
    page.wait_for_selector('#evidence-chart[data-ready="1"]', state="attached", timeout=20_000)
    assert page.get_attribute("#evidence-chart", "data-error") is None
    assert page.get_attribute("#evidence-chart", "data-chart") == CHART_OF[kind]
    if kind == "flight_recorder":
        assert not page.is_visible("#evidence-chart-box")  # no empty chart
        table = page.inner_text("#fr-groups")
        assert "nccl:all_to_all" in table and "45265" in table
        assert page.is_visible("#fr-p2p")
    else:
        traces = page.evaluate("document.querySelector('#evidence-chart').data.length")
        assert traces >= 1
        assert page.inner_text("#evidence-caption")
    if kind == "hang":
        names = page.evaluate("document.querySelector('#evidence-chart').data[2].y")
        assert sorted(names) == ["rank 0", "rank 1", "rank 2", "rank 3"]  # one heartbeat each
    page.locator("#evidence").screenshot(path=str(tmp_path / f"evidence-{kind}.png"))
    assert page.errors == [] and page.dialogs == []


def test_stack_dumps_show_where_the_odd_rank_is_stuck(
    seeded: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    base, ids = seeded
    page.goto(f"{base}/incidents/{ids['hang']}")
    page.wait_for_selector('#stacks[data-ready="1"]', state="attached", timeout=20_000)
    assert page.get_attribute("#stacks", "data-error") is None
    blocks = page.locator("details.stack-dump")
    assert blocks.count() == 2  # rank 1 alone; ranks 0, 2, 3 folded into one
    first = blocks.nth(0)
    assert first.get_attribute("data-rank") == "1" and first.get_attribute("open") is not None
    others = blocks.nth(1)
    assert others.get_attribute("data-rank") == "0" and others.get_attribute("open") is None
    assert "same place as this rank: ranks 2, 3" in others.inner_text()
    hung = first.locator("details.thread.training li.hung")
    assert hung.count() == 1 and hung.is_visible()
    assert "threading.py" in hung.inner_text() and "where this rank is" in hung.inner_text()
    user = first.locator("details.thread.training li.user")
    assert "stuck_in_data_loader" not in user.inner_text()  # innermost user frame is lower
    assert "_dump_from_vigil_thread" in user.inner_text()
    # The collector's own threads (how many depends on what else this process runs) fold.
    infra = first.locator("details.thread.infra")
    assert infra.count() >= 1
    assert all(infra.nth(i).get_attribute("open") is None for i in range(infra.count()))
    outer = first.locator("details.thread.training details.outer-frames")
    assert outer.count() == 1 and outer.get_attribute("open") is None  # pytest's frames fold
    page.locator("#stacks").screenshot(path=str(tmp_path / "stacks.png"))
    assert page.errors == []


def _boxes(tab: Any, selector: str) -> list[dict[str, float]]:
    return list(
        tab.evaluate(
            "(s) => Array.from(document.querySelectorAll(s)).map((e) => {"
            " const r = e.getBoundingClientRect();"
            " return {x0: r.left, x1: r.right, y0: r.top, y1: r.bottom, text: e.textContent}; })",
            selector,
        )
    )


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def _job_page(seeded: tuple[str, dict[str, int]], tab: Any, job: str, chart: str) -> None:
    tab.goto(f"{seeded[0]}/jobs/{job}")
    charts_drawn(tab, (chart,))


def test_job_page_says_which_ranks_collectives_are_not_timed(
    seeded: tuple[str, dict[str, int]], page: Any
) -> None:
    _job_page(seeded, page, data.STRAGGLER, "#step-time-chart")
    warning = page.locator("#untimed-collectives")
    assert warning.is_visible() and "collectives not timed on ranks 1, 3" in warning.inner_text()
    assert page.errors == []


def test_incident_labels_on_the_step_time_chart_do_not_overlap(
    seeded: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    _job_page(seeded, page, data.STRAGGLER, "#step-time-chart")
    # Five incidents within six steps: labelled in lanes (past four, "+1" on the last label,
    # every id in its hover), none over another.
    labels = [b for b in _boxes(page, "#step-time-chart g.annotation") if b["text"].startswith("#")]
    clashes = [
        (a["text"], b["text"])
        for i, a in enumerate(labels)
        for b in labels[i + 1 :]
        if _overlap(a, b)
    ]
    assert clashes == []
    more = sum(int(b["text"].rsplit("+", 1)[1]) for b in labels if " +" in b["text"])
    assert len(labels) == 4 and more == 1, labels
    page.locator("#step-time-chart").screenshot(path=str(tmp_path / "step-time.png"))
    assert page.errors == []


def test_heatmap_rank_ticks_are_whole_numbers(
    seeded: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    _job_page(seeded, page, data.TWO_RANKS, "#heatmap")
    ticks = [b["text"] for b in _boxes(page, "#heatmap .ytick text")]
    assert ticks == ["0", "1"], ticks  # README's example job has two ranks: no 0.5
    page.locator("#heatmap").screenshot(path=str(tmp_path / "heatmap.png"))
    assert page.errors == []


def test_goodput_bar_labels_are_whole_and_inside_the_chart(
    seeded: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    _job_page(seeded, page, data.STRAGGLER, "#goodput-chart")
    chart = _boxes(page, "#goodput-chart")[0]
    ticks = _boxes(page, "#goodput-chart .xtick text, #goodput-chart .ytick text")
    names = [b for b in ticks if not b["text"].replace(".", "").replace("−", "").isdigit()]
    assert {"productive", "other"} <= {b["text"] for b in names}, ticks
    inside = [
        b["x0"] >= chart["x0"] and b["x1"] <= chart["x1"] and b["y1"] <= chart["y1"] for b in names
    ]
    assert all(inside), (chart, names)
    for part in ("#goodput-chart", "#actions", "#stacks"):
        page.locator(part).screenshot(path=str(tmp_path / f"job-{part[1:]}.png"))
    assert page.errors == []
