"""The commands `pip install` puts on PATH: each runs the binary shipped in ringmaster/bin."""
import os
import sys

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _run(name):
    path = os.path.join(_BIN, name)
    if not os.path.exists(path):
        sys.exit(f"{name}: not found in {_BIN}: this ringmaster package was not installed with "
                 f"pip (a build tree has it in build/bin)")
    os.execv(path, [path] + sys.argv[1:])


def ringmaster():
    _run("ringmaster")


def worker():
    _run("ringmaster-worker")


def coordinator():
    _run("ringmaster-coordinator")
