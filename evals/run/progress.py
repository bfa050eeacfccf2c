"""Progress of one arm's task, as its reader meets it: live bars on a terminal, plain lines anywhere else.

The mode comes from QA_PROGRESS (`bars`, `lines` or `off`; `qa run` passes the one it chose to its arm
processes), else `bars` when stdout and stderr are both terminals and `lines` when either is not (a CI log,
a pipe, a file). A live bar's frames cut across lines in a log, so outside a terminal each task prints plain lines
on stderr instead: one when it starts, one every QA_PROGRESS_INTERVAL seconds (default 30) while it runs,
and one when it finishes, each with the arm, task, items done of total, items/s, elapsed and time left.
Items are counted when their chunk's records are on disk (the runner's unit of work), so between two
chunks a line repeats the count with a later elapsed time. After its first chunk a task prints one
`estimate:` line: its time in this arm, and in the QA_PROGRESS_ARMS arms that run it when that is set.
QA_PROGRESS_RUN (set by `qa run` for its first arm's process: the samples its arms have left) asks for one more,
once per process, from the first task to have a chunk on disk, in either mode: the whole run's length at that
task's rate, so a run's length is known minutes before its first arm ends.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from evals.errors import EvalError

Mode = Literal["bars", "lines", "off"]
MODES: tuple[Mode, ...] = ("bars", "lines", "off")
MODE_ENV, INTERVAL_ENV, ARMS_ENV, RUN_ENV = "QA_PROGRESS", "QA_PROGRESS_INTERVAL", "QA_PROGRESS_ARMS", "QA_PROGRESS_RUN"
DEFAULT_INTERVAL_S = 30.0  # a CI log gets a line at least twice a minute, a 5-minute task ~10 lines
# Set once this process has printed the run's length (QA_PROGRESS_RUN): one line per run, not one per task
_RUN_TOLD = threading.Event()


@dataclass(frozen=True)
class ProgressSettings:
    """How a task shows its progress: the mode, the seconds between plain lines, the arms that run it."""

    mode: Mode
    interval_s: float = DEFAULT_INTERVAL_S
    arms: int | None = None
    run_samples: int | None = None  # samples the run's arms have left (QA_PROGRESS_RUN): print the run's length


def progress_mode() -> Mode:
    """QA_PROGRESS when set (checked), else `bars` when stdout and stderr are both terminals, else `lines`."""
    raw = os.environ.get(MODE_ENV, "").strip().lower()
    if raw and raw not in MODES:
        raise EvalError(f"{MODE_ENV}={raw!r}: expected one of {', '.join(MODES)}")
    if raw:
        return raw  # type: ignore[return-value]  # one of MODES
    return "bars" if sys.stdout.isatty() and sys.stderr.isatty() else "lines"


def settings_from_env(enabled: bool = True) -> ProgressSettings:
    """The settings QA_PROGRESS, QA_PROGRESS_INTERVAL, QA_PROGRESS_ARMS and QA_PROGRESS_RUN ask for; `off` when
    not `enabled`."""
    mode = progress_mode() if enabled else "off"
    return ProgressSettings(mode, _positive(INTERVAL_ENV, float) or DEFAULT_INTERVAL_S, _positive(ARMS_ENV, int),
                            _positive(RUN_ENV, int))


def _positive(name: str, kind: type[float | int]) -> float | int | None:
    """A positive number from the environment variable `name`, None when unset; EvalError when not a number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise EvalError(f"{name}={raw!r}: expected a positive number") from None
    if value <= 0:
        raise EvalError(f"{name}={raw!r}: expected a positive number")
    return value


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS."""
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_estimate(name: str, done: int, elapsed: float, run_samples: int | None) -> str | None:
    """The whole run's length from the first `done` items of task `name` in `elapsed` seconds: the samples its
    arms have left after them (`run_samples` - `done`) at that rate, rounded up to a second. Once per process
    (None after, and when there is no rate or nothing left)."""
    left = (run_samples or 0) - done
    if left <= 0 or done <= 0 or elapsed <= 0 or _RUN_TOLD.is_set():
        return None
    _RUN_TOLD.set()
    rate = done / elapsed
    return (f"estimate: run: the first {done} items of {name} took {clock(elapsed)} ({rate:.2f} items/s): "
            f"~{clock(math.ceil(left / rate))} more for the {left} samples left in the run's arms at that rate "
            "(rough: tasks differ in cost per item; the run is estimated again after its first arm)")


class LineProgress:
    """Plain progress lines of one task (see the module docstring); thread-safe."""

    def __init__(self, name: str, total: int, settings: ProgressSettings, out: TextIO | None = None) -> None:
        self.name, self.total, self.settings = name, total, settings
        self.out = out if out is not None else sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._estimated = False
        self._ticker = threading.Thread(target=self._tick, name=f"progress {name}", daemon=True)

    def line(self, head: str = "progress") -> str:
        """One progress line: arm/task, items done of total, items/s, elapsed, time left."""
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if self.done and elapsed > 0 else None
        speed = f"{rate:.2f} items/s" if rate else "-- items/s"
        left = clock((self.total - self.done) / rate) if rate else "--"
        return (f"{head}: {self.name} {self.done}/{self.total} items, {speed}, elapsed {clock(elapsed)}, "
                f"left {left}")

    def _print(self, text: str) -> None:
        with self._lock:
            print(text, file=self.out, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            self._print(self.line())

    def __enter__(self) -> Self:
        self._print(self.line("start"))
        self._ticker.start()
        return self

    def advance(self, n: int) -> None:
        """`n` more items are on disk; after the first chunk, print the task's estimate once (and the run's, when
        asked and not told yet)."""
        self.done += n
        if not self._estimated and 0 < self.done < self.total:
            self._estimated = True
            self._print(self.estimate())
        whole = run_estimate(self.name, self.done, time.perf_counter() - self.start, self.settings.run_samples)
        if whole is not None:
            self._print(whole)

    def estimate(self) -> str:
        """The task's length from its first items' rate: in this arm, and in the arms that run it."""
        elapsed = time.perf_counter() - self.start
        whole = elapsed * self.total / self.done
        arms = self.settings.arms
        both = f", ~{clock(whole * arms)} in the {arms} arms that run it" if arms and arms > 1 else ""
        return (f"estimate: {self.name}: the first {self.done} items took {clock(elapsed)}: "
                f"~{clock(whole)} for its {self.total} items in this arm{both}")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._ticker.join()
        self._print(self.line("done" if self.done >= self.total else "stopped"))


class _RateColumn(ProgressColumn):
    """Items per second and the time left, from all items so far (chunks finish in bursts, so
    rich's windowed speed estimate would mostly be empty)."""

    def render(self, task) -> Text:  # rich passes its Task
        elapsed = task.finished_time if task.finished else task.elapsed
        if not elapsed or not task.completed:
            return Text("-- it/s  eta --:--", style="progress.data.speed")
        rate = task.completed / elapsed
        left = (task.total - task.completed) / rate if task.total is not None else 0
        return Text(f"{rate:.2f} it/s  eta {clock(left)}", style="progress.data.speed")


class _BarProgress:
    """Rich's live bar of one task (a terminal), with the run's length above it when asked."""

    def __init__(self, name: str, total: int, run_samples: int | None = None) -> None:
        self.bars = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), _RateColumn(),
                             TimeElapsedColumn(), console=Console(stderr=True), transient=False)
        self.task = self.bars.add_task(name, total=total)
        self.name, self.run_samples, self.start, self.done = name, run_samples, time.perf_counter(), 0

    def advance(self, n: int) -> None:
        """`n` more items are on disk."""
        self.bars.advance(self.task, n)
        self.done += n
        whole = run_estimate(self.name, self.done, time.perf_counter() - self.start, self.run_samples)
        if whole is not None:
            self.bars.console.print(whole, markup=False, highlight=False, soft_wrap=True)


class _NoProgress:
    def advance(self, n: int) -> None:
        """Nothing to show."""


@contextmanager
def task_progress(name: str, total: int, settings: ProgressSettings) -> Iterator[LineProgress | _BarProgress | _NoProgress]:
    """The progress display of one task (`name` is "arm/task", `total` the items it will run): `.advance(n)`."""
    if settings.mode == "off" or total == 0:
        yield _NoProgress()
    elif settings.mode == "lines":
        with LineProgress(name, total, settings) as lines:
            yield lines
    else:
        bar = _BarProgress(name, total, settings.run_samples)
        with bar.bars:
            yield bar
