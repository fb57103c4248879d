"""warmscope app: the Streamlit dashboard and the `warmscope` command line."""
