"""What every benchmark's ``main(argv, prog)`` does: its argument parser (with --quick defaults and a
--phases list), the results skeleton (parameters, environment, phases, errors, failed checks), phases run
one after the other into it, the JSON written whatever happens, and the exit status.

Child processes are in ``benchmarks.processes``; tables and the closing lines in ``benchmarks.report``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import inspect
import json
import os
import platform
import sys
import time
import traceback
from typing import Callable, Iterable

from .processes import child_env, cpu_seconds


def log(msg: str) -> None:
    """A progress line on stderr, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ arguments
def parser(prog: str | None, doc: str, raw: bool = True) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first paragraph of its module docstring ``doc``."""
    return argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter if raw
                                   else argparse.HelpFormatter)


def quick_defaults(args: argparse.Namespace, defaults: dict[str, tuple]) -> None:
    """Each option of ``defaults`` (name -> (full, quick)) left unset (None) takes its full or quick value."""
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)


def phase_list(ap: argparse.ArgumentParser, spec: str, known: Iterable[str], require: bool = False) -> list[str]:
    """The comma-separated phases of ``spec``, each one of ``known`` (else a usage error); at least one
    if ``require``."""
    known = list(known)
    chosen = [x.strip() for x in spec.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown or (require and not chosen):
        ap.error(f"--phases: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    return chosen


def export_checkout() -> None:
    """This checkout first on our own PYTHONPATH: the processes started with our environment (the quorum
    nodes of a ``LocalCluster``) then run the code benchmarked here too."""
    os.environ.update({"PYTHONPATH": child_env()["PYTHONPATH"]})


# -------------------------------------------------------------------- results
def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment_info(**extra) -> dict:
    """The machine and Python of the run, then ``extra``, then the load average at the start."""
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "python_executable": sys.executable, "platform": platform.platform(), **extra,
            "loadavg_start": loadavg()}


def machine() -> dict:
    """The load average and this process's CPU seconds, now (a phase records one at its start and end)."""
    return {"loadavg": loadavg(), "bench_cpu_s": cpu_seconds(os.getpid())}


def new_results(params: dict, environment: dict | None = None, **more) -> dict:
    """The results skeleton ``run_phases`` fills: params, environment, start time, phases, errors, failed
    checks, then ``more``."""
    return {"params": params, "environment": environment_info() if environment is None else environment,
            "started_at": utc_now(), "phases": {}, "errors": [], "failed_checks": [], **more}


def write_json(res: dict, json_path: str) -> None:
    """``res`` as indented JSON to ``json_path`` (its directory made if need be)."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as fh:
        json.dump(res, fh, indent=2, default=str)


def run_phases(res: dict, phases: Iterable[tuple[str, Callable]], arg, json_path: str,
               checks: Callable[[dict], list[str]] | None = None, phase_seconds: bool = False) -> None:
    """Run each (name, fn) as ``fn(arg)`` (through ``asyncio.run`` if that gives a coroutine) into
    ``res["phases"][name]``; a phase that raises is printed and recorded in ``res["errors"]``, and the
    next one runs.  Then ``res["failed_checks"] = checks(res)`` if given.  Whatever happens, total_s,
    loadavg_end and finished_at are set and ``res`` is written as JSON to ``json_path``.
    ``phase_seconds`` adds each phase's own time as its "phase_s"."""
    t0 = time.perf_counter()
    try:
        for name, fn in phases:
            t = time.perf_counter()
            try:
                out = fn(arg)
                if inspect.iscoroutine(out):
                    out = asyncio.run(out)
                res["phases"][name] = out
                if phase_seconds:
                    out["phase_s"] = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001 - record it, go on with the next phase
                traceback.print_exc()
                res["errors"].append({"phase": name, "error": f"{type(e).__name__}: {e}"})
        if checks is not None:
            res["failed_checks"] = checks(res)
    finally:
        res["total_s"] = time.perf_counter() - t0
        res["environment"]["loadavg_end"] = loadavg()
        res["finished_at"] = utc_now()
        write_json(res, json_path)


def exit_status(res: dict) -> int:
    """1 if a phase failed or a check did not hold, else 0."""
    return 1 if res.get("errors") or res.get("failed_checks") else 0
