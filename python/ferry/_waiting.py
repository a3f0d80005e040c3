"""Every blocking call of ferry's waits in slices, so Ctrl-C and signal handlers run meanwhile.

A wait inside the extension holds no GIL but cannot run Python either: a signal's handler (the
one that raises KeyboardInterrupt among them) runs only once the call returns. So each wait is
a loop of short calls (SLICE seconds at most), and Python runs pending handlers between them:
KeyboardInterrupt reaches the caller within a slice, whatever it waits for. `between` runs
after each slice that came back empty (a queue looks for children that died before arriving).
"""

import time

SLICE = 0.05  # seconds: the slowest a handler runs, and a wake-up rate nobody measures


def wait(attempt, timeout, between=None):
    """attempt(seconds) returns (done, value), waiting at most `seconds`; wait() calls it until
    done (then returns (True, value)) or until `timeout` seconds pass ((False, None)); None
    waits for ever, 0 tries once."""
    if timeout is None:
        while True:
            done, value = attempt(SLICE)
            if done:
                return True, value
            if between is not None:
                between()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        done, value = attempt(min(SLICE, max(0.0, left)))
        if done:
            return True, value
        if left <= SLICE:
            return False, None
        if between is not None:
            between()


def first_slice(timeout):
    """The wait of a first attempt made before wait(): a slice at most, as wait()'s own."""
    return SLICE if timeout is None else min(SLICE, timeout)


def left(deadline):
    """What remains until a time.monotonic() deadline (None: for ever), for wait() after a
    first attempt; 0 once it has passed, so wait() still tries once."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
