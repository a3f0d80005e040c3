"""`cmake --install` puts an importable package into the interpreter's site-packages."""

import glob
import os
import subprocess
import sys

import pytest


def test_the_installed_package_imports_and_runs_from_the_prefix(tmp_path):
    build = os.environ.get("FERRY_BUILD_DIR")
    if not build:
        pytest.skip("FERRY_BUILD_DIR is not set (ctest sets it)")
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", build, "--prefix", str(prefix)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    found = glob.glob(str(prefix / "lib" / "python3*" / "*-packages" / "ferry" / "_C*.so"))
    assert len(found) == 1, f"no ferry/_C under {prefix}: {r.stdout}"
    site = os.path.dirname(os.path.dirname(found[0]))
    # The extension finds libferry, LibTorch and spdlog by its RUNPATH alone, wherever they lie.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    r = subprocess.run(["ldd", found[0]], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "not found" not in r.stdout, r.stdout + r.stderr
    env["PYTHONPATH"] = site
    code = ("import ferry, torch; q = ferry.Queue(); q.put(torch.ones(3)); "
            "print(ferry.__file__, q.get().sum().item())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    path, total = r.stdout.split()
    assert path.startswith(site) and float(total) == 3.0
