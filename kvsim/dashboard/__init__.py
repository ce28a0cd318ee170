"""The dashboard's logic, without Streamlit: what the pages show is computed here and tested.

    sources      where requests come from: built-in spec, ../shared/traces, uploads
    scenario     one workload on two allocator configurations, simulated and snapshotted
    playback     frame selection and the play / pause / step state machine
    comparison   labels, summaries and per-run tables the pages lay out side by side
    planning     the capacity planner page: capacity sweeps and simulated what-ifs
    kernel_check the kernel validation page: the Triton bridge over one snapshot
    launch       the ``streamlit run`` command line and settings of ``kvsim dashboard``
    router       the one Streamlit module here: st.navigation over the pages in app_pages/

The pages (``kvsim.app_pages``) only lay out widgets; ``app_pages/_state.py`` is the thin
Streamlit adapter (session-state seeding, ``st.cache_*`` wrappers around these functions).
Nothing is imported here, so that ``kvsim --help`` does not load Streamlit.
"""
