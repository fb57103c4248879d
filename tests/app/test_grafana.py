"""The Grafana dashboards (app/grafana.py, `warmscope grafana`): every panel's PromQL evaluated
against a real Prometheus that runs rules/*.yml over

* the collectors' own exposition, written by the simulator in real time (the
  ``live_simulation`` of tests/production), and
* an engine exposition: a small HTTP server answering like vLLM's /metrics (one instance in the
  colon names, one in the escaped names Prometheus 2.x stores), with the TTFT and KV-block
  residency histograms, and the block-level KV series ``warmscope_kv_*`` (synthetic samples:
  their source is being written on another branch),

and returning data of the panel's kind (a range of series for graphs and heatmaps, buckets by
``le`` for heatmaps, an instant vector for stats, bar gauges and tables). The JSON is decoded
by the Grafana Foundation SDK's own model (with its panel and query plugins registered) and
re-encoded unchanged. Renaming a rule breaks generation; a datasource without the series gets
a text panel naming them."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import HTTPServer
from pathlib import Path

import pytest

pytest.importorskip("grafana_foundation_sdk")
from warmscope.app import grafana  # noqa: E402
from warmscope.app.cli.main import main  # noqa: E402

from tests.conftest import (  # noqa: E402
    ExpositionHandler,
    free_port,
    need_binary,
    prom_query,
    wait_until,
)
from tests.production.conftest import live_simulation  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUCKETS = ("0.1", "1.0", "10.0", "100.0", "+Inf")


class _Engine(ExpositionHandler):
    """vLLM-shaped /metrics whose counters advance by fixed steps per scrape."""

    scrapes: dict[int, int] = {}
    escaped_port = 0

    def exposition(self) -> bytes:
        port = self.server.server_port
        n = _Engine.scrapes[port] = _Engine.scrapes.get(port, 0) + 1
        v = (lambda s: s.replace(":", "_")) if port == _Engine.escaped_port else (lambda s: s)
        m = '{engine="0",model_name="tiny"}'
        lines = [
            f"{v('vllm:prefix_cache_hits_total')}{m} {60 * n}",
            f"{v('vllm:prefix_cache_queries_total')}{m} {100 * n}",
            f"{v('vllm:prompt_tokens_cached_by_source_total')}"
            '{engine="0",model_name="tiny",source="device"} '
            f"{60 * n}",
            f"{v('vllm:kv_cache_usage_perc')}{m} 0.97",
        ]  # over 95 %: the KV-saturation alert goes pending
        hists = {
            "vllm:time_to_first_token_seconds": (0.2, 0.9, 1.0, 1.0),
            "vllm:kv_block_lifetime_seconds": (0.0, 0.3, 0.8, 1.0),
            "vllm:kv_block_idle_before_evict_seconds": (0.1, 0.5, 0.9, 1.0),
            "vllm:kv_block_reuse_gap_seconds": (0.4, 0.7, 1.0, 1.0),
        }
        for name, shares in hists.items():
            cum = [int(10 * n * s) for s in shares] + [10 * n]
            lines += [
                f'{v(name)}_bucket{{engine="0",model_name="tiny",le="{le}"}} {c}'
                for le, c in zip(BUCKETS, cum, strict=True)
            ]
            lines += [f"{v(name)}_count{m} {10 * n}", f"{v(name)}_sum{m} {5.0 * n}"]
        for i, cls in enumerate(grafana.MISS_CLASSES):  # block-level KV series (synthetic samples)
            for t, tenant in enumerate(("acme", "globex")):
                lines.append(
                    f'{grafana.KV_MISSED}{{tenant="{tenant}",engine="e{port % 2}",'
                    f'miss_class="{cls}"}} '
                    f"{(i + 1) * (t + 1) * 16 * n}"
                )
        for salt in ("acme", "globex"):
            lab = f'{{engine="e{port % 2}",salt="{salt}"}}'
            lines += [
                f"{grafana.KV_BLOCKS['stored']}{lab} {8 * n}",
                f"{grafana.KV_BLOCKS['reused']}{lab} {5 * n}",
                f"{grafana.KV_BLOCKS['evicted']}{lab} {3 * n}",
                f"{grafana.KV_RESIDENT}{lab} {40 + n % 7}",
            ]
        gen = '{gen_ai_provider_name="openai",gen_ai_request_model="gpt-x"}'  # GenAI token counters
        lines += [
            f"gen_ai_client_inference_usage_input_tokens_total{gen} {200 * n}",
            f"gen_ai_client_inference_usage_cache_read_input_tokens_total{gen} {150 * n}",
        ]
        return ("\n".join(lines) + "\n").encode()


def _subst(expr: str, rng: str) -> str:
    """What Grafana substitutes before sending a panel's query (each variable at "All")."""
    for var in ("$tenant", "$layer", "$instance", "$engine"):
        expr = expr.replace(var, ".*")
    return expr.replace("$__rate_interval", "1m").replace("$__range", rng)


