"""`pip install .` (ctest label `package`): the wheel setup.py builds through CMake, from this
build directory (RINGMASTER_BUILD_DIR, brought up to date, so the test takes seconds), installed
into a directory of its own as a user's `pip install --target` would, and used from there alone:
its commands on PATH, `ringmaster local` finding the daemons shipped in the package, a 2-rank job
importing `ringmaster.torch` from the install, and the job client and Estimator importable.

    RINGMASTER_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/cli/test_pip_install.py
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RINGMASTER_BUILD_DIR", REPO / "build")).resolve()
PYTHON = "/usr/bin/python3"

JOB = """
import torch
import ringmaster.torch as hvd
hvd.init()
total = hvd.allreduce(torch.ones(2) * (hvd.rank() + 1), op=hvd.Sum)
print(f"rank {hvd.rank()} sum {total.tolist()} from {hvd.__file__}", flush=True)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if subprocess.run([PYTHON, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("pip is not installed (python3-pip)")
    target = tmp_path_factory.mktemp("pip") / "site"
    env = dict(os.environ, RINGMASTER_BUILD_DIR=str(BUILD))
    r = subprocess.run([PYTHON, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--no-cache-dir", "--target", str(target), str(REPO)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def clean_env(target):
    """As on a host where nothing but the installed package is: no build tree on any path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RINGMASTER_BIN_DIR", "RINGMASTER_COORDINATOR")}
    env["PYTHONPATH"] = str(target)
    env["PATH"] = f"{target}/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def test_the_wheel_holds_the_extension_the_stubs_and_the_daemons(installed):
    pkg = installed / "ringmaster"
    assert list(pkg.glob("_ringmaster.cpython-*.so"))
    for stub in ("job_pb2.py", "job_pb2_grpc.py", "common_pb2.py"):
        assert (pkg / "v1" / stub).is_file(), stub
    for name in ("ringmaster", "ringmaster-worker", "ringmaster-coordinator"):
        assert os.access(pkg / "bin" / name, os.X_OK), name
        assert (installed / "bin" / name).is_file(), name  # the command pip installed


def test_ringmaster_local_runs_a_job_from_the_installed_package_alone(installed, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = clean_env(installed)
    r = subprocess.run(["ringmaster", "local", "--np", "2", "--", PYTHON, str(script)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert re.search(rf"^\[{rank}\] rank {rank} sum \[3\.0, 3\.0\] from "
                         rf"{re.escape(str(installed))}/ringmaster/torch/__init__\.py$",
                         r.stdout, re.M), r.stdout
    r = subprocess.run(["ringmaster-worker", "--help"], capture_output=True, text=True,
                       timeout=20, env=env)
    assert r.returncode == 0 and r.stdout.startswith("usage: ringmaster-worker "), r.stderr


def test_the_job_client_and_the_estimator_import_from_the_install(installed):
    r = subprocess.run([PYTHON, "-c", "import ringmaster, ringmaster.jobs; "
                        "from ringmaster import Estimator; "
                        "print(ringmaster.__file__, Estimator.__module__)"],
                       capture_output=True, text=True, timeout=60, env=clean_env(installed))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"{installed}/ringmaster/__init__.py", "ringmaster.estimator"]
