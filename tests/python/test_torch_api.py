"""ringmaster.torch (Horovod's PyTorch API) end to end: real jobs under `ringmaster local`, each
rank a /usr/bin/python3 process using the built package (<build>/python, which `ringmaster local`
puts on PYTHONPATH).

Run by ctest (label `python`) as: /usr/bin/python3 -m pytest tests/python/test_torch_api.py with
RINGMASTER_BIN_DIR pointing at build/bin. Every run has a deadline; when it passes,
`ringmaster local` is killed and its workers and ranks die with it (PR_SET_PDEATHSIG).
"""
import os
import re
import subprocess

import pytest

from local_jobs import BIN, EXAMPLES, HERE, PYTHON_DIR, describe, not_built, run_local

PYTHON = "/usr/bin/python3"
CHECKS = os.path.join(HERE, "torch_api_checks.py")
COLLECTIVES_CHECKS = os.path.join(HERE, "torch_collectives_checks.py")
DEVICE_CHECKS = os.path.join(HERE, "torch_device_checks.py")

pytestmark = not_built


@pytest.mark.parametrize("np, extra", [(2, ()), (3, ("--processes-per-host", "2"))],
                         ids=["np2", "np3-two-hosts"])
def test_torch_api_checks(np, extra):
    r = run_local(np, PYTHON, CHECKS, extra=extra)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in range(np):
        assert re.search(rf"^\[{rank}\] torch_api_checks: rank {rank}: \d+ checks passed$",
                         r.stdout, re.M), describe(r)


@pytest.mark.parametrize("np, extra", [(2, ()), (3, ("--processes-per-host", "2"))],
                         ids=["np2", "np3-two-hosts"])
def test_torch_collectives_checks(np, extra):
    """reducescatter, alltoall, sparse allreduce, Adasum; 300 ops with every tenth an error."""
    r = run_local(np, PYTHON, COLLECTIVES_CHECKS, extra=extra)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in range(np):
        assert re.search(rf"^\[{rank}\] torch_collectives_checks: rank {rank}: \d+ checks passed$",
                         r.stdout, re.M), describe(r)


@pytest.mark.parametrize("np", [1, 2])
def test_torch_device_checks_cpu(np):
    """The checks gpu-check.sh runs on CUDA tensors, here on CPU tensors (also with one rank)."""
    r = run_local(np, PYTHON, DEVICE_CHECKS, extra=("--env", "TORCH_DEVICE_CHECKS_DEVICE=cpu"))
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in range(np):
        assert re.search(rf"^\[{rank}\] torch_device_checks: rank {rank} on cpu: \d+ checks passed$",
                         r.stdout, re.M), describe(r)


@pytest.mark.parametrize("direct", ["on", "off"])
def test_a_model_bigger_than_the_arena_trains_and_a_tensor_bigger_than_it_is_refused(direct):
    """With direct access (the default on CPU slots) tensors are reduced where they are, whatever
    their size; staged through the arena (RINGMASTER_DIRECT_ACCESS=0), one bigger than the arena
    is refused."""
    r = run_local(2, PYTHON, os.path.join(HERE, "arena_overflow_checks.py"),
                  extra=("--arena-mb", "16", "--env",
                         f"RINGMASTER_DIRECT_ACCESS={'1' if direct == 'on' else '0'}"))
    assert r.returncode == 0, describe(r)
    for rank in range(2):
        assert re.search(rf"^\[{rank}\] arena_overflow_checks: rank {rank}: ok \(\d+ of 24 "
                         rf"gradients in the arena; direct access {direct}\)",
                         r.stdout, re.M), describe(r)


FAKE_CUDA = os.path.normpath(os.path.join(BIN, "..", "fake_cuda"))


@pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA, "libcudart.so.13")),
                    reason="no fake CUDA runtime (built with CUDA only)")
def test_torch_device_checks_on_fake_gpu_slots():
    """The Python layer on GPU slots (ringmaster local --gpus) without a GPU: CPU tensors staged
    into the device arena by the client, over the fake CUDA runtime and NCCL (tests/fake_cuda)."""
    env = {**os.environ, "LD_LIBRARY_PATH": FAKE_CUDA, "FAKE_CUDA_DEVICES": "2"}
    r = subprocess.run(
        [os.path.join(BIN, "ringmaster"), "local", "--np", "2", "--gpus", "--", PYTHON,
         DEVICE_CHECKS], capture_output=True, text=True, timeout=300, cwd=HERE, env=env)
    assert r.returncode == 0, describe(r)
    for rank in range(2):
        assert re.search(rf"^\[{rank}\] torch_device_checks: rank {rank} on cpu: \d+ checks passed$",
                         r.stdout, re.M), describe(r)


@pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA, "libcudart.so.13")),
                    reason="no fake CUDA runtime (built with CUDA only)")
def test_torch_collectives_checks_on_fake_gpu_slots():
    """Process sets (each on an NCCL communicator of its members, sharing the job's stream),
    reducescatter, alltoall, sparse allreduce, Adasum and the 300 ops with deliberate errors, on
    three GPU slots over the fake CUDA runtime and NCCL."""
    env = {**os.environ, "LD_LIBRARY_PATH": FAKE_CUDA, "FAKE_CUDA_DEVICES": "3"}
    r = subprocess.run(
        [os.path.join(BIN, "ringmaster"), "local", "--np", "3", "--gpus", "--", PYTHON,
         COLLECTIVES_CHECKS], capture_output=True, text=True, timeout=400, cwd=HERE, env=env)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in range(3):
        assert re.search(rf"^\[{rank}\] torch_collectives_checks: rank {rank}: \d+ checks passed$",
                         r.stdout, re.M), describe(r)


def _visible_gpus():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU") for line in out.stdout.splitlines())


def _torch_has_cuda():
    r = subprocess.run([PYTHON, "-c", "import torch, sys; sys.exit(not torch.cuda.is_available())"],
                       capture_output=True, timeout=120)
    return r.returncode == 0


def test_torch_device_checks_cuda():
    """ctest label `gpu`: CUDA tensors through the GPU slots' whole path (one rank per GPU)."""
    gpus = _visible_gpus()
    if gpus == 0 or not _torch_has_cuda():
        pytest.skip(f"needs a GPU and a PyTorch with CUDA ({gpus} GPUs visible)")
    r = run_local(gpus, PYTHON, DEVICE_CHECKS,
                  extra=("--gpus", "--env", "TORCH_DEVICE_CHECKS_DEVICE=cuda"), timeout=300)
    assert r.returncode == 0, describe(r)
    for rank in range(gpus):
        assert re.search(rf"^\[{rank}\] torch_device_checks: rank {rank} on cuda: \d+ checks passed$",
                         r.stdout, re.M), describe(r)


def test_cnn_example_loss_goes_down(tmp_path):
    # The model rank 0 saves in its output directory comes back as the artifact rank-0/model.pt
    # (into the test's directory, not the source tree).
    r = run_local(2, PYTHON, os.path.join(EXAMPLES, "pytorch_train_cnn.py"), "--epochs", "4",
                  extra=("--artifacts-output", str(tmp_path)))
    assert r.returncode == 0, describe(r)
    assert (tmp_path / "rank-0" / "model.pt").stat().st_size > 0, describe(r)
    losses = [float(m) for m in re.findall(r"^\[0\] epoch \d+: loss ([0-9.]+)", r.stdout, re.M)]
    assert len(losses) == 4, describe(r)
    assert losses[-1] < 0.7 * losses[0], f"the loss did not go down: {losses}\n{describe(r)}"
    assert not re.search(r"^\[1\] epoch", r.stdout, re.M), "only rank 0 prints"


def test_synthetic_benchmark_runs():
    r = run_local(2, PYTHON, os.path.join(EXAMPLES, "pytorch_synthetic_benchmark.py"),
                  "--model", "small-cnn", "--batch-size", "4", "--image-size", "32",
                  "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2")
    assert r.returncode == 0, describe(r)
    assert re.search(r"^\[0\] Img/sec per CPU: [0-9.]+ \+-[0-9.]+$", r.stdout, re.M), describe(r)
    assert re.search(r"^\[0\] Total img/sec on 2 CPU\(s\): [0-9.]+", r.stdout, re.M), describe(r)


def test_init_outside_a_job_says_how_to_run():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGMASTER_")}
    env["PYTHONPATH"] = PYTHON_DIR
    r = subprocess.run(
        [PYTHON, "-c", "import ringmaster.torch as hvd\n"
                       "try:\n    hvd.init()\n"
                       "except hvd.HorovodInternalError as e:\n    print('error:', e)\n"],
        capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, describe(r)
    assert "error: ringmaster: init() failed: RINGMASTER_SOCKET is not set" in r.stdout, describe(r)
