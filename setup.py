"""`pip install .`: the package's C++ parts come from the project's CMake build.

The extension (ringmaster._ringmaster), the ringmaster.v1 gRPC stubs and the three binaries
(ringmaster, ringmaster-worker, ringmaster-coordinator) are built with CMake into
RINGMASTER_BUILD_DIR (default: build-pip in the source tree; a directory that already holds a build
is brought up to date) and copied into the wheel: the binaries under ringmaster/bin, run by the
`ringmaster`, `ringmaster-worker` and `ringmaster-coordinator` commands pip installs. Needs what
scripts/install-deps.sh installs (a C++ compiler, CMake, gRPC, protobuf, Abseil, Gloo, pybind11).
RINGMASTER_BUILD_JOBS: parallel compile jobs (default 2).
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
BINARIES = ("ringmaster", "ringmaster-worker", "ringmaster-coordinator")
TARGETS = ("ringmaster_python", "ringmaster_python_sources", "ringmaster_python_stubs") + BINARIES


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("RINGMASTER_BUILD_DIR", ROOT / "build-pip"))
        if not (build_dir / "CMakeCache.txt").exists():  # else: an existing build, as it is
            configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir),
                         f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release",
                         "-DRINGMASTER_BUILD_TESTS=OFF"]
            if shutil.which("ccache"):
                configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            subprocess.check_call(configure)
        jobs = os.environ.get("RINGMASTER_BUILD_JOBS", "2")
        for target in TARGETS:
            subprocess.check_call(["cmake", "--build", str(build_dir), "--target", target,
                                   "-j", jobs])
        # The built package's compiled and generated parts, over the pure-Python sources.
        built = build_dir / "python" / "ringmaster"
        out = pathlib.Path(self.build_lib) / "ringmaster"
        out.mkdir(parents=True, exist_ok=True)
        for path in built.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                target = out / path.relative_to(built)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        (out / "bin").mkdir(exist_ok=True)
        for name in BINARIES:
            shutil.copy2(build_dir / "bin" / name, out / "bin" / name)
        # The worker's GPU data plane (built where CUDA and NCCL are), found by the worker in
        # ../lib/ringmaster beside its bin/.
        plugin = build_dir / "lib" / "ringmaster" / "libringmaster_cuda.so"
        if plugin.exists():
            (out / "lib" / "ringmaster").mkdir(parents=True, exist_ok=True)
            shutil.copy2(plugin, out / "lib" / "ringmaster" / plugin.name)


setup(ext_modules=[Extension("ringmaster._ringmaster", sources=[])],
      cmdclass={"build_ext": CMakeBuild},
      # Not setuptools' default ./build: that is the project's CMake build directory.
      options={"build": {"build_base": str(ROOT / "build-pip" / "setuptools")}})
