"""What a result depends on beyond kvsim's own code: the versions of the packages that compute it
and the BLAS that numpy's least squares (cost-table fits) runs on. ``make test`` prints this line
first, so that a failure on another machine can be read against it."""
from __future__ import annotations

import ctypes
import glob
import os
from importlib import metadata

PACKAGES = ("numpy", "torch", "triton", "streamlit", "simpy", "pandas")


def numpy_blas() -> str:
    """numpy's BLAS: its name and version, and for OpenBLAS the kernels it picked for this CPU
    (DYNAMIC_ARCH builds choose them at load time: Haswell, SkylakeX, Zen...)."""
    import numpy as np
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        text = f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except Exception as e:    # a numpy without the dict form: say so, do not fail the run
        return f"unknown ({type(e).__name__})"
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*.so*"))
    for lib in libs:
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            fn = getattr(handle, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return f"{text} ({fn().decode()} kernels)"
    return text


def describe() -> str:
    """One line: each package's installed version (not imported: torch stays unloaded) and
    numpy's BLAS."""
    parts = []
    for name in PACKAGES:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} absent")
    return ", ".join(parts) + f"; BLAS {numpy_blas()}"
