"""The environment `make` builds is the one CI had: every package pinned in the lock file, the
lock honoured by every install in the Makefile, and the versions printed at the top of the run."""
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path.name}: {line} is not an exact pin"
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def _requirements(name: str) -> list[Requirement]:
    return [Requirement(x.split("#")[0].strip()) for x in (ROOT / name).read_text().splitlines()
            if x.split("#")[0].strip()]


def test_the_lock_pins_every_requirement_within_its_range():
    lock = _pins(ROOT / "requirements-lock.txt")
    for name in ("requirements.txt", "requirements-test.txt"):
        for req in _requirements(name):
            key = canonicalize_name(req.name)
            assert key in lock, f"{name}: {req.name} is not in requirements-lock.txt (run make lock)"
            assert req.specifier.contains(lock[key], prereleases=True), (name, str(req), lock[key])
    # the pin the brief asks for, without the CPU wheel's local label
    assert lock["torch"] == "2.13.0"


def test_every_install_in_the_makefile_honours_the_lock():
    text = (ROOT / "Makefile").read_text()
    installs = [x for x in text.splitlines() if "pip install" in x and " -r " in x]
    assert installs and all("-c $(LOCK)" in x for x in installs), installs
    assert re.search(r"^LOCK := requirements-lock.txt$", text, re.M)
    # a make test run with another LOCK= hands it down through MAKEFLAGS: read the Makefile's own
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(["make", "-n", "-B", "lock"], cwd=ROOT, capture_output=True, text=True, check=True,
                         env=env).stdout
    assert "piptools compile" in dry and "--output-file requirements-lock.txt" in dry
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)


def test_the_installed_packages_are_the_locked_ones():
    # make test names the lock it installed from (a run against another lock, numpy's oldest say,
    # checks that one); a plain pytest run checks the committed lock
    lock = _pins(ROOT / os.environ.get("KVSIM_LOCK", "requirements-lock.txt"))
    wrong = {}
    for name, version in lock.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = (version, None)
            continue
        if Version(have).public != Version(version).public:
            wrong[name] = (version, have)
    assert not wrong, f"installed versions differ from the lock (locked, installed): {wrong}"


def test_the_environment_line_names_versions_and_blas():
    import numpy as np

    from kvsim.environment import PACKAGES, describe
    line = describe()
    assert f"numpy {np.__version__}," in line and "; BLAS " in line and "\n" not in line
    for name in PACKAGES:
        assert f"{name} " in line
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    assert f"BLAS {blas}" in line
