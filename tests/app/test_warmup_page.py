"""The Warm-up runs page under AppTest, on a store with hand-written runs: any run id (each
layer's run of a warm-up has one, as the Why misses page names them) leads to its warm-up, typed
in the run-id box or given in the URL; an id not in the range says so."""

import pytest

from tests.helpers import page_on_store

T = 1_800_000_000.0

# run_id, replica, tenant, layer, strategy, trigger, started, ended, status, keys, bytes, gpu_s,
# memory_bytes, error. Two warm-ups of b-0, each a lora run then a prefix_kv run 2 s later (one
# warm-up: the second starts as the first ends); the newer one is listed first.
RUNS = [
    ("run-1-b1", "b-0", "", "lora", "static_topk", "replica_start", T + 60, T + 62, "ok", 4, 0, 0.3, 0, ""),
    ("run-1-b2", "b-0", "", "prefix_kv", "static_topk", "replica_start", T + 62, T + 66, "ok", 70, 0, 1.5, 0, ""),
    ("run-1-b3", "b-0", "", "lora", "static_topk", "replica_restart", T + 1860, T + 1862, "ok", 4, 0, 0.3, 0, ""),
    ("run-1-b4", "b-0", "", "prefix_kv", "static_topk", "replica_restart", T + 1862, T + 1866, "ok", 70, 0, 1.5, 0,
     ""),
]


def _lookups():
    # the page's range comes from the lookups' time bounds: a minute apart over an hour
    return [
        (T + s, "acme", "prefix_kv", "kv:chat:sys:*", r, "", "", "m", "b-0", "1024", 5)
        for s in range(0, 3600, 60)
        for r in ("hit", "miss")
    ]


@pytest.fixture
def page(tmp_path, monkeypatch):
    def open_page(run: str | None = None):
        tables = {"lookups": _lookups(), "warmup_runs": RUNS}
        return page_on_store(tmp_path / "runs.sqlite", monkeypatch, tables, "warmup", {"run": run} if run else None)

    return open_page


def _picker(at):
    return next(s for s in at.selectbox if s.key == "run")


def _runs_caption(at):
    return next(c.value for c in at.caption if c.value.startswith("Its runs:"))


def test_a_layer_run_id_typed_in_the_box_opens_its_warm_up(page):
    at = page()
    # newest first: the restart's warm-up (its first run run-1-b3) is picked by default
    assert _picker(at).value == "run-1-b3"
    assert "run-1-b3" in _picker(at).format_func("run-1-b3")
    assert _runs_caption(at) == "Its runs: `run-1-b3` (lora) · `run-1-b4` (prefix_kv)"
    # the start's prefix_kv run: the second run of the older warm-up, whose id is its first run's
    at.text_input(key="run-find").input("run-1-b2").run()
    assert not at.exception, at.exception
    assert _picker(at).value == "run-1-b1"
    assert _runs_caption(at) == "Its runs: `run-1-b1` (lora) · `run-1-b2` (prefix_kv)"
    assert at.query_params["run"] == "run-1-b1"  # the link to share names the warm-up
    assert not at.warning


def test_a_layer_run_id_in_the_url_opens_its_warm_up(page):
    at = page(run="run-1-b2")
    assert _picker(at).value == "run-1-b1"


def test_an_unknown_run_id_says_so_and_keeps_the_pick(page):
    at = page()
    at.text_input(key="run-find").input("run-9-x").run()
    assert _picker(at).value == "run-1-b3"
    assert [w.value for w in at.warning] == [
        "No warm-up run 'run-9-x' started in this range: check the id, or widen the time range in "
        "the sidebar."
    ]


def test_the_coverage_table_names_every_run(page):
    at = page()
    cov = next(df.value for df in at.dataframe if "Keys warmed" in df.value.columns)
    # newest first, one row per layer's run
    assert list(cov["Run"]) == ["run-1-b4", "run-1-b3", "run-1-b2", "run-1-b1"]


def test_a_change_is_shown_at_the_precision_of_its_values():
    """Before/after: GPU-s per request 0.0914 → 0.0916 is +0.0002 (it read ±0 under a fixed 5e-4 cut-off);
    ±0 only where the change rounds to nothing at the values' own precision."""
    from warmscope.app.dashboard.views.warmup import _cell

    assert _cell("gpu_s_per_request", 0.0916 - 0.0914, signed=True) == "+0.0002"
    assert _cell("gpu_s_per_request", 0.00001, signed=True) == "±0"
    assert _cell("ttft_p95_s", -0.0004, signed=True) == "±0"  # -0.000 s would say nothing either
    assert _cell("ttft_p95_s", -0.004, signed=True) == "-0.004 s"
    assert _cell("hit_rate", 0.01, signed=True) == "+1.0 pts"
