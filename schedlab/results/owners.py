"""Whether the process that owns a temporary file or folder still exists.

A run killed outright (SIGKILL, the out-of-memory killer, a power cut) cannot remove what it
was writing. Its temporary files and folders carry its process id in their names, so a later
run can tell what was abandoned: an owner that no longer exists. A process id is meaningful on
one machine only, and may be reused: a live process with that id keeps the file until it ends.
"""

from __future__ import annotations

import os


def owner_gone(pid: int) -> bool:
    """True only when no process ``pid`` exists on this machine (POSIX). A zombie, or another
    user's process, counts as alive; elsewhere than POSIX (where ``os.kill(pid, 0)`` would end the
    process instead of asking about it) every owner counts as alive."""
    if os.name != "posix" or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)  # (signal 0: only asks)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):  # someone else's process; or no pid we can ask about
        return False
    return False
