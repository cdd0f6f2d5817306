"""What the framework API tests (test_torch_api.py, test_mxnet_api.py) share: where the build is,
whether the package and the workers are built, and running a command as every rank of a
`ringmaster local` job with a deadline (when it passes, `ringmaster local` is killed and its workers
and ranks die with it: PR_SET_PDEATHSIG)."""
import glob
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.abspath(os.environ.get("RINGMASTER_BIN_DIR", os.path.join(ROOT, "build", "bin")))
PYTHON_DIR = os.path.normpath(os.path.join(BIN, "..", "python"))
EXAMPLES = os.path.join(ROOT, "examples")

not_built = pytest.mark.skipif(
    not glob.glob(os.path.join(PYTHON_DIR, "ringmaster", "_ringmaster*.so"))
    or not os.path.exists(os.path.join(BIN, "ringmaster-worker")),
    reason=f"the ringmaster Python module or the workers are not built under {BIN}/..")


def run_local(np, *command, extra=(), timeout=150, env=None):
    """Runs `command` as every rank of an np-rank `ringmaster local` job (`env`: more variables in
    the caller's environment); returns the result."""
    try:
        return subprocess.run(
            [os.path.join(BIN, "ringmaster"), "local", "--np", str(np), *extra, "--", *command],
            capture_output=True, text=True, timeout=timeout, cwd=HERE,
            env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`ringmaster local --np {np}` did not finish within {timeout}s; output:\n"
                    f"{e.stdout}\n{e.stderr}")


def describe(r):
    return f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def mxnet_venv_python(*flags, imports="mxnet"):
    """The MXNet environment's python, made by the project's script (scripts/mxnet-venv.sh with
    `flags`), and "" ; or None and why it could not be made or does not import `imports`."""
    what = " ".join(("scripts/mxnet-venv.sh",) + flags)
    try:
        r = subprocess.run([os.path.join(ROOT, "scripts", "mxnet-venv.sh"), *flags],
                           capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, f"{what} did not finish within 900 s"
    if r.returncode != 0:
        return None, (f"MXNet could not be installed ({what} exited {r.returncode}): "
                      f"{r.stderr.strip()[-800:]}")
    python = r.stdout.strip().splitlines()[-1]
    r = subprocess.run([python, "-c", f"import {imports}"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        return None, f"{imports} does not import in {python}: {r.stderr.strip()[-800:]}"
    return python, ""
