"""ringmaster.mxnet (Horovod's MXNet API) end to end: real jobs under `ringmaster local`, each rank
the MXNet virtual environment's python (scripts/mxnet-venv.sh: MXNet 1.9.1, numpy 1.23.5) using the
built package (<build>/python, which `ringmaster local` puts on PYTHONPATH).

Run by ctest (label `python;mxnet`) after the `mxnet_venv` test made the environment. Where MXNet
could not be installed, every test here is skipped saying why (pytest -rs prints it).
"""
import os
import re
import subprocess

import pytest

from local_jobs import EXAMPLES, HERE, ROOT, describe, not_built, run_local

CHECKS = os.path.join(HERE, "mxnet_api_checks.py")


def _venv_python():
    """The MXNet environment's python, made by the project's script; None and why otherwise."""
    try:
        r = subprocess.run([os.path.join(ROOT, "scripts", "mxnet-venv.sh")], capture_output=True,
                           text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "scripts/mxnet-venv.sh did not finish within 900 s"
    if r.returncode != 0:
        return None, (f"MXNet could not be installed (scripts/mxnet-venv.sh exited "
                      f"{r.returncode}): {r.stderr.strip()[-800:]}")
    return r.stdout.strip().splitlines()[-1], ""


PYTHON, WHY = _venv_python()

pytestmark = [not_built,
              pytest.mark.skipif(PYTHON is None, reason=WHY or "no MXNet environment")]


@pytest.mark.parametrize("np, extra", [(2, ()), (3, ("--processes-per-host", "2"))],
                         ids=["np2", "np3-two-hosts"])
def test_mxnet_api_checks(np, extra):
    r = run_local(np, PYTHON, CHECKS, extra=extra, timeout=300)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in range(np):
        assert re.search(rf"^\[{rank}\] mxnet_api_checks: rank {rank}: \d+ checks passed$",
                         r.stdout, re.M), describe(r)


def test_mxnet_gluon_example_converges():
    """The reference workflow's skeleton: init, broadcast_parameters, DistributedTrainer, a Gluon
    CNN on generated data sharded by rank."""
    r = run_local(2, PYTHON, os.path.join(EXAMPLES, "mxnet_gluon_cnn.py"), "--epochs", "3",
                  timeout=300)
    assert r.returncode == 0, describe(r)
    accuracy = [float(a) for a in re.findall(r"^\[0\] epoch \d+ .* accuracy ([0-9.]+)$",
                                             r.stdout, re.M)]
    assert len(accuracy) == 3, describe(r)
    assert accuracy[-1] >= 0.9, describe(r)
    # Both ranks end with the same parameters (the example prints their checksum).
    sums = re.findall(r"^\[(\d)\] parameters checksum (\S+)$", r.stdout, re.M)
    assert len(sums) == 2 and sums[0][1] == sums[1][1], describe(r)


def test_mxnet_knobs_reach_the_ranks():
    """The reference workflow's MXNet knobs, passed as `--env`, are in every rank's environment."""
    r = run_local(2, PYTHON, "-c",
                  "import os; print('knobs', os.environ['MXNET_CUDNN_AUTOTUNE_DEFAULT'], "
                  "os.environ['MXNET_OPTIMIZER_AGGREGATION_SIZE'])",
                  extra=("--env", "MXNET_CUDNN_AUTOTUNE_DEFAULT=0",
                         "--env", "MXNET_OPTIMIZER_AGGREGATION_SIZE=4"))
    assert r.returncode == 0, describe(r)
    assert len(re.findall(r"^\[\d\] knobs 0 4$", r.stdout, re.M)) == 2, describe(r)


def test_engine_declarations_match_the_wheels_headers():
    """python/src/mxnet_abi.h (what the package uses of MXNet, declared so that it builds without
    MXNet) against the installed wheel's own headers: mxnet_abi_check.cc's static_asserts."""
    include = subprocess.run(
        [PYTHON, "-c", "import mxnet, os; print(os.path.join(os.path.dirname(mxnet.__file__), "
                       "'include'))"], capture_output=True, text=True, check=True).stdout.strip()
    r = subprocess.run(
        [os.environ.get("CXX", "c++"), "-std=c++17", "-fsyntax-only", "-w",
         # mshadow's defaults want MKL and CBLAS headers the wheel does not ship.
         "-DMSHADOW_USE_MKL=0", "-DMSHADOW_USE_CBLAS=0", "-DMSHADOW_USE_CUDA=0",
         "-DMSHADOW_USE_F16C=0", f"-I{include}", f"-I{ROOT}",
         os.path.join(HERE, "mxnet_abi_check.cc")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
