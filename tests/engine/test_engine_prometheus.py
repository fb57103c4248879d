"""End to end on real engines: two vLLM instances serving a multi-tenant
workload with shared system prompts, a real Prometheus 2.x scraping their
/metrics with every rule file of rules/ loaded, and the dashboard in
engine-only mode (no warmscope collectors anywhere).

* The app's engine frames, the engines' own counter deltas and Prometheus'
  recorded ratio agree within 1 % per instance.
* Switching the workload to unique prefixes fires the engine hit-rate alert.
* Every page renders (AppTest and Chromium) without wrong advice, and the
  sidebar names only Prometheus.

The rule files are loaded with their windows shortened (5m -> 60s, offset 1h ->
60s, for: -> seconds) so the regression shows within a couple of minutes;
everything else is the shipped rules.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
from warmscope.app.dashboard.pages import PAGES

from tests.conftest import free_port, need_binary, prom_query, wait_until

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
WINDOW_S = 60      # the rules' [5m] windows and `offset 1h` in this test
# every page with an engine-only mode, and the last thing it draws there (the screenshot waits
# for it)
ENGINE_PAGES = [p for p in PAGES if p.engine_only]
FIGURES: dict = {}
_RUNS = [0]

_WORDS = ("invoice refund shipping warranty account password delivery order printer router laptop screen battery "
          "contract upgrade billing support ticket manual policy").split()


def _system_prompt(tenant: str) -> str:
    rnd = random.Random(tenant)
    rules = " ".join(rnd.choice(_WORDS) for _ in range(60))
    return f"You are the assistant of {tenant}. Follow the {tenant} handbook: {rules}. Answer briefly."


def _short_rules(text: str) -> str:
    """The shipped rules with windows and waits scaled down for a test that lasts minutes."""
    text = text.replace("[5m]", f"[{WINDOW_S}s]").replace("[1h]", f"[{2 * WINDOW_S}s]")
    text = text.replace("[10m]", f"[{WINDOW_S}s]").replace("[2m]", "[20s]")
    text = text.replace("offset 1h", f"offset {WINDOW_S}s").replace("offset 1d", f"offset {2 * WINDOW_S}s")
    text = re.sub(r"interval: \d+[smh]", "interval: 2s", text)
    return re.sub(r"for: \d+[smh]", "for: 4s", text)


def _get(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _firing(prom: str) -> list[dict]:
    return [a for a in _get(f"{prom}/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"]


def _drive(engines, plan, seconds: float, unique: bool = False, max_requests: int | None = None) -> int:
    """Send chat requests for ``seconds`` (2 in flight per engine); ``plan[i]`` is
    (tenants, user-message words) for engine i. Unique prefixes put a nonce first."""
    stop = time.monotonic() + seconds
    _RUNS[0] += 1
    run = _RUNS[0]
    sent = [0]
    lock = threading.Lock()

    def worker(eng, tenants, words, seed):
        rnd = random.Random(seed)
        while time.monotonic() < stop:
            with lock:
                if max_requests is not None and sent[0] >= max_requests:
                    return
                sent[0] += 1
            tenant = rnd.choice(tenants)
            system = _system_prompt(tenant)
            if unique:
                system = f"Request {uuid.uuid4().hex}. " + system      # no two prompts share a prefix
            user = " ".join(rnd.choice(_WORDS) for _ in range(words)) + f" #{rnd.getrandbits(32)}"
            eng.chat([{"role": "system", "content": system}, {"role": "user", "content": user}])

    threads = [threading.Thread(target=worker, args=(eng, *plan[i], f"{run}-{i}-{k}"))
               for i, eng in enumerate(engines) for k in range(2)]  # new seeds on every call
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sent[0]


@pytest.fixture(scope="module", autouse=True)
def _figures():
    """The measured figures, printed and written to test-output/engine-figures.json."""
    yield
    if FIGURES:
        print("\nengine figures:", json.dumps(FIGURES, indent=1, default=str), file=sys.stderr)
        (ROOT / "test-output").mkdir(exist_ok=True)
        (ROOT / "test-output" / "engine-figures.json").write_text(json.dumps(FIGURES, indent=1, default=str))


@pytest.fixture(scope="module")
def stack(vllm_engines, tmp_path_factory):
    prom_bin = need_binary("prometheus")
    tmp = tmp_path_factory.mktemp("engine-prom")
    t0 = time.monotonic()
    engines = vllm_engines(2)
    FIGURES["engine start-up (s, each, two at once)"] = [round(e.startup_s or 0, 1) for e in engines]
    FIGURES["both engines ready after (s)"] = round(time.monotonic() - t0, 1)
    rules = []
    for p in sorted((ROOT / "rules").glob("*.yml")):
        (tmp / p.name).write_text(_short_rules(p.read_text()))
        rules.append(str(tmp / p.name))
    targets = ", ".join(f"'127.0.0.1:{e.port}'" for e in engines)
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 2s}\n"
        f"rule_files: [{', '.join(repr(r) for r in rules)}]\n"
        f"scrape_configs:\n  - job_name: vllm\n    static_configs: [{{targets: [{targets}]}}]\n")
    port = free_port()
    prom = subprocess.Popen([prom_bin, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200, 60, "prometheus")
        wait_until(lambda: len(prom_query(url, "vllm:prefix_cache_queries_total")) == 2, 30, "first scrapes")
        yield engines, url
    finally:
        prom.terminate()
        prom.wait(15)


@pytest.fixture(scope="module")
def phases(stack):
    """Warm-up, then the measured shared-prompt phase; figures per instance."""
    from warmscope.app.dashboard.engine_view import hit_table
    from warmscope.sources.prometheus import PrometheusSource

    engines, prom = stack
    # instance 0: three tenants, short questions (mostly shared prefix);
    # instance 1: eight tenants, long questions (more of each prompt is new)
    plan = [(["acme", "globex", "initech"], 4),
            (["umbrella", "hooli", "stark", "wayne", "wonka", "tyrell", "cyberdyne", "soylent"], 60)]
    _drive(engines, plan, 6.0)                   # warm-up: every tenant's system prompt is cached once
    time.sleep(15)                               # a flat stretch before the measured phase
    c0 = [e.counters() for e in engines]
    start1 = time.time()
    n1 = _drive(engines, plan, 30.0)
    end1 = time.time()
    c1 = [e.counters() for e in engines]
    time.sleep(3)                                # the last scrape sees the final counters
    firing_before = [a["labels"]["alertname"] for a in _firing(prom)]
    # The rule evaluated at T covers (T - 60 s, T]: from the flat stretch to after the phase.
    at = start1 - 3 + WINDOW_S
    wait_until(lambda: time.time() > at + 3, WINDOW_S + 10, "the recording rule's window")
    recorded = {r["metric"]["instance"]: float(r["value"][1])
                for r in prom_query(prom, "warmscope:engine_prefix_hit_ratio:rate5m", at=at)}
    frame = PrometheusSource(prom, scrape_interval=1).engine_frame("engine_prefix", start1 - 3, end1 + 3)
    app = hit_table(frame, by=["instance"]).set_index("instance").hit_rate.to_dict()
    rows = []
    for e, a, b in zip(engines, c0, c1, strict=True):
        inst = f"127.0.0.1:{e.port}"
        hits = b["vllm:prefix_cache_hits_total"] - a.get("vllm:prefix_cache_hits_total", 0)
        queries = b["vllm:prefix_cache_queries_total"] - a.get("vllm:prefix_cache_queries_total", 0)
        rows.append({"instance": inst, "hits": hits, "queries": queries, "engine": hits / queries,
                     "prometheus": recorded.get(inst), "app": app.get(inst)})
    FIGURES["phase 1 requests"] = n1
    FIGURES["hit ratios (phase 1)"] = rows
    return {"rows": rows, "firing_before": firing_before, "frame": frame, "plan": plan}


def test_app_engine_counters_and_prometheus_agree_per_instance(phases):
    rows = phases["rows"]
    assert len(rows) == 2
    for r in rows:
        assert r["queries"] > 1000 and 0 < r["hits"] < r["queries"]
        assert r["hits"] % 32 == 0                         # whole 32-token blocks
        assert r["prometheus"] is not None and r["app"] is not None, r
        assert r["app"] == pytest.approx(r["engine"], rel=0.01), r
        assert r["prometheus"] == pytest.approx(r["engine"], rel=0.01), r
    # the two instances are kept apart: their ratios differ, the mix is neither
    a, b = rows
    assert abs(a["engine"] - b["engine"]) > 0.1
    # the app's frame has exactly the engines' token deltas
    fr = phases["frame"].groupby("instance")[["hits", "queries"]].sum()
    for r in rows:
        assert fr.loc[r["instance"], "hits"] == r["hits"] and fr.loc[r["instance"], "queries"] == r["queries"]


@pytest.fixture(scope="module")
def unique_phase(stack, phases):
    """After the shared-prompt phase: unique prefixes until the short-term hit-rate alert fires on
    both instances (at most 150 s). Its start and the alerts that fired, for the tests that need
    them."""
    engines, prom = stack
    plan = [([t for t in tenants], words) for tenants, words in phases["plan"]]
    t0 = time.monotonic()
    start = time.time()
    fired: dict[str, set] = {}
    deadline = t0 + 150
    while time.monotonic() < deadline:
        _drive(engines, plan, 8.0, unique=True)
        for a in _firing(prom):
            fired.setdefault(a["labels"]["alertname"], set()).add(a["labels"].get("instance", ""))
        short = fired.get("WarmscopeEngineHitRateRegressionShortTerm", set())
        if {f"127.0.0.1:{e.port}" for e in engines} <= short:
            break
    FIGURES["alerts fired after switching to unique prefixes"] = {k: sorted(v) for k, v in fired.items()}
    FIGURES["seconds from unique prefixes to the alert firing on both instances"] = round(time.monotonic() - t0)
    return {"start": start, "fired": fired}


def test_unique_prefixes_fire_the_engine_hit_rate_alert(stack, phases, unique_phase, tmp_path,
                                                        monkeypatch):
    engines, prom = stack
    FIGURES["alerts firing at the end of the shared-prompt phase"] = phases["firing_before"]
    # quiet while the prompts are shared
    assert not [a for a in phases["firing_before"] if "HitRate" in a]
    fired = unique_phase["fired"]
    assert {f"127.0.0.1:{e.port}" for e in engines} <= fired.get("WarmscopeEngineHitRateRegressionShortTerm", set())
    # the Alerts page (engine-only mode) lists it while it fires
    from streamlit.testing.v1 import AppTest

    for k, v in _page_env(prom, tmp_path).items():
        monkeypatch.setenv(k, v)
    at = AppTest.from_file(str(ROOT / "app" / "dashboard" / "entries" / "alerts.py"), default_timeout=120).run()
    assert not at.exception and not at.error
    shown = " ".join(w.value for w in at.warning)
    assert "WarmscopeEngineHitRateRegressionShortTerm** (firing, warning)" in shown and "[runbook](https://" in shown
    # the firing alert carries an absolute runbook link to an anchor that exists
    alert = next(a for a in _firing(prom) if a["labels"]["alertname"] == "WarmscopeEngineHitRateRegressionShortTerm")
    url = alert["annotations"]["runbook_url"]
    assert url.startswith("https://") and "#engine-hit-rate-regression" in url
    assert "## engine-hit-rate-regression" in (ROOT / "docs" / "runbooks.md").read_text()
    # no collector alert fires without collector series
    assert not [k for k in fired if "Engine" not in k]


def _page_env(prom: str, tmp: Path) -> dict:
    return dict(os.environ, WARMSCOPE_PROMETHEUS_URL=prom, WARMSCOPE_STORE=str(tmp / "absent.sqlite"),
                WARMSCOPE_DATA_DIR=str(tmp))


def test_every_page_renders_in_engine_only_mode(stack, phases, unique_phase, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    engines, prom = stack

    def scraped_up() -> bool:  # Prometheus has scraped every request the earlier tests sent
        got = {r["metric"].get("instance"): float(r["value"][1])
               for r in prom_query(prom, "vllm:prefix_cache_queries_total")}
        return all(got.get(f"127.0.0.1:{e.port}") == e.counters()["vllm:prefix_cache_queries_total"]
                   for e in engines)

    wait_until(scraped_up, 60, "the last scrape of the engines' counters")
    for k, v in _page_env(prom, tmp_path).items():
        monkeypatch.setenv(k, v)
    texts = {}
    for name in [p.name for p in ENGINE_PAGES]:
        at = AppTest.from_file(str(ROOT / "app" / "dashboard" / "entries" / f"{name}.py"), default_timeout=120)
        at.session_state["range"] = "last hour"
        at.run()
        assert not at.exception, (name, [e.value for e in at.exception])
        assert not at.error, (name, [e.value for e in at.error])
        text = " ".join(str(x.value) for kind in (at.info, at.warning, at.success, at.markdown, at.caption)
                        for x in kind)
        assert "warmscope simulate" not in text and "warmscope demo" not in text, name   # wrong advice
        texts[name] = (at, text)
    # overview: per instance, the table equals the engines' counters since they started
    at, text = texts["overview"]
    assert "need the warmscope collectors" in text
    table = at.dataframe[0].value.set_index("instance")
    for e in engines:
        c = e.counters()
        row = table.loc[f"127.0.0.1:{e.port}"]
        assert row["hit_rate"] == pytest.approx(
            c["vllm:prefix_cache_hits_total"] / c["vllm:prefix_cache_queries_total"], rel=0.01)
    assert [s.value for s in at.subheader] == ["Hit rate by model, instance and engine", "Time to first token"]
    assert len(at.get("plotly_chart")) >= 4          # hit rate over time, cached by source, KV usage, TTFT
    FIGURES["overview table (whole run)"] = table[["hits", "queries", "hit_rate"]].reset_index().to_dict("records")
    # failed scrapes (a busy engine answering /metrics after the 1 s scrape timeout) mark its series stale;
    # the table keeps the counts of the scrapes before each one
    FIGURES["failed scrapes of each engine"] = {
        r["metric"].get("instance"): float(r["value"][1])
        for r in prom_query(prom, "count_over_time(up[1h]) - sum_over_time(up[1h])")}
    assert "come from the warmscope collectors" in texts["warmup"][1]
    assert "come from the warmscope collectors" in texts["hotkeys"][1]
    ab = texts["ab"][1]
    assert "per-unit records" in ab and "WARMSCOPE_REDIS_URL" in ab
    assert "Prometheus evaluates from its rules" in texts["alerts"][1]
    # root cause: the unique-prefix window against the shared-prompt one, over model x instance x engine
    at = AppTest.from_file(str(ROOT / "app" / "dashboard" / "entries" / "rootcause.py"), default_timeout=120)
    at.session_state["range"] = "last hour"
    at.run()
    # anomaly: from the start of the unique-prefix phase to now; baseline: as long, just before (shared prompts)
    since = time.time() - unique_phase["start"]
    hours = round(math.ceil((since + 5) / 36) * 0.01, 2)   # slider step 0.01 h
    at.slider(key="engine-rc-win").set_value((0.0, hours)).run()
    assert not at.exception
    leaves = at.dataframe[0].value
    assert set(leaves.instance) == {f"127.0.0.1:{e.port}" for e in engines}
    assert [s.value for s in at.subheader] == ["Ranked explanations"]
    assert not [i for i in at.info if "holds no engine traffic" in i.value]   # both windows had traffic
    # the sidebar names only the sources that exist
    at = AppTest.from_file(str(ROOT / "app" / "dashboard" / "main.py"), default_timeout=120).run()
    assert not at.exception
    assert [c.value for c in at.sidebar.caption] == [f"Source: Prometheus · {prom}"]


@pytest.mark.browser
def test_every_page_in_chromium_engine_only(stack, phases, tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = need_binary("chromium")
    _, prom = stack
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "dashboard" / "main.py"),
                             "--server.headless", "true", "--server.port", str(port), "--server.address",
                             "127.0.0.1", "--browser.gatherUsageStats", "false"], env=_page_env(prom, tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200, 60, "streamlit")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1400, "height": 2200})  # the main block scrolls: tall
            for pg in ENGINE_PAGES:
                name = pg.name
                page.goto(f"{url}/{pg.url_path}", wait_until="networkidle")
                page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=60_000)
                page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')",
                                       timeout=90_000)
                page.get_by_text(pg.engine_only).first.wait_for(state="attached", timeout=90_000)
                page.wait_for_timeout(2500)                           # charts finish drawing
                page.screenshot(path=str(SHOTS / f"engine-{name}.png"), full_page=True)
                assert not page.query_selector('[data-testid="stException"]'), name
                sidebar = page.inner_text('[data-testid="stSidebar"]')
                assert f"Prometheus · {prom}" in sidebar and "embedded store" not in sidebar, name
            browser.close()
    finally:
        proc.terminate()
        proc.wait(15)


def test_live_demo_shows_real_prefix_hits(stack, phases):
    """`warmscope demo --engine vllm` drives simulator-shaped traffic; pointed at
    a running engine, its progress lines are the engine's own counters."""
    import argparse
    import io

    from warmscope.app.cli.engine_demo import run

    engines, _ = stack
    eng = engines[0]
    before = eng.counters()
    out = io.StringIO()
    args = argparse.Namespace(engine=None, engine_url=eng.url, no_dashboard=True, rps=8.0, duration=12.0,
                              every=4.0, seed=7, port=0, address="127.0.0.1")
    assert run(args, out=out) == 0
    after = eng.counters()
    lines = out.getvalue().strip().splitlines()
    assert len(lines) >= 2, lines
    last = lines[-1]
    m = re.search(r"prompt tokens ([\d,]+)  cached ([\d,]+)  hit rate ([\d.]+)%", last)
    assert m, last
    q, h = (float(m.group(i).replace(",", "")) for i in (1, 2))
    # the last line is read after the traffic stopped growing only approximately: bound it by the engine's delta
    dq = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    dh = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert 0 < h <= dh and 0 < q <= dq
    assert h % 32 == 0
    FIGURES["live demo (12 s against one engine)"] = last
