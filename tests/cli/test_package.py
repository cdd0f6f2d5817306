"""The Debian package (`cd build && cpack`, ctest label `package`): built from this build, its
contents as a user's host gets them, and `ringmaster local` run from the unpacked package (the
binaries finding each other under /usr/bin, the shipped self-check under /usr/libexec/ringmaster).

    RINGMASTER_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/cli/test_package.py
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RINGMASTER_BUILD_DIR", REPO / "build")).resolve()

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("cpack") is None,
                                reason="dpkg-deb or cpack is not installed")


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    out = tmp_path_factory.mktemp("package")
    r = subprocess.run(["cpack", "--config", str(BUILD / "CPackConfig.cmake"), "-B", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=BUILD)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = out.glob("ringmaster_*_amd64.deb")
    return path


def test_the_package_holds_the_binaries_units_and_docs_and_names_its_dependencies(deb):
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    files = {line.split()[-1].lstrip(".") for line in listing.splitlines()}
    assert {"/usr/bin/ringmaster", "/usr/bin/ringmaster-coordinator", "/usr/bin/ringmaster-worker",
            "/usr/libexec/ringmaster/collectives_check",
            "/usr/lib/systemd/system/ringmaster-coordinator.service",
            "/usr/lib/systemd/system/ringmaster-worker@.service",
            "/usr/share/ringmaster/coordinator.env", "/usr/share/ringmaster/worker.env",
            "/usr/share/doc/ringmaster/deployment.md",
            "/usr/lib/python3/dist-packages/ringmaster/torch/__init__.py",
            "/usr/lib/python3/dist-packages/ringmaster/v1/job_pb2_grpc.py",
            "/usr/lib/python3/dist-packages/ringmaster/estimator.py"} <= files, sorted(files)
    assert any(re.fullmatch(r"/usr/lib/python3/dist-packages/ringmaster/_ringmaster\.cpython-.*\.so",
                            f) for f in files), sorted(files)
    depends = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True,
                             text=True, check=True).stdout
    for library in ("libgrpc++1.51", "libprotobuf32", "libgloo0", "libsqlite3-0", "libarchive13",
                    "python3-grpcio", "python3-protobuf", "python3 (>= 3."):
        assert library in depends, depends


def test_only_the_gpu_module_needs_cuda_or_nccl(deb, tmp_path):
    """The package runs on hosts without CUDA: no binary, library or extension in it needs CUDA's
    runtime or NCCL, except the worker's GPU module, loaded for --device cuda:N only."""
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    elves = [p for p in root.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
    assert len(elves) >= 5, elves
    needs_cuda = set()
    for path in elves:
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                                 check=True).stdout
        if re.search(r"NEEDED.*\[(libnccl|libcudart|libcuda)\.so", dynamic):
            needs_cuda.add("/" + str(path.relative_to(root)))
    module = "/usr/lib/ringmaster/libringmaster_cuda.so"
    assert needs_cuda <= {module}, sorted(needs_cuda)
    if (BUILD / "lib/ringmaster/libringmaster_cuda.so").exists():
        assert needs_cuda == {module}, sorted(needs_cuda)


def test_ringmaster_local_runs_from_the_unpacked_package(deb, tmp_path):
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    # Installed under /usr, the units name /usr/bin.
    unit = (root / "usr/lib/systemd/system/ringmaster-worker@.service").read_text()
    assert "ExecStart=/usr/bin/ringmaster-worker --device %i " in unit, unit
    r = subprocess.run([str(root / "usr/bin/ringmaster"), "local", "--np", "2", "--",
                        str(root / "usr/libexec/ringmaster/collectives_check")],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(2):
        assert re.search(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, 0 failed$",
                         r.stdout, re.M), r.stdout
    # The Python package from the unpacked package alone (no build tree on any path).
    job = tmp_path / "job.py"
    job.write_text("import torch, ringmaster.torch as hvd\nhvd.init()\n"
                   "print('sum', hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), "
                   "hvd.__file__, flush=True)\n")
    site = root / "usr/lib/python3/dist-packages"
    r = subprocess.run([str(root / "usr/bin/ringmaster"), "local", "--np", "2", "--",
                        "/usr/bin/python3", str(job)],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path),
                            "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(2):
        assert f"[{rank}] sum 2.0 {site}/ringmaster/torch/__init__.py" in r.stdout, r.stdout
