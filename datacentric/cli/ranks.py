"""One line per mistake, not one per rank.

Under torchrun every rank runs the whole command, so a configuration error (a bad flag,
a missing file, data that cannot be trained) or a note is found by every rank at once.
The first rank of a machine to say a line claims it (a marker file named by the line,
created exclusively in torchrun's own folder of this launch and attempt); the others
stay silent and exit with the same status, and torchrun then reports that the job
failed, which is its convention. A line that differs between ranks (one naming its
rank) is said by each; on several machines each machine that sees a line says it once.
Outside torchrun there is one process, and it says everything. No torch is imported here.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from pathlib import Path


def first_to_say(line: str) -> bool:
    """Whether this process says ``line``: always outside torchrun; under it, only the
    first rank of this machine to ask for the same line in this attempt of the job."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file or "RANK" not in os.environ:
        return True
    # torchrun's folder of this launch and attempt, shared by the machine's ranks
    # (<log dir>/<run id>_<random>/attempt_N/<local rank>/error.json)
    attempt = Path(error_file).parents[1]
    marker = attempt / f"said-{hashlib.sha256(line.encode()).hexdigest()[:24]}"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True  # no marker can be made: better twice than never
    return True


def torchrun_world() -> int | None:
    """torchrun's ``WORLD_SIZE`` when this process runs under torchrun (its ``RANK`` and
    ``WORLD_SIZE`` set, as ``parallel.groups.under_torchrun`` reads them, without
    importing torch), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return None


def node_host() -> str | None:
    """This machine's host name where the job spans several nodes under torchrun (its
    ``LOCAL_WORLD_SIZE`` below ``WORLD_SIZE``), else None: a refusal of what one node
    lacks names it, as a launcher that merges the nodes' logs (``srun``) does not."""
    world, local = torchrun_world(), os.environ.get("LOCAL_WORLD_SIZE")
    if world is None or local is None or int(local) >= world:
        return None
    return socket.gethostname()


def ranks_that_run(world: int | None) -> int:
    """The ranks a job started by ``datacentric`` runs on: torchrun's world under
    torchrun (a ``world`` that differs is refused when the ranks start, as
    ``parallel.launch.launch_mode`` decides), else ``world`` (one without it)."""
    return torchrun_world() or world or 1


def command_world(given: int | None, default: int) -> int:
    """The world of a command that starts its own local ranks outside torchrun (``bench``,
    ``demo``): ``--world`` when given (under torchrun one other than its ``WORLD_SIZE`` is
    refused when the ranks start), else torchrun's world under torchrun, else the
    command's ``default``."""
    if given is not None:
        return given
    return torchrun_world() or default


def refuse_under_torchrun(command: str, fix: str) -> bool:
    """For a command that starts its own ranks on this machine and cannot join torchrun's:
    under torchrun, say ``datacentric <command>: ...`` (once per job) naming torchrun's
    world and ``fix``, and return True (the caller exits with status 2); else False."""
    world = torchrun_world()
    if world is None:
        return False
    say(
        command,
        f"runs under torchrun (WORLD_SIZE={world}) but starts its own --world ranks on this "
        f"machine, so each of torchrun's processes would start them again; {fix}",
    )
    return True


def say(command: str | None, message: str) -> None:
    """Print ``datacentric <command>: <message>`` on stderr, once per job under torchrun."""
    where = f"datacentric {command}" if command else "datacentric"
    line = f"{where}: {message}"
    if first_to_say(line):
        print(line, file=sys.stderr)


def announce(command: str, message: str, *, json_output: bool = False) -> None:
    """A long command's first line, ``datacentric <command>: <message>`` (what it will do
    and what it waits for first), said on stdout before its heavy imports so that it
    comes within a second or two; stderr keeps one line per failure. Nothing with
    ``json_output`` (stdout is then the JSON's, and a script reads it). Once per job
    under torchrun."""
    line = f"datacentric {command}: {message}"
    if not json_output and first_to_say(line):
        print(line, flush=True)
