"""The study's scheduler: keep ``--jobs`` train.py commands running, the first pending run of the
earliest cell first, until every cell is done; a run that fails for anything but a divergence or
a signal stops the study in one line (``RunFailed``), and none is launched a third time after
failing twice the same way (docs/study.md, "The command")."""

from __future__ import annotations

import argparse
import logging
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from study.plan import Plan
from study.runner import by_signal, command, failure_reason, launch_each, stop_all
from study.state import Study, mark_failed

log = logging.getLogger("study")


def next_runs(study: Study, in_flight: set) -> list:
    """The pending runs not in flight (``in_flight``: their out_dirs) of the first cell, in the
    plan's order, that has some: cells finish one after another, so an interrupted study has
    whole comparisons, and a cell's next values wait for its runs in flight (a tuner's pending
    runs are the ones its next decision needs, whatever those in flight give). Where no cell
    has one, the runs its tuner expects to ask for next (``ahead``, study/tuner.py), so a slot
    that would idle while a line waits on its last values runs its likely finalists."""
    ahead: list = []
    for cell in study.plan.cells():
        state = study.update(cell)
        for key, flag in state.flags.items():
            if flag in ("capped", "edge") and (cell, key) not in study.warned:
                study.warned.add((cell, key))
                log.warning(
                    "!!! %s: %s %s: the best is at the search's %s",
                    flag.upper(),
                    cell.name,
                    key,
                    "cap (passes or values)" if flag == "capped" else "lattice's bound",
                )
        waiting = [r for r in state.pending if r.out_dir not in in_flight]
        if waiting:
            return waiting
        ahead += [r for r in state.ahead if r.out_dir not in in_flight]
    return ahead


def schedule(study: Study, args: Plan | argparse.Namespace) -> None:
    """Keep ``--jobs`` commands running until every cell is done (or a dry run's first batch)."""
    study.warned = set()
    study.failures = {}  # out_dir -> the reasons its commands failed, in order
    study.launched = 0
    running: dict = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        try:
            _keep_running(study, args, pool, running)
        except KeyboardInterrupt:
            # the runs in flight checkpoint and exit; the pool then closes (stopped_line's count)
            study.asked_to_stop = stop_all()
            raise
        except RunFailed:
            stop_all()  # the others checkpoint and stop; the pool waits for them
            raise
    if not study.launched and all(s.done for s in study.states.values()):
        log.info("study %s: complete, nothing to run", study.plan.out)


class RunFailed(SystemExit):
    """A run's command failed for a reason that another launch would meet again (a config, data
    or file error, a bug), or failed the same way twice: the study stops with one line."""


def failed_line(study: Study, run, rc: int, reason: str, args: argparse.Namespace) -> str:  # noqa: ANN001
    """The one line a study stops with for a failed run: the run, the reason from its output,
    where the whole output is, and the command that runs it alone."""
    import shlex

    cmd = shlex.join(command(run, launcher=args.launcher, nproc=args.nproc))
    return (f"study: run {study.run_id(run.out_dir)} failed (exit {rc}): {reason} (the whole "
            f"output: {study.plan.out / 'train.log'}); the study stopped: fix it, then run it "
            f"alone to see: {cmd}")  # fmt: skip


def _keep_running(study: Study, args: argparse.Namespace, pool, running: dict) -> None:  # noqa: ANN001
    """Start runs as slots free up, each time the first pending run of the earliest cell (read
    anew: a cell earlier in the plan that a finished run unblocked goes first, rather than a
    later cell's runs queued while it waited); account for each finished command. A command
    that fails for anything but a divergence or a stop (a signal) ends the study (RunFailed),
    and so does a run whose command failed twice the same way: never a third launch."""
    failures = getattr(study, "failures", {})
    while True:
        while len(running) < max(1, args.jobs):
            waiting = next_runs(study, {r.out_dir for _, rs in running.values() for r in rs})
            if not waiting:
                break
            run = waiting[0]
            seen = failures.get(run.out_dir, [])
            if len(seen) >= 2 and seen[-1] == seen[-2]:
                raise RunFailed(failed_line(study, run, seen[-1][0], seen[-1][1] + " (twice: "
                                            "not launched a third time)", args))  # fmt: skip
            runs = [run]
            cmd = command(run, launcher=args.launcher, nproc=args.nproc)
            cell = next(
                c for c in study.plan.cells() if study.plan.cell_dir(c) in run.out_dir.parents
            )
            fut = pool.submit(launch_each, [cmd], threads=args.threads, dry_run=args.dry_run,
                              log_file=study.plan.out / "train.log")  # fmt: skip
            study.launched = getattr(study, "launched", 0) + 1
            running[fut] = (cell, runs)
        if not running or args.dry_run:
            return
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for fut in done:
            cell, runs = running.pop(fut)
            rc, tail = fut.result()[:2]
            if rc == 0:
                continue
            reason = failure_reason(tail)
            for run in runs:
                failures.setdefault(run.out_dir, []).append((rc, reason))
            diverged = all(study.loss(r) is not None for r in runs)  # its summary says so
            if diverged or by_signal(rc):
                log.warning("a command of %s failed (exit %d: %s): its unfinished runs count as "
                            "diverged", cell.name, rc, reason)  # fmt: skip
                mark_failed(runs)
                continue
            raise RunFailed(failed_line(study, runs[0], rc, reason, args))
