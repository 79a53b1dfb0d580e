"""torchrun with one race in its agent closed: ``python -m helpers.torchrun`` takes its arguments.

When a rank dies, its peers' collectives fail ("Connection closed by peer"), and ``@record``
starts writing each peer's error file. Meanwhile torchrun's agent stops the peers with SIGTERM
and reads every stopped rank's error file. A peer stopped between opening its file and closing
it leaves the file empty; the agent (torch 2.14, ``ProcessFailure.__post_init__``) then fails
on the JSON itself, and ``--max-restarts`` restarts nothing: the job ends with
``json.decoder.JSONDecodeError`` instead of resuming. It is rare on an idle machine and
common on a loaded one (two classmates' jobs on 2 cores).

Here the agent sets a half-written error file aside (``error.json.half-written``) and reports
that rank by its exit code, as it does for any rank that wrote no file. Everything else is
torchrun, unchanged.

Run as a command, it also keeps a Ctrl-C that arrives while torch is imported for the first time
(seconds): Python's default handler would raise it somewhere inside torch's import, where it
can be lost or end in a C++ ``terminate``. The interrupt is noted until the import is done, and
then ends the command before anything starts.
"""

import signal
import sys

_interrupted: list[int] = []
if __name__ == "__main__":  # before the heavy import below, never in a process that imports us
    signal.signal(signal.SIGINT, lambda signum, _frame: _interrupted.append(signum))

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure  # noqa: E402
from torch.distributed.run import main  # noqa: E402

from helpers.messages import _  # noqa: E402

HALF_WRITTEN = ".half-written"
_read_error_file = ProcessFailure.__post_init__


def set_aside_if_half_written(error_file: str) -> bool:
    """Rename an error file that holds no whole JSON; True if it did (the rank is dead by now)."""
    path = Path(error_file)
    if not path.is_file():
        return False
    try:
        json.loads(path.read_text(errors="replace"))
        return False
    except ValueError:
        path.replace(path.with_name(path.name + HALF_WRITTEN))
        return True


def _read_whole_error_file(failure: ProcessFailure) -> None:
    if set_aside_if_half_written(failure.error_file):
        print(
            f"helpers.torchrun: local rank {failure.local_rank} was stopped while writing "
            f"its error file; it counts as a rank that wrote none ({failure.error_file})",
            file=sys.stderr,
            flush=True,
        )
    _read_error_file(failure)


ProcessFailure.__post_init__ = _read_whole_error_file  # type: ignore[method-assign]

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here, torchrun's own
    if _interrupted:
        print(
            _(
                "helpers.torchrun: interrupted (Ctrl-C) while it imported torch; nothing was "
                "started."
            ),
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + signal.SIGINT)
    main()
