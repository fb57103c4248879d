"""The dashboard's pages, declared once: ``main.py`` builds the navigation from ``PAGES``, the cache
prewarm (``prewarm._warm_steps``) walks it, and the "every page" tests and benches iterate it.

No Streamlit here: tests and benches import this module without starting a page.

Add a page: write ``views/<name>.py`` (its first line draws ``st.title(<heading>)``), then one
``Page(...)`` below. A page with ``prewarm=True`` needs ``prewarm._warm_<name>`` (listed in
``prewarm._WARM``), the cached calls a first view makes (checked when ``prewarm`` is imported).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warmscope.model.registry import require, unique

__all__ = ["Page", "PAGES", "VIEWS", "page", "check_pages", "page_imports"]

# not "pages/": that name turns on Streamlit's folder navigation
VIEWS = Path(__file__).with_name("views")


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
        return VIEWS / f"{self.name}.py"

    @property
    def script(self) -> str:
        """The path ``AppTest.switch_page`` and ``st.page_link`` take."""
        return f"views/{self.name}.py"

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
        need(p.file.is_file(), f"no view module {p.file}")
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
