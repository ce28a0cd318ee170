"""What ``kvsim dashboard`` hands to ``streamlit run`` (alone in its folder: see launch.py)."""
from kvsim.dashboard.router import main

main()
