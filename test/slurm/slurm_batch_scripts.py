#!/usr/bin/env python3
"""launch/slurm's batch scripts in run_slurm.sh's single-node Slurm, with gradsyncrun --dry-run as
the program, so nothing needs building: the allocation has the tasks the submitter asked for
(--ntasks-per-node as well as --ntasks), and the scripts find gradsyncrun from a folder whose path
holds a space, or say to set GRADSYNC_LAUNCH_DIR where the job's command names no folder.

  slurm_batch_scripts.py --work DIR
"""

import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class Failure(Exception):
    pass


def submit(work, name, options, args=(), stdin=None, env=None):
    """Runs a batch job to its end; returns its output (standard output and error)."""
    out = os.path.join(work, name + ".out")
    if os.path.exists(out):
        os.unlink(out)
    command = ["sbatch", "--wait", "--output", out] + list(options) + list(args)
    with open(stdin) if stdin else open(os.devnull) as script:
        done = subprocess.run(command, stdin=script, capture_output=True, text=True,
                              env=dict(os.environ, **(env or {})))
    print("== %s: %s\n%s" % (name, " ".join(command), done.stderr), end="", flush=True)
    if not os.path.exists(out):
        raise Failure("%s: the job did not run: %s" % (name, done.stderr.strip()))
    with open(out) as f:
        text = f.read()
    print(text, flush=True)
    return text


def expect_in(needle, text, what):
    if needle not in text:
        raise Failure("%s: %r not in the job's output" % (what, needle))


def run(work):
    # The scripts and gradsyncrun as the repository has them, under a path with a space.
    launch = os.path.join(work, "a folder", "launch")
    shutil.rmtree(os.path.dirname(launch), ignore_errors=True)
    shutil.copytree(os.path.join(REPO, "launch"), launch,
                    ignore=shutil.ignore_patterns("__pycache__"))
    cpu = os.path.join(launch, "slurm", "cpu.sbatch")
    gpu = os.path.join(launch, "slurm", "gpu.sbatch")
    # The job's command is the script's path and these arguments, joined by spaces.
    dry_srun = ["--launcher", "srun", "--dry-run", "./t", "an argument"]
    # Slurm's default is one task per node; a --ntasks in the script would turn
    # --ntasks-per-node into a maximum, and ask for 2 nodes here.
    # With the node to itself and no task count, Slurm's SLURM_TASKS_PER_NODE counts its CPUs.
    for name, options, tasks in (("per-node", ["--nodes", "1", "--ntasks-per-node", "1"], 1),
                                 ("ntasks", ["--ntasks", "2"], 2),
                                 ("default", [], 1),
                                 ("exclusive", ["--exclusive"], 1)):
        text = submit(work, "cpu-" + name, options + [cpu], dry_srun)
        expect_in("srun --mpi=pmix --ntasks=%d --export=ALL ./t 'an argument'" % tasks, text,
                  "cpu.sbatch " + name)
    text = submit(work, "gpu", ["--ntasks", "2", gpu], ["--launcher", "mpirun", "--dry-run", "./t"])
    expect_in("mpirun -np 2 ", text, "gpu.sbatch")
    expect_in("-x GRADSYNC_GPU_BACKEND", text, "gpu.sbatch")
    # A script read from standard input has no path (Command=(null)); the job runs in `work`.
    text = submit(work, "stdin", [], stdin=cpu)
    expect_in("cpu.sbatch: no ./../gradsyncrun; set GRADSYNC_LAUNCH_DIR", text, "stdin")
    text = submit(work, "stdin-launch-dir", [], stdin=cpu,
                  env={"GRADSYNC_LAUNCH_DIR": os.path.dirname(cpu)})
    expect_in("gradsyncrun: no program given", text, "GRADSYNC_LAUNCH_DIR")
    print("slurm-batch-scripts: task counts as asked; gradsyncrun found or its absence explained")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    args = p.parse_args()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    try:
        run(work)
    except Failure as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
