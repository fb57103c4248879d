"""The dashboard's pages, declared once: ``main.py`` builds the navigation from ``PAGES``, the cache
prewarm (``prewarm._warm_steps``) walks it, and the "every page" tests and benches iterate it.

No Streamlit at import: tests and benches import this module without starting a page.

Each page is a ``render() -> None`` function in the package ``views`` (``views/<name>.py``; it
imports no private name of ``warmscope.analysis``), reached through a two-line entry script
``entries/<name>.py`` that the navigation runs::

    from warmscope.app.dashboard.pages import run

    run("<name>")

``run`` draws the page's heading first (it paints before the view module loads), then calls
``render()``. Add a page in three steps:

1. write ``views/<name>.py`` with ``def render() -> None`` (no ``st.title``: ``run`` draws it);
2. write ``entries/<name>.py``, the two lines above;
3. add one ``Page(...)`` to ``PAGES`` below (its place is its place in the sidebar).

A page with ``prewarm=True`` needs ``prewarm._warm_<name>`` (listed in ``prewarm._WARM``), the
cached calls a first view makes (checked when ``prewarm`` is imported). ``check_pages`` (run at
import) refuses a page whose view or entry is missing or whose entry is not those two lines.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from warmscope.model.registry import require, unique

__all__ = ["Page", "PAGES", "VIEWS", "ENTRIES", "page", "check_pages", "page_imports", "run"]

VIEWS = Path(__file__).with_name("views")
# not "pages/": that name turns on Streamlit's folder navigation
ENTRIES = Path(__file__).with_name("entries")


@dataclass(frozen=True)
class Page:
    """One dashboard page.

    ``name`` is its module in ``views/`` and its path in the URL (the default page has none);
    ``title`` the sidebar's link text; ``icon`` a Material icon (``:material/NAME:``, drawn with
    Streamlit's own font); ``heading`` the ``st.title`` the page draws first. ``engine_only`` is
    the text the page shows last when Prometheus holds engine metrics only (``None``: the page
    has no engine-only mode). ``prewarm``: the server computes its first view in the background.
    ``imports``: the modules its first view imports, loaded when the server starts
    (``serve.warm_up``) instead of during the first viewer's page run."""

    name: str
    title: str
    icon: str
    heading: str
    engine_only: str | None = None
    prewarm: bool = False
    default: bool = False
    imports: tuple[str, ...] = ()

    @property
    def file(self) -> Path:
        """The entry script the navigation runs."""
        return ENTRIES / f"{self.name}.py"

    @property
    def view(self) -> Path:
        """The module holding the page's ``render()``."""
        return VIEWS / f"{self.name}.py"

    @property
    def module(self) -> str:
        return f"warmscope.app.dashboard.views.{self.name}"

    @property
    def script(self) -> str:
        """The path ``AppTest.switch_page`` and ``st.page_link`` take."""
        return f"entries/{self.name}.py"

    @property
    def entry(self) -> str:
        """The text of the page's entry script."""
        return f'from warmscope.app.dashboard.pages import run\n\nrun("{self.name}")\n'

    @property
    def url_path(self) -> str:
        return "" if self.default else self.name


