"""ringmaster.mxnet (Horovod's MXNet API) end to end: real jobs under `ringmaster local`, each rank
the MXNet virtual environment's python (scripts/mxnet-venv.sh: MXNet 1.9.1, numpy 1.23.5) using the
built package (<build>/python, which `ringmaster local` puts on PYTHONPATH).

Run by ctest (label `python;mxnet`) after the `mxnet_venv` test made the environment. Where MXNet
could not be installed, every test here is skipped saying why (pytest -rs prints it).
"""
import json
import os
import re
import subprocess

import pytest

from local_jobs import EXAMPLES, HERE, ROOT, describe, mxnet_venv_python, not_built, run_local

CHECKS = os.path.join(HERE, "mxnet_api_checks.py")


PYTHON, WHY = mxnet_venv_python()

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
    """The reference workflow's MXNet knobs, passed as `--env` or set in the caller's environment
    (MXNET_* is passed on, as HOROVOD_* and NCCL_* are), are in every rank's environment."""
    r = run_local(2, PYTHON, "-c",
                  "import os; print('knobs', os.environ['MXNET_CUDNN_AUTOTUNE_DEFAULT'], "
                  "os.environ['MXNET_OPTIMIZER_AGGREGATION_SIZE'], "
                  "os.environ['MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD'])",
                  extra=("--env", "MXNET_CUDNN_AUTOTUNE_DEFAULT=0",
                         "--env", "MXNET_OPTIMIZER_AGGREGATION_SIZE=4"),
                  env={"MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD": "13"})
    assert r.returncode == 0, describe(r)
    assert len(re.findall(r"^\[\d\] knobs 0 4 13$", r.stdout, re.M)) == 2, describe(r)


def timeline_allreduces(path):
    """{tensor: (when rank 0 asked for its last allreduce, when that allreduce ended)}, in µs of
    the job's timeline: the ask is the coordinator's tick for rank 0's request, or the start of a
    locally negotiated allreduce, whichever came first."""
    events = json.loads(open(path).read())
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans, ticks = {}, {}
    stacks = {}
    for e in events:
        if e.get("ph") not in ("B", "E", "X"):
            continue
        name = names.get(e["pid"], "")
        if e["tid"] == 1 and e["ph"] == "B":
            stacks.setdefault(name, []).append(e)
        elif e["tid"] == 1 and e["ph"] == "E" and stacks.get(name):
            begin = stacks[name].pop()
            if begin["name"] == "ALLREDUCE":
                spans.setdefault(name, []).append((begin["ts"], e["ts"]))
        elif e["tid"] == 0 and e["ph"] == "X" and e["name"] == "0":
            ticks.setdefault(name, []).append(e["ts"])
    out = {}
    for name, found in spans.items():
        begin, end = found[-1]
        previous_end = found[-2][1] if len(found) > 1 else -1
        # The coordinator's tick of this allreduce (none when it was negotiated locally).
        asked = [t for t in ticks.get(name, []) if previous_end < t <= end]
        out[name] = (min([begin] + asked), end)
    return out


def test_allreduces_run_while_backward_still_computes(tmp_path):
    """Not a blocking wrapper: in the job's timeline, DistributedTrainer's allreduces are asked
    for layer by layer, in backward order, as MXNet's engine finishes each gradient, and some are
    done before backward's last gradient. (MXNet bulks backward's operators into segments whose
    gradients are ready together, MXNET_EXEC_BULK_EXEC_*; the test turns bulking off to see every
    layer.)"""
    r = run_local(2, PYTHON, os.path.join(HERE, "mxnet_overlap_checks.py"),
                  extra=("--timeline", "timeline.json", "--artifacts-output", str(tmp_path)),
                  env={"MXNET_EXEC_BULK_EXEC_TRAIN": "0"})
    assert r.returncode == 0, describe(r)
    m = re.search(r"backward alone (\S+) seconds, layers (\d+)$", r.stdout, re.M)
    assert m, describe(r)
    layers = int(m[2])
    got = timeline_allreduces(tmp_path / "timeline.json")
    # Parameter 2L is layer L's weight (then its bias); backward reaches the last layer first.
    asked = [got[f"allreduce.overlap.{2 * layer}"][0] for layer in range(layers)]
    ended = [got[f"allreduce.overlap.{2 * layer}"][1] for layer in range(layers)]
    assert asked == sorted(asked, reverse=True), got
    # Asked at separate moments (more than 1 ms apart), as the gradients came: not all at once.
    moments = sum(1 for a, b in zip(asked[1:], asked) if b - a > 1000) + 1
    assert moments >= layers // 2, (moments, got)
    assert min(ended) < asked[0], got


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
