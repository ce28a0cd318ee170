"""The wheel, installed (not editable) into a fresh virtual environment beside Hugging Face's
``kernels`` from PyPI: one import namespace, every entry point working outside the checkout.

Installing torch, streamlit... again would cost minutes, so the fresh environment sees the
project environment's third-party packages through a ``.pth`` file pointing at a folder of links
to them, which leaves out kvsim's own editable install; kvsim and Hugging Face's kernels land
in the fresh environment's own site-packages, and the test checks that they are the ones imported.
Needs PyPI (CI reaches it); the wheel is built from a copy of the tree, so the checkout stays clean.
"""
import fcntl
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from streamlit_server import free_port, stop, wait_until_serving

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
HF_KERNELS = "kernels==0.17.2"  # Hugging Face's package (pinned: CI must not change by itself)
# what our packaging must never put at the top of site-packages (the design card's folders)
FOLDER_NAMES = ("allocator", "kernels", "workloads", "simulator", "planner", "viz", "app_pages")
NOT_COPIED = (".venv", ".git", "runs", "out", "build", "dist", "tmp", "*.egg-info", "__pycache__",
              ".pytest_cache", ".hypothesis")
TIMEOUT_S = 300


def _run(cmd, **kwargs) -> str:
    """Run a command; its stdout, or a failure with the tail of its output."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=TIMEOUT_S, **kwargs)
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))} -> {proc.returncode}\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def _build(tmp: Path) -> dict:
    """Build the wheel from a copy of the tree (no build isolation, no download) and install it
    with Hugging Face's kernels into a fresh venv under ``tmp``; the paths and seconds taken."""
    times = {}
    t0 = time.monotonic()
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_COPIED))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", tmp / "dist", src])
    (wheel,) = (tmp / "dist").glob("kvsim-*.whl")
    times["build wheel"] = time.monotonic() - t0

    t0 = time.monotonic()
    env_dir = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", env_dir])
    py = env_dir / "bin" / "python"
    purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                   .strip())
    # the project's third-party packages, minus kvsim's own install (editable finder, dist-info)
    # and .pth files; the .pth appends this folder after the fresh site-packages
    # (named site-packages: Streamlit turns on its development mode when it is imported from
    # anywhere else, and development mode refuses --server.port)
    deps = tmp / "project-deps" / "site-packages"
    deps.mkdir(parents=True)
    for site in dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")):
        for entry in Path(site).iterdir():
            name = entry.name
            if (name.startswith(("__editable__", "kvsim-", "kvsim.")) or name.endswith(".pth")
                    or name == "__pycache__" or (deps / name).exists()):
                continue
            (deps / name).symlink_to(entry)
    (purelib / "_kvsim_test_project_deps.pth").write_text(f"{deps}\n")
    times["venv"] = time.monotonic() - t0

    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q"]
    t0 = time.monotonic()
    _run([*pip, "--no-index", wheel])  # its dependencies are satisfied by the project's
    times["install kvsim"] = time.monotonic() - t0
    t0 = time.monotonic()
    _run([*pip, HF_KERNELS])
    times["install kernels"] = time.monotonic() - t0
    return {"wheel": str(wheel), "bin": str(env_dir / "bin"), "purelib": str(purelib),
            "times": times}


@pytest.fixture(scope="session")
def built(tmp_path_factory, worker_id) -> dict:
    """_build once per test run: under xdist the first worker builds, the other waits on a lock
    and reuses the result (xdist's recipe for a session fixture that runs once)."""
    if worker_id == "master":
        return _build(tmp_path_factory.mktemp("packaging"))
    run_tmp = tmp_path_factory.getbasetemp().parent  # this run's folder, shared by its workers
    with open(run_tmp / "packaging.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = run_tmp / "packaging.json"
        if not done.exists():
            done.write_text(json.dumps(_build(run_tmp / "packaging")))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def wheel(built) -> Path:
    return Path(built["wheel"])


@pytest.fixture(scope="session")
def fresh(built):
    """(bin folder, site-packages, seconds taken per step) of the fresh venv."""
    return Path(built["bin"]), Path(built["purelib"]), built["times"]


def test_wheel_holds_only_the_kvsim_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = re.compile(r"kvsim-[^/]+\.dist-info/")
    assert [n for n in names if not (n.startswith("kvsim/") or dist_info.match(n))] == []
    top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    if top_level:
        assert zipfile.ZipFile(wheel).read(top_level[0]).decode().split() == ["kvsim"]
    # every sub-package, the dashboard's pages and the script `kvsim dashboard` runs
    for path in ("kvsim/cli/dashboard.py", "kvsim/dashboard/entry/kvsim_dashboard.py",
                 "kvsim/app_pages/live_pool.py", "kvsim/kernels/__init__.py",
                 *(f"kvsim/{n}/__init__.py" for n in FOLDER_NAMES)):
        assert path in names


def test_declared_dependencies_admit_the_pinned_versions(wheel):
    from packaging.requirements import Requirement
    meta = zipfile.ZipFile(wheel).read(
        next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("/METADATA"))).decode()
    declared = {r.name: r for r in map(Requirement, re.findall(r"^Requires-Dist: (.+)$", meta,
                                                              re.M)) if not r.marker}
    pinned = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            pinned[req.name] = req
    test_tools = {"pytest", "pytest-xdist", "hypothesis", "playwright"}
    assert set(declared) == set(pinned) - test_tools
    for name, req in declared.items():
        for spec in pinned[name].specifier:
            if spec.operator == "==":
                assert req.specifier.contains(spec.version), (name, str(req.specifier), spec)
            else:  # a range in requirements.txt: the same range declared
                assert spec in set(req.specifier), (name, str(req.specifier), spec)


