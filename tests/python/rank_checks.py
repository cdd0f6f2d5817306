"""What the checks scripts that run as every rank of a job share (torch_api_checks.py,
mxnet_api_checks.py): counting checks, running a group of them so that an exception is one failure,
expecting an exception, and the closing line the tests look for."""
import os
import traceback

rank = 0  # this process's rank, for the failure lines (the script sets it after init)
_counts = {"checks": 0, "failures": 0}


def check(ok, what):
    _counts["checks"] += 1
    if not ok:
        _counts["failures"] += 1
        print(f"FAIL rank {rank}: {what}", flush=True)


def section(fn, verbose_variable):
    """Runs a group of checks; an unexpected exception is one failure (the others still run).
    With $verbose_variable set, prints the group's name first."""
    if os.environ.get(verbose_variable):
        print(f"section {fn.__name__}", flush=True)
    try:
        fn()
    except Exception:  # noqa: BLE001 - report and go on
        check(False, f"{fn.__name__} raised:\n{traceback.format_exc()}")


def raises(exc_type, fn, *contains):
    """The exception fn() raised, if it is an exc_type whose message contains every string (a
    failed check, and None, otherwise)."""
    try:
        fn()
    except exc_type as e:
        message = str(e)
        if all(c in message for c in contains):
            return e
        check(False, f"{exc_type.__name__} {message!r} lacks {contains}")
        return None
    except Exception as e:  # noqa: BLE001
        check(False, f"expected {exc_type.__name__} containing {contains}, got "
                     f"{type(e).__name__}: {e}")
        return None
    check(False, f"expected {exc_type.__name__} containing {contains}, nothing was raised")
    return None


def finish(script, where=""):
    """Prints "<script>: rank R<where>: N checks passed" (or "F of N checks failed"); returns the
    exit status."""
    if _counts["failures"]:
        print(f"{script}: rank {rank}{where}: {_counts['failures']} of {_counts['checks']} checks "
              "failed", flush=True)
        return 1
    print(f"{script}: rank {rank}{where}: {_counts['checks']} checks passed", flush=True)
    return 0
