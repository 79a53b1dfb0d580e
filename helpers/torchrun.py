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
"""

import json
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.run import main

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
    main()
