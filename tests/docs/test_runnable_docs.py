"""The documentation's command sequences run as written.

Every fenced shell block of README.md and docs/*.md that is marked runnable, i.e. preceded by the line

    <!-- runnable -->            (or <!-- runnable timeout=SECONDS -->, default 240)

runs as one bash script (`set -euo pipefail`) in a scratch directory whose entries link to the
repository's (so `build/bin/...`, `examples/...` resolve and files the block writes stay out of the
tree), in a process group of its own that is killed when the block ends, passes or not, so daemons
it started in the background never outlive it. A block passes when it exits 0 within its timeout.

    /usr/bin/python3 -m pytest -q tests/docs/test_runnable_docs.py

The build is $RINGMASTER_BIN_DIR/.. (default <repo>/build).
"""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RINGMASTER_BIN_DIR", REPO / "build" / "bin")).resolve().parent
MARK = re.compile(r"^<!-- runnable(?: timeout=(\d+))? -->$")
FENCE = re.compile(r"^```(sh|bash)$")
DEFAULT_TIMEOUT = 240


def runnable_blocks():
    """(file, line, timeout, script) for every marked block."""
    blocks = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            m = MARK.match(line.strip())
            if not m:
                continue
            assert i + 1 < len(lines) and FENCE.match(lines[i + 1]), \
                f"{doc.name}:{i + 1}: a runnable mark must stand right above a ```sh fence"
            end = next(j for j in range(i + 2, len(lines)) if lines[j] == "```")
            blocks.append((doc.relative_to(REPO), i + 3, int(m[1] or DEFAULT_TIMEOUT),
                           "\n".join(lines[i + 2:end]) + "\n"))
    return blocks


BLOCKS = runnable_blocks()


def test_the_readme_and_the_docs_have_runnable_walkthroughs():
    files = {str(f) for f, *_ in BLOCKS}
    assert {"README.md", "docs/cli.md", "docs/pytorch.md"} <= files, files


def scratch_tree(tmp_path):
    """A directory whose entries link to the repository's, with `build` the build in use."""
    tmp_path.mkdir()
    for entry in REPO.iterdir():
        if entry.name in (".git", "build"):
            continue
        (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "build").symlink_to(BUILD)
    return tmp_path


def kill_group(pgid):
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


@pytest.mark.parametrize("doc,line,timeout,script", BLOCKS,
                         ids=[f"{doc}:{line}" for doc, line, *_ in BLOCKS])
def test_block_runs_as_written(doc, line, timeout, script, tmp_path):
    cwd = scratch_tree(tmp_path / "tree")
    (tmp_path / "block.sh").write_text("set -euo pipefail\n" + script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGMASTER_", "HOROVOD_"))}
    out = tmp_path / "output"
    with out.open("wb") as sink:
        p = subprocess.Popen(["bash", str(tmp_path / "block.sh")], cwd=cwd, env=env, stdout=sink,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            kill_group(p.pid)
            p.wait(10)
    text = out.read_text(errors="replace")
    assert rc is not None, f"{doc}:{line} ran over {timeout} s:\n{script}\n--- output\n{text}"
    assert rc == 0, f"{doc}:{line} exited {rc}:\n{script}\n--- output\n{text}"
