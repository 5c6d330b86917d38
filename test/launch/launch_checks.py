#!/usr/bin/env python3
"""Launch checks and placement end to end: launch_probe under mpirun, launched right and wrong.

  launch_checks.py MPIRUN PROBE

Each case starts real ranks (timeout 60 s each) and checks what they print: where init() bound
each rank's background thread and process, or the error every rank got for a broken launch. The
expectations adapt to the machine's CPU count, so the same cases hold on 2 cores and on 64.
"""
import os
import re
import subprocess
import sys

PLACED = re.compile(r"placement rank=(\d+) gpu=(-?\d+) process=(\S+) thread=(\S+)")


def cpus(text):
    """The set of CPUs of a Linux cpulist ("0-3,8"); None where the probe could not read one."""
    if not re.fullmatch(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", text):
        return None
    result = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        result.update(range(int(first), int(last or first) + 1))
    return result


class Launch:
    def __init__(self, mpirun, probe):
        self.mpirun, self.probe = mpirun, probe
        self.failures = 0

    def run(self, name, command, env=None, succeeds=True):
        """Runs `command`, which must exit with status 0, or (succeeds=False) with another."""
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}
        full_env.update(env or {})
        full_env.setdefault("GRADSYNC_LOG_LEVEL", "info")
        print("== %s: %s" % (name, " ".join(command)), flush=True)
        done = subprocess.run(command, env=full_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60)
        print(done.stdout, end="", flush=True)
        self.expect("exit status %d %s" % (done.returncode, "0" if succeeds else "non-zero"),
                    (done.returncode == 0) == succeeds)
        placed = {int(m.group(1)): (int(m.group(2)), cpus(m.group(3)), cpus(m.group(4)))
                  for m in PLACED.finditer(done.stdout)}
        return done.stdout, placed

    def mpi(self, name, ranks, bind, env=None, wrapper=None, succeeds=True):
        exports = [a for k in sorted(env or {}) for a in ("-x", k)]
        program = (wrapper or []) + [self.probe]
        return self.run(name, [self.mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to",
                               bind] + exports + program, env, succeeds)

    def expect(self, name, condition, detail=""):
        if condition:
            print("ok: %s" % name)
        else:
            print("FAILED: %s %s" % (name, detail))
            self.failures += 1


def placement_cases(t, ncpu):
    out, placed = t.mpi("launcher binds each rank to a core", 2, "core")
    t.expect("both ranks placed", sorted(placed) == [0, 1], out)
    t.expect("one placement line per rank in the log",
             len(re.findall(r"info\] placement: rank \d \(local \d of 2\)", out)) == 2)
    if len(placed) == 2:
        trainers = placed[0][1] | placed[1][1]
        for rank, (gpu, process, thread) in placed.items():
            t.expect("rank %d without a GPU reports -1" % rank, gpu == -1)
            if thread is None:
                t.expect("rank %d's thread affinity was read" % rank, False, out)
            elif ncpu > len(trainers):
                t.expect("rank %d's thread avoids the trainers' cores" % rank,
                         not thread & trainers, "thread %s, trainers %s" % (thread, trainers))
            else:
                t.expect("rank %d's thread shares its own core when all are bound" % rank,
                         thread == process, "thread %s, process %s" % (thread, process))

    out, placed = t.mpi("unbound ranks", 2, "none")
    t.expect("both ranks placed", sorted(placed) == [0, 1], out)
    if len(placed) == 2:
        # No rank is bound, so no core is known to be free: each thread runs anywhere near its
        # rank (this node has one NUMA node), as the process does.
        for rank, (_, process, thread) in placed.items():
            t.expect("rank %d's thread is left to the scheduler" % rank, thread == process,
                     "thread %s, process %s" % (thread, process))
        t.expect("the log says why", "no rank of the node is bound" in out, out)

    if ncpu >= 2:
        out, placed = t.mpi("GRADSYNC_THREAD_AFFINITY pins each local rank", 2, "none",
                            {"GRADSYNC_THREAD_AFFINITY": "1,0"})
        t.expect("rank 0 on CPU 1, rank 1 on CPU 0",
                 placed.get(0, (0, 0, None))[2] == {1} and placed.get(1, (0, 0, None))[2] == {0},
                 str(placed))
        out, placed = t.mpi("GRADSYNC_BIND_PROCESS keeps a core for the thread", 1, "none",
                            {"GRADSYNC_BIND_PROCESS": "1"})
        t.expect("rank 0 placed", 0 in placed, out)
        if 0 in placed:
            _, process, thread = placed[0]
            t.expect("process and thread on separate cores of the node",
                     process and thread and not process & thread, str(placed))

    out, placed = t.mpi("GRADSYNC_THREAD_AFFINITY=none", 1, "none",
                        {"GRADSYNC_THREAD_AFFINITY": "none"})
    t.expect("an unbound thread keeps the process's CPUs",
             0 in placed and placed[0][2] == placed[0][1], str(placed))


def launch_check_cases(t):
    for variable in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        out, _ = t.run("a singleton the launcher (%s) counts as one of 2" % variable, [t.probe],
                       {variable: "2"}, succeeds=False)
        t.expect("init fails with how to fix it",
                 "launch check: this process is rank 0 of 1 in MPI_COMM_WORLD, but %s=2" %
                 variable in out and "srun --mpi=pmix" in out, out)

    wrapper = ["sh", "-c", '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && '
               'export OMPI_COMM_WORLD_LOCAL_SIZE=3; exec "$0"']
    out, placed = t.mpi("a rank whose launcher counts another local size", 2, "none",
                        wrapper=wrapper, succeeds=False)
    failed = re.findall(r"rank (\d) init failed: .*rank 1 is one of 3 ranks on its node, but "
                        r"MPI finds 2", out)
    t.expect("every rank fails with the same message", sorted(failed) == ["0", "1"], out)

    out, placed = t.mpi("GRADSYNC_THREAD_AFFINITY too short for the node", 2, "none",
                        {"GRADSYNC_THREAD_AFFINITY": "0"}, succeeds=False)
    failed = re.findall(r"rank (\d) init failed: .*lists CPUs for 1 local rank\(s\), but this "
                        r"node runs 2", out)
    t.expect("every rank fails, naming the variable", sorted(failed) == ["0", "1"], out)

    out, placed = t.mpi("GRADSYNC_GPU_DEVICE without a GPU", 1, "none",
                        {"GRADSYNC_GPU_DEVICE": "0"})
    t.expect("runs without a GPU", 0 in placed and placed[0][0] == -1, out)


def main(argv):
    mpirun, probe = argv
    t = Launch(mpirun, probe)
    ncpu = len(os.sched_getaffinity(0))
    placement_cases(t, ncpu)
    launch_check_cases(t)
    print("launch_checks: %d failed" % t.failures)
    return 1 if t.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