def _range(url: str, expr: str, start: float, end: float) -> list[dict]:
    q = urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "2"}
    )
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=10) as r:
        data = json.loads(r.read())["data"]
    assert data["resultType"] == "matrix"
    return [s for s in data["result"] if s["values"]]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    need_binary("prometheus")
    tmp = tmp_path_factory.mktemp("grafana")
    rules = tmp / "rules"
    shutil.copytree(ROOT / "rules", rules, ignore=shutil.ignore_patterns("tests"))
    servers = [HTTPServer(("127.0.0.1", free_port()), _Engine) for _ in range(2)]
    _Engine.escaped_port = servers[1].server_port
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    # A service of its own whose warm-ups run while Prometheus scrapes it: the simulator's runs all
    # finish before the first scrape, and increase() never counts a counter's first sample.
    from warmscope.collectors.config import CollectorConfig
    from warmscope.collectors.otel import build_provider, stop_server
    from warmscope.collectors.pipeline import Telemetry

    warm_port = free_port()
    cfg = CollectorConfig.load(
        env={},
        exporter="prometheus",
        prometheus_port=warm_port,
        replica="warm-0",
        store_path=str(tmp / "warm.sqlite"),
        key_secret="k",
    )
    provider, exporter = build_provider(cfg)
    tel = Telemetry(cfg, meter_provider=provider, background=False)

    def warm_ups() -> None:
        for gpu_s in (5.0, 7.0, 9.0):
            time.sleep(5)
            with tel.warmup("static_topk", layer="prefix_kv", trigger="replica_start") as run:
                run.warmed("prefix:doc:1", nbytes=1024)
                run.add_gpu_seconds(gpu_s)

    threading.Thread(target=warm_ups, daemon=True).start()
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in [s.server_port for s in servers] + [warm_port])
    extra = (
        f"  - job_name: engines\n    static_configs: [{{targets: [{targets}]}}]\n"
        f"rule_files: ['{rules}/*.yml']\n"
    )
    try:
        with live_simulation(tmp, extra) as (url, _store, t0, _t1):
            wanted = [
                "warmscope:layer_hit_ratio:rate5m",
                "warmscope:engine_prefix_hit_ratio:rate5m",
                "warmscope:warmset_precision:ratio1h",
                'ALERTS{alertstate="pending"}',
            ]

            def ready() -> bool:
                wanted[:] = [q for q in wanted if not prom_query(url, q)]
                return not wanted

            try:
                wait_until(ready, 120, "recorded series and a pending alert")
            except RuntimeError as e:
                raise RuntimeError(f"{e}; still missing: {wanted}") from None
            time.sleep(4)  # a few evaluations of every rule
            yield url, t0
    finally:
        for s in servers:
            s.shutdown()
        tel.close()
        provider.shutdown()
        stop_server(exporter)


@pytest.mark.slow  # the simulator runs 20 s in real time
@pytest.mark.prometheus
def test_every_panel_returns_data_of_its_kind_from_real_prometheus(stack, tmp_path):
    url, t0 = stack
    end = time.time()
    rng = f"{int(end - t0) + 10}s"
    rows, empty = [], []
    for d in grafana.definitions():
        for p in d.panels:
            assert p.kind in grafana.KINDS
            count, detail = 0, ""
            for q in p.queries:
                expr = _subst(q.expr, rng)
                if q.instant:
                    assert p.kind in ("stat", "table", "bargauge"), p.title
                    res = prom_query(url, expr)
                    assert all(len(s["value"]) == 2 for s in res)
                    if p.kind == "stat":
                        detail = " ".join(s["value"][1] for s in res)
                    elif p.kind == "table" and res and "alertname" in res[0]["metric"]:
                        detail = " ".join(
                            sorted(
                                {
                                    f"{s['metric']['alertname']}/{s['metric']['alertstate']}"
                                    for s in res
                                }
                            )
                        )
                else:
                    assert p.kind in ("timeseries", "heatmap"), p.title
                    res = _range(url, expr, t0, end)
                    if p.kind == "heatmap":  # a series per bucket bound: Grafana's heatmap format
                        les = {s["metric"].get("le") for s in res}
                        assert None not in les and len(les) == len(BUCKETS), (p.title, les)
                count += len(res)
            rows.append((d.uid, p.title, p.kind, count, detail))
            if not count:
                empty.append(p.title)
        for name, expr, _colour in d.annotations:
            res = _range(url, _subst(expr, rng), t0, end)
            rows.append((d.uid, f"[annotation] {name}", "annotation", len(res), ""))
            if name == "Warm-up runs" and not res:
                empty.append(f"[annotation] {name}")
    print()
    for r in rows:
        print(f"{r[0]:22} {r[1]:55} {r[2]:10} series={r[3]} {r[4]}".rstrip())
    assert not empty, f"panels without data: {empty}"
    # generated for this datasource, which holds every series: no "missing series" text panel
    assert main(["grafana", "--out", str(tmp_path), "--prometheus", url]) == 0
    assert all(
        json.loads(f.read_text())["panels"][0]["type"] != "text" for f in tmp_path.glob("*.json")
    )


