"""The Streamlit dashboard: ``main.py`` is the Streamlit script, ``views/`` one module per page."""