PAGES: tuple[Page, ...] = (
    Page(
        "overview",
        "Overview",
        ":material/dashboard:",
        "Cache warm-up overview",
        engine_only="Time to first token",
        prewarm=True,
        default=True,
        imports=(
            "plotly.graph_objects",
            "plotly.express",
            "warmscope.analysis.alerts",
            "warmscope.analysis.scores",
            "warmscope.analysis.drilldown",
            "warmscope.analysis.hitrate",
            "warmscope.analysis.roi",
        ),
    ),
    Page(
        "hitrate",
        "Hit rate explorer",
        ":material/target:",
        "Hit rate explorer",
        engine_only="share of prompt tokens",
        prewarm=True,
        imports=("plotly.graph_objects", "warmscope.analysis.hitrate"),
    ),
    Page(
        "latency",
        "Latency",
        ":material/speed:",
        "Latency percentiles",
        engine_only="come from the warmscope",
        prewarm=True,
        imports=("plotly.graph_objects", "warmscope.analysis.latency"),
    ),
    Page(
        "warmup",
        "Warm-up runs",
        ":material/whatshot:",
        "Warm-up runs",
        engine_only="come from the warmscope",
        prewarm=True,
        imports=(
            "plotly.express",
            "plotly.graph_objects",
            "warmscope.analysis.coverage",
            "warmscope.analysis.roi",
        ),
    ),
    Page("advisor", "Advisor", ":material/explore:", "Advisor"),
    Page(
        "hotkeys",
        "Hot keys",
        ":material/key:",
        "Hot keys",
        engine_only="come from the warmscope",
        prewarm=True,
        imports=("warmscope.analysis.coverage",),
    ),
    Page("misses", "Why misses", ":material/help_center:", "Why misses"),
    Page(
        "whatif",
        "What if",
        ":material/alt_route:",
        "What would fix it",
        imports=("plotly.graph_objects", "warmscope.analysis.whatif.report"),
    ),
    Page(
        "rootcause",
        "Root cause",
        ":material/troubleshoot:",
        "Root cause",
        engine_only="Cold-start trap checks",
        prewarm=True,
        imports=(
            "plotly.graph_objects",
            "warmscope.analysis.drilldown",
            "warmscope.analysis.traps",
        ),
    ),
    Page(
        "ab",
        "A/B",
        ":material/science:",
        "A/B report",
        engine_only="per-unit records",
        imports=(
            "plotly.graph_objects",
            "warmscope.analysis.ab_report",
            "warmscope.analysis.ab_segments",
        ),
    ),
    Page(
        "alerts",
        "Alerts",
        ":material/notifications_active:",
        "Alerts",
        engine_only="Engine metrics only",
        imports=(
            "plotly.graph_objects",
            "warmscope.analysis.alerts",
            "warmscope.analysis.alert_history",
        ),
    ),
)


def check_pages(pages: tuple[Page, ...]) -> None:
    """Raise ``RegistryError`` for a page that is incomplete: no view module, title, heading or
    Material icon, a name used twice, or not exactly one default page."""
    unique("dashboard page", [p.name for p in pages])
    for p in pages:

        def need(ok: object, problem: str, p: Page = p) -> None:
            require(ok, "dashboard page", p.name, problem)

        need(p.name.isidentifier(), "the name must be the module name of views/<name>.py")
        need(p.view.is_file(), f"no view module {p.view}")
        need(p.file.is_file(), f"no entry script {p.file}")
        need(
            not p.file.is_file() or p.file.read_text() == p.entry,
            f"the entry script {p.file} must be exactly: {p.entry!r}",
        )
        need(p.title, "needs a title (the sidebar's link text)")
        need(p.heading, "needs the heading its view draws with st.title")
        need(
            p.icon.startswith(":material/") and p.icon.endswith(":") and len(p.icon) > 11,
            f"the icon must be a Material icon ':material/NAME:', got {p.icon!r}",
        )
        need(
            p.engine_only is None or p.engine_only.strip(),
            "engine_only is the text the page shows last in engine-only mode, or None",
        )
        need(
            all(all(w.isidentifier() for w in m.split(".")) for m in p.imports),
            f"imports are dotted module names, got {p.imports!r}",
        )
    defaults = [p.name for p in pages if p.default]
    require(
        len(defaults) == 1,
        "dashboard page",
        ", ".join(defaults) or "(none)",
        "exactly one page must be the default",
    )


check_pages(PAGES)


def page(name: str) -> Page:
    """The page called ``name`` (``KeyError`` names the pages there are)."""
    for p in PAGES:
        if p.name == name:
            return p
    raise KeyError(f"no page {name!r}; pages: {', '.join(p.name for p in PAGES)}")


def page_imports(pages: tuple[Page, ...] = PAGES) -> tuple[str, ...]:
    """Every page's ``imports``, each once, in page order (what the server loads at start)."""
    return tuple(dict.fromkeys(m for p in pages for m in p.imports))


def run(name: str) -> None:
    """Draw page ``name``: its heading first (it paints while the view module loads), then its
    ``render()``. What the page's entry script calls."""
    import streamlit as st

    p = page(name)
    st.title(p.heading)
    importlib.import_module(p.module).render()
