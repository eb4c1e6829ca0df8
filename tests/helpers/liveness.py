"""Liveness for tests: a loop that stops making progress is a hang, which mutmut reads as a
timeout (a run failure, not a kill) and a plain pytest run waits on forever. `drain` fails the
test instead, within a bound far above what the work needs."""
import threading
from collections.abc import Iterable


def drain(items: Iterable, seconds: float = 60.0) -> list:
    """Everything `items` yields, iterated in a daemon thread; fails if it has not ended within
    `seconds` (the thread is left spinning until the process exits) and re-raises its error."""
    out: list = []
    error: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            out.extend(items)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            error.append(e)
        done.set()
    threading.Thread(target=run, daemon=True).start()
    assert done.wait(seconds), f"still iterating after {seconds:g} s ({len(out)} items so far): a hang"
    if error:
        raise error[0]
    return out