def _lost(a, b, path: str = "") -> list[str]:
    """Paths of ``a`` whose value ``b`` does not hold (recursively)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            p
            for k, v in a.items()
            for p in (_lost(v, b[k], f"{path}.{k}") if k in b else [f"{path}.{k}"])
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            p
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for p in _lost(x, y, f"{path}[{i}]")
        ]
    return [] if a == b and type(a) is type(b) else [path]


def test_json_round_trips_through_the_sdk_model(tmp_path):
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import prometheus as pm

    plugins.register_default_plugins()
    assert main(["grafana", "--out", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.json"))
    assert [f.stem for f in files] == sorted(d.uid for d in grafana.definitions())
    for f in files:
        data = json.loads(f.read_text())
        model = dm.Dashboard.from_json(data)
        # decoded by the model: each target a Prometheus query, options the plugin's class
        for p in model.panels or []:
            assert isinstance(p, dm.Panel) and p.datasource and p.datasource.uid == "${datasource}"
            assert p.targets and all(isinstance(t, pm.Dataquery) for t in p.targets), p.title
            assert not isinstance(p.options, dict), (p.title, p.type)  # a typed options object
        again = json.loads(json.dumps(model, cls=JSONEncoder))
        lost = _lost(data, again)
        assert not lost, f"{f.name}: fields the model drops or changes: {lost}"
        assert _lost(again, data) == [] or all(p.endswith(".custom") for p in _lost(again, data))
        (var,) = [v for v in data["templating"]["list"] if v["type"] == "datasource"]
        assert var["name"] == "datasource" and var["query"] == "prometheus"


def test_the_kv_dashboard_names_the_model_s_miss_classes():
    """The dashboard lists the classes in its own reading order; they are the model's classes (but
    "unknown", a gap in the engine's events rather than a reason)."""
    from warmscope.model.records import MISS_CLASSES

    assert sorted(grafana.MISS_CLASSES) == sorted(set(MISS_CLASSES) - {"unknown"})
    assert len(set(grafana.MISS_CLASSES)) == len(grafana.MISS_CLASSES)


def test_renaming_a_rule_breaks_generation(tmp_path, capsys):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules, ignore=shutil.ignore_patterns("tests"))
    f = rules / "warmscope.rules.yml"
    f.write_text(
        f.read_text().replace(
            "record: warmscope:layer_hit_ratio:rate5m", "record: warmscope:layer_hit_ratio:rate1m"
        )
    )
    with pytest.raises(grafana.GrafanaError, match="warmscope:layer_hit_ratio:rate5m"):
        grafana.definitions(rules)
    assert main(["grafana", "--out", str(tmp_path / "out"), "--rules", str(rules)]) == 1
    assert "no rule records 'warmscope:layer_hit_ratio:rate5m'" in capsys.readouterr().err
    # an alert renamed in the rule files (not in analysis/alert_defs.py) breaks it too
    shutil.copy(ROOT / "rules" / "warmscope.rules.yml", f)
    a = rules / "engines.alerts.yml"
    a.write_text(a.read_text().replace("WarmscopeEngineTTFTSLOBurn", "WarmscopeEngineTTFTBurn"))
    with pytest.raises(grafana.GrafanaError, match="WarmscopeEngineTTFTSLOBurn"):
        grafana.definitions(rules)
    # every recorded series a panel reads is one the rule files record
    n = grafana.Names()
    for d in grafana.definitions():
        for p in d.panels:
            assert {
                r for r in grafana.panel_reads(p) if ":" in r and not r.startswith("vllm:")
            } <= set(n.recorded)


@pytest.mark.prometheus
def test_a_datasource_without_the_series_gets_a_text_panel(tmp_path, capsys):
    prom_bin = need_binary("prometheus")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: self\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    prom = subprocess.Popen(
        [
            prom_bin,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200,
            60,
            "prometheus",
        )
        assert main(["grafana", "--out", str(tmp_path / "out"), "--prometheus", url]) == 0
    finally:
        prom.terminate()
        prom.wait(10)
    err = capsys.readouterr().err
    for d in grafana.definitions():
        data = json.loads((tmp_path / "out" / f"{d.uid}.json").read_text())
        first = data["panels"][0]
        assert first["type"] == "text" and "lacks series" in first["options"]["content"], d.uid
        reads = sorted({r for p in d.panels for r in grafana.panel_reads(p)} - {"ALERTS"})
        assert all(f"`{r}`" in first["options"]["content"] for r in reads), d.uid
        assert all(p["fieldConfig"]["defaults"].get("noValue") for p in data["panels"][1:]), d.uid
        assert f"{d.uid}.json" in err and "series missing" in err
