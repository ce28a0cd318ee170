"""kvsim: simulate, plan and visualise KV-cache memory in LLM serving.

Every import name lives under this namespace. The design card keeps the sub-packages in the
repository's top-level folders; packaging (pyproject.toml, ``package-dir``) maps them here:

    kvsim.allocator  <- allocator/     kvsim.workloads <- workloads/
    kvsim.simulator  <- simulator/     kvsim.planner   <- planner/
    kvsim.kernels    <- kernels/       kvsim.viz       <- viz/
    kvsim.app_pages  <- app_pages/     kvsim.cli, kvsim.errors, kvsim.dashboard <- kvsim/

Nothing is imported here, so that ``kvsim --help`` loads only what it needs.
"""
__version__ = "0.1.0"
