from warmscope.app.dashboard.pages import run

run("whatif")