def test_installed_beside_hugging_face_kernels(fresh, tmp_path):
    bindir, purelib, times = fresh
    py = bindir / "python"
    probe = ("import json, kernels, kvsim, kvsim.kernels, streamlit; print(json.dumps({"
             "'kernels': kernels.__file__, 'hf': hasattr(kernels, 'get_kernel') and "
             "hasattr(kernels, 'kernelize'), 'kvsim': kvsim.__file__, "
             "'kvsim.kernels': kvsim.kernels.__file__, 'streamlit': streamlit.__file__}))")
    where = json.loads(_run([py, "-c", probe], cwd=tmp_path))  # never from the checkout
    assert where["hf"], where  # Hugging Face's kernels, not ours
    assert Path(where["kernels"]).parent == purelib / "kernels"
    # kvsim from the wheel in the fresh environment, never the checkout's editable install
    assert Path(where["kvsim"]).parent == purelib / "kvsim"
    assert Path(where["kvsim.kernels"]).parent == purelib / "kvsim" / "kernels"
    assert not Path(where["streamlit"]).is_relative_to(purelib)  # deps came through the .pth
    top = {p.name for p in purelib.iterdir()}
    assert not top & (set(FOLDER_NAMES) - {"kernels"}), top
    record = next(purelib.glob("kvsim-*.dist-info")) / "RECORD"
    outside = [line.split(",")[0] for line in record.read_text().splitlines()
               if not line.startswith(("kvsim/", "kvsim-"))]
    assert outside == ["../../../bin/kvsim"]
    print(f"\npackaging: {', '.join(f'{k} {v:.1f} s' for k, v in times.items())}")


def test_every_entry_point_runs_outside_the_checkout(fresh, tmp_path):
    bindir, _, _ = fresh
    kvsim = bindir / "kvsim"
    assert "dashboard" in _run([kvsim, "--help"], cwd=tmp_path)
    assert "validate" in _run([kvsim, "validate", "--help"], cwd=tmp_path)
    out = _run([kvsim, "workload", "sharegpt:rate=1,n=10,seed=0"], cwd=tmp_path)
    assert re.search(r"^requests\s+10$", out, re.M), out
    from kvsim.cli import COMMANDS
    for command in COMMANDS:
        assert "usage: kvsim " + command in _run([kvsim, command, "--help"], cwd=tmp_path)
    # the commands that compute, on small inputs (reproduce takes ~30 s: its --help above)
    spec = "sharegpt:rate=2,n=30,seed=0"
    assert "requests finished" in _run([kvsim, "replay", spec, "--num-blocks", "400", "--quiet",
                                        "--out", tmp_path / "r.json"], cwd=tmp_path)
    assert json.loads((tmp_path / "r.json").read_text())["requests_finished"] == 30
    assert "paged" in _run([kvsim, "compare", spec, "--kv-tokens", "6000", "--quiet"],
                           cwd=tmp_path)
    assert "num_gpu_blocks" in _run([kvsim, "capacity", "--model", "Llama-3.1-8B", "--gpu",
                                     "h100"], cwd=tmp_path)
    _run([kvsim, "plan", spec, "--sweep", "block_size=16,32", "--quiet", "--out",
          tmp_path / "plan"], cwd=tmp_path)
    assert (tmp_path / "plan" / "report.html").exists()
    out = _run([kvsim, "validate", spec, "--at", "10", "--num-blocks", "400", "--device", "cpu"],
               cwd=tmp_path)
    assert "PASS" in out, out


def test_installed_dashboard_routes_every_page(fresh, tmp_path):
    """The router and pages from site-packages, run through Streamlit's AppTest."""
    bindir, _, _ = fresh
    code = ("from streamlit.testing.v1 import AppTest\n"
            "from kvsim.dashboard import launch, router\n"
            "at = AppTest.from_file(str(launch.ENTRY_SCRIPT), default_timeout=120)\n"
            "at.session_state['k_max_requests'] = 20\n"
            "titles = [at.run().title[0].value]\n"
            "for name, _, _ in router.PAGES[1:]:\n"
            "    if name == 'kernels.py':\n"  # the kernel page is test_app's (slow)
            "        continue\n"
            "    at.switch_page(str(router.PAGES_DIR / name)).run()\n"
            "    assert not at.exception and not at.error, [e.value for e in at.exception]\n"
            "    titles.append(at.title[0].value)\n"
            "print('|'.join(titles))\n")
    titles = _run([bindir / "python", "-c", code], cwd=tmp_path).strip().splitlines()[-1]
    assert titles == ("Live KV-cache pool|Block table inspector|KV-cache groups (hybrid models)|"
                      "Metrics|Capacity planner")


def test_kvsim_dashboard_serves_a_page(fresh, tmp_path):
    bindir, _, _ = fresh
    port = free_port()
    proc = subprocess.Popen([bindir / "kvsim", "dashboard", "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url)
        with urllib.request.urlopen(url + "/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
    finally:
        stop(proc)  # kvsim dashboard became the Streamlit server (os.execv): this pid is it
