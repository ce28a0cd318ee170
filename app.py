"""``streamlit run app.py`` (``make run``): the dashboard, routed by kvsim.dashboard.router."""
from kvsim.dashboard.router import main

main()
