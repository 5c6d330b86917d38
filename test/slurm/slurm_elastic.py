#!/usr/bin/env python3
"""Elastic training under Slurm, in run_slurm.sh's single-node Slurm: launch/slurm/cpu.sbatch runs
gradsyncrun --min-np 2 --max-np 2 with test/elastic's trainer on the allocation's two tasks; one
rank is killed mid-epoch; the job must restart inside its allocation (its one node comes back after
the cool-down), finish, say so in its log, and end with the parameters of its one-process replay.

  slurm_elastic.py --python PY --build BUILD --work DIR
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "test", "elastic"))

from elastic_scenarios import (TRAINER, Failure, commits_at, expect, expect_replayed,  # noqa: E402
                               launcher_lines, wait_for)


def trainer_pids(progress):
    """This job's trainer processes: an interpreter running the trainer with this job's progress
    log (the launcher's and mpirun's command lines name both too)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[1:2] == [TRAINER.encode()] and progress.encode() in argv:
            pids.append(int(pid))
    return pids


def job_running(job_id):
    listed = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
    return listed.returncode == 0 and listed.stdout.strip() != ""


def run(args):
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    progress, out = os.path.join(work, "progress.jsonl"), os.path.join(work, "final.pt")
    log = os.path.join(work, "elastic.out")
    commits = os.path.join(work, "commits")
    # A rerun starts afresh: an earlier run's commits would let the job resume at its end.
    shutil.rmtree(commits, ignore_errors=True)
    for stale in (progress, out, log):
        if os.path.exists(stale):
            os.unlink(stale)
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"),
               GRADSYNC_STALL_WARNING_SECONDS="10", GRADSYNC_STALL_SHUTDOWN_SECONDS="30")
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--ntasks", "2", "--output", log,
         os.path.join(REPO, "launch", "slurm", "cpu.sbatch"),
         "--min-np", "2", "--max-np", "2", "--cooldown", "1", "--reset-limit", "3",
         "--elastic-timeout", "60", "--checkpoint-dir", commits,
         "--mpi-args", "-x PYTHONPATH",
         args.python, TRAINER, "--progress", progress, "--out", out, "--step-seconds", "0.1"],
        env=env, capture_output=True, text=True)
    expect(submitted.returncode == 0, "sbatch failed: %s" % submitted.stderr.strip())
    job_id = submitted.stdout.strip().split(";")[0]
    print("== Slurm job %s" % job_id, flush=True)
    try:
        wait_for("6 commits at 2 ranks", lambda: commits_at(progress, 2) >= 6, 180)
        victims = trainer_pids(progress)
        expect(len(victims) == 2, "expected 2 trainer processes, found %r" % victims)
        os.kill(max(victims), signal.SIGKILL)
        wait_for("the job's end", lambda: not job_running(job_id), 300)
    finally:
        if job_running(job_id):
            subprocess.run(["scancel", job_id], check=False)
    with open(log) as f:
        text = f.read()
    lines = "\n".join(launcher_lines(text))
    print(lines)
    expect("world 0 failed: rank " in lines and "was killed by signal 9" in lines,
           "the launcher did not name the killed rank", text)
    expect("world 1: 2 ranks on" in lines and "world 1: training finished" in lines,
           "the job did not restart on its allocation and finish", text)
    expect_replayed(args, progress, out)
    print("slurm-elastic: restarted inside the allocation; parameters equal the replay's")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--build", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    try:
        run(args)
    except Failure as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
