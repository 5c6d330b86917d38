#!/usr/bin/env python3
"""The elastic launcher's scenarios on namespace hosts (test/multihost/namespace_hosts.sh): a job
that loses a host mid-epoch, goes on with fewer, and grows again; the reset limit; too few slots
for too long. Needs root (namespaces); exits 77 where namespaces cannot be made.

  elastic_scenarios.py --python PY --build BUILD --work DIR [scenario ...]

Scenarios: fail-and-grow, reset-limit, min-np-timeout, libtorch-fail (the tests, run by default;
the last needs --libtorch-train), horovod-examples (Horovod's own elastic PyTorch examples, from
--horovod-examples, which this repository does not hold) and restart-cost (a measurement: a host's
failure to the new world's first step, broken down).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HOSTS_SCRIPT = os.path.join(REPO, "test", "multihost", "namespace_hosts.sh")
GRADSYNCRUN = os.path.join(REPO, "launch", "gradsyncrun")
TRAINER = os.path.join(HERE, "elastic_train.py")
HOSTS = ["10.77.0.%d" % i for i in (1, 2, 3)]


class Failure(Exception):
    pass


def wait_for(what, predicate, timeout, job=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if job is not None and job.poll() is not None:
            raise Failure("the job ended (status %d) while waiting for %s" % (job.returncode, what))
        time.sleep(0.2)
    raise Failure("timed out after %g s waiting for %s" % (timeout, what))


def events(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def commits_at(path, size):
    """Commits logged by the newest world so far, if it has `size` ranks."""
    log = events(path)
    starts = [i for i, e in enumerate(log) if e["event"] == "start"]
    if not starts or log[starts[-1]]["size"] != size:
        return 0
    return sum(1 for e in log[starts[-1]:] if e["event"] == "commit")


def kill_ranks_on(host_index, program="elastic_train.py"):
    """SIGKILLs the processes running `program` in namespace host `host_index` (0-based)."""
    listed = subprocess.run(["ip", "netns", "pids", "gs-h%d" % host_index], capture_output=True,
                            text=True, check=True).stdout.split()
    killed = []
    for pid in listed:
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if program.encode() not in f.read():
                    continue
            os.kill(int(pid), signal.SIGKILL)
            killed.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    if not killed:
        raise Failure("no trainer process found on host %d" % host_index)


class Job:
    def __init__(self, args, mca, name, hosts, launcher_flags, step_seconds, extra=(),
                 command=None):
        self.dir = os.path.join(args.work, name)
        os.makedirs(self.dir, exist_ok=True)
        # A rerun starts afresh: an earlier run's commits would let the job resume at its end.
        shutil.rmtree(os.path.join(self.dir, "commits"), ignore_errors=True)
        for stale in ("progress.jsonl", "final.pt"):
            try:
                os.unlink(os.path.join(self.dir, stale))
            except FileNotFoundError:
                pass
        self.progress = os.path.join(self.dir, "progress.jsonl")
        self.out = os.path.join(self.dir, "final.pt")
        self.hosts_file = os.path.join(self.dir, "hosts.txt")
        self.set_hosts(hosts)
        discovery = os.path.join(self.dir, "discover.sh")
        with open(discovery, "w") as f:
            f.write("#!/bin/sh\ncat %s\n" % self.hosts_file)
        os.chmod(discovery, 0o755)
        env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"),
                   GRADSYNC_STALL_WARNING_SECONDS="10", GRADSYNC_STALL_SHUTDOWN_SECONDS="30")
        command = [args.python, GRADSYNCRUN, "--host-discovery-script", discovery,
                   "--checkpoint-dir", os.path.join(self.dir, "commits"),
                   "--mpi-args", mca + " -x PYTHONPATH -x OMPI_ALLOW_RUN_AS_ROOT "
                   "-x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] + launcher_flags + \
                  (command or [args.python, TRAINER, "--progress", self.progress, "--out",
                               self.out, "--step-seconds", str(step_seconds)] + list(extra))
        self.log_path = os.path.join(self.dir, "launcher.log")
        self.log = open(self.log_path, "w")
        print("== %s: %s" % (name, " ".join(command)), flush=True)
        self.process = subprocess.Popen(command, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def set_hosts(self, hosts):
        with open(self.hosts_file + ".new", "w") as f:
            f.write("".join("%s:1\n" % h for h in hosts))
        os.replace(self.hosts_file + ".new", self.hosts_file)

    def finish(self, timeout):
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise Failure("the job did not end within %g s" % timeout)
        finally:
            if not self.log.closed:
                self.log.close()
        with open(self.log_path) as f:
            return self.process.returncode, f.read()

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def launcher_lines(text):
    return [line for line in text.splitlines() if line.startswith("gradsyncrun:")]


def expect(condition, message, text=None):
    if not condition:
        if text is not None:
            print(text[-6000:], file=sys.stderr)
        raise Failure(message)


def finished_lines(status, text, what="the job"):
    """The launcher's lines, printed, of a job that must have ended with status 0."""
    lines = "\n".join(launcher_lines(text))
    print(lines)
    expect(status == 0, "%s ended with status %d" % (what, status), text)
    return lines


def went_on_without_the_third_host(lines):
    """Whether the launcher's lines show world 0 losing the third host's rank and world 1
    finishing on the other two."""
    return ("world 0 failed: rank 2 on 10.77.0.3 was killed by signal 9" in lines and
            "world 1: 2 ranks on" in lines and "world 1: training finished" in lines)


def fail_and_grow(args, mca):
    job = Job(args, mca, "fail-and-grow", HOSTS,
              ["--min-np", "2", "--max-np", "3", "--cooldown", "2", "--reset-limit", "4",
               "--elastic-timeout", "60"], step_seconds=0.15)
    try:
        wait_for("8 commits at 3 ranks", lambda: commits_at(job.progress, 3) >= 8, 120, job.process)
        job.set_hosts(HOSTS[:2])  # the host leaves the discovery's list as its ranks die
        kill_ranks_on(2)
        wait_for("6 commits at 2 ranks", lambda: commits_at(job.progress, 2) >= 6, 120, job.process)
        job.set_hosts(HOSTS)  # and comes back
        status, text = job.finish(300)
    finally:
        job.kill()
    lines = finished_lines(status, text)
    sizes = [e["size"] for e in events(job.progress) if e["event"] == "start"]
    expect(sizes == [3, 2, 3], "worlds of %r ranks, expected [3, 2, 3]" % sizes, text)
    expect("world 0 failed: rank 2 on 10.77.0.3 was killed by signal 9" in lines,
           "the launcher did not name the failed rank and host", text)
    expect("10.77.0.3 left out for 2 s" in lines, "the failed host was not left out", text)
    expect("world 1 ended (status 75): the hosts changed" in lines,
           "the second world did not end for the hosts' change", text)
    expect("world 2: 3 ranks on" in lines and "world 2: training finished" in lines,
           "the job did not grow back to 3 ranks and finish", text)
    expect_replayed(args, job.progress, job.out)
    print("fail-and-grow: worlds of 3, 2 and 3 ranks; parameters equal the replay's")


def expect_replayed(args, progress, out):
    """The trainer's final parameters in `out` must equal those of its one-process replay of the
    steps each world committed (`progress`), to 1e-9."""
    replayed = os.path.splitext(out)[0] + "-replayed.pt"
    subprocess.run([args.python, TRAINER, "--replay", progress, "--out", replayed],
                   check=True, env=dict(os.environ, PYTHONPATH=os.path.join(args.build, "python")))
    import torch
    got, want = torch.load(out), torch.load(replayed)
    for name in want:
        difference = (got[name] - want[name]).abs().max().item()
        expect(difference < 1e-9, "parameter %s differs from the replay by %g" % (name, difference))


def reset_limit(args, mca):
    job = Job(args, mca, "reset-limit", HOSTS[:2],
              ["--min-np", "2", "--max-np", "2", "--cooldown", "0", "--reset-limit", "0"],
              step_seconds=0.15)
    try:
        wait_for("3 commits at 2 ranks", lambda: commits_at(job.progress, 2) >= 3, 120, job.process)
        kill_ranks_on(1)
        status, text = job.finish(120)
    finally:
        job.kill()
    expect(status != 0, "the job ended with status 0 after the reset limit", text)
    expect("job ended: reset limit 0 reached: world 0 failed: rank 1 on 10.77.0.2" in text,
           "the launcher did not say the reset limit ended the job", text)
    print("reset-limit: the job ended, saying why")


def min_np_timeout(args, mca):
    job = Job(args, mca, "min-np-timeout", HOSTS[:1],
              ["--min-np", "2", "--elastic-timeout", "2", "--discovery-interval", "0.5"],
              step_seconds=0)
    try:
        status, text = job.finish(60)
    finally:
        job.kill()
    expect(status != 0, "the job did not fail with too few slots", text)
    expect("only 1 slots for longer than --elastic-timeout (2 s); --min-np is 2" in text,
           "the launcher did not say why it ended", text)
    print("min-np-timeout: the job ended, saying why")


def libtorch_fail(args, mca):
    """The libtorch example as an elastic C++ trainer (gradsync/elastic.h): three hosts, the third's
    rank killed; it goes on at 2 ranks from its last commit and must end as one process trained on
    every global batch would (its --check), with identical replicas."""
    if not args.libtorch_train:
        print("libtorch-fail: skipped (no --libtorch-train)")
        return
    job = Job(args, mca, "libtorch-fail", HOSTS,
              ["--min-np", "2", "--max-np", "3", "--cooldown", "600", "--elastic-timeout", "60"],
              step_seconds=0, command=[args.libtorch_train, "--elastic", "--check", "--steps",
                                       "120", "--batch", "48", "--step-ms", "40"])
    commits = os.path.join(job.dir, "commits")

    def newest():
        names = [n for n in (os.listdir(commits) if os.path.isdir(commits) else [])
                 if n.startswith("commit-") and n.endswith(".bin")]
        return max((int(n[7:17]) for n in names), default=-1)

    try:
        wait_for("20 commits", lambda: newest() >= 20, 120, job.process)
        kill_ranks_on(2, "gradsync_libtorch_train")
        status, text = job.finish(300)
    finally:
        job.kill()
    lines = finished_lines(status, text)
    expect(went_on_without_the_third_host(lines),
           "the job did not go on at 2 ranks after the failure", text)
    expect("libtorch_train: 2 ranks, from step " in text, "the second world did not resume", text)
    expect("replicas identical" in text and "FAILED" not in text,
           "the trainer's check failed after the restart", text)
    print("libtorch-fail: the C++ trainer went on at 2 ranks and passed its check")


def launcher_time(text, what):
    """The wall-clock time (seconds since the epoch, today) of the launcher's first line holding
    `what`."""
    for line in launcher_lines(text):
        if what in line:
            clock = line.split()[1]
            day = time.strftime("%Y-%m-%d ")
            whole, _, millis = clock.partition(".")
            return time.mktime(time.strptime(day + whole, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1e3
    raise Failure("the launcher never logged %r" % what)


def restart_cost(args, mca):
    """Not a test: the time from a host's failure to the new world's first step, broken down,
    with ResNet-50's parameters as state (benchmarks: docs/benchmarks.md)."""
    ballast = os.path.join(args.data_dir, "resnet50.txt")
    job = Job(args, mca, "restart-cost", HOSTS, ["--min-np", "2", "--max-np", "3",
                                                 "--cooldown", "600", "--elastic-timeout", "60"],
              step_seconds=0.05, extra=["--ballast", ballast])
    try:
        wait_for("4 commits at 3 ranks", lambda: commits_at(job.progress, 3) >= 4, 300, job.process)
        killed_at = time.time()
        kill_ranks_on(2)
        wait_for("a commit at 2 ranks", lambda: commits_at(job.progress, 2) >= 1, 300, job.process)
    finally:
        job.kill()
        status, text = job.finish(30)
    log = events(job.progress)
    start = [e for e in log if e["event"] == "start"][-1]
    first = [e for e in log if e["event"] == "commit" and e["time"] > start["time"]][0]
    ended = launcher_time(text, "world 0 ended")
    launched = launcher_time(text, "world 1: ")
    resume = start["resume"]
    breakdown = {
        "detect_s": ended - killed_at,  # the kill until mpirun has ended the world
        "relaunch_s": launched - ended,
        "start_s": start["process_start"] - launched,  # mpirun until the rank's process runs
        "import_init_s": start["initialized"] - start["process_start"],
        "find_s": resume["find_seconds"], "load_s": resume["load_seconds"],
        "broadcast_s": resume["broadcast_seconds"],
        "first_step_s": first["time"] - start["time"],
        "total_s": first["time"] - killed_at,
    }
    print(json.dumps({"benchmark": "elastic_restart", "state": "resnet50 parameters",
                      "from_ranks": 3, "to_ranks": 2,
                      **{k: round(v, 3) for k, v in breakdown.items()}}))


def fake_mnist(root, train, test, seed=7):
    """MNIST's four idx files under root/MNIST/raw, as torchvision's datasets.MNIST reads them
    without downloading: random digits whose label sets a bright row, so that a model learns."""
    import numpy as np
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, count in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, count).astype(np.uint8)
        images = rng.integers(0, 64, (count, 28, 28)).astype(np.uint8)
        images[np.arange(count), 4 + 2 * labels, :] = 255
        with open(os.path.join(raw, prefix + "-images-idx3-ubyte"), "wb") as f:
            f.write(np.array([2051, count, 28, 28], dtype=">i4").tobytes() + images.tobytes())
        with open(os.path.join(raw, prefix + "-labels-idx1-ubyte"), "wb") as f:
            f.write(np.array([2049, count], dtype=">i4").tobytes() + labels.tobytes())


# Horovod's elastic PyTorch examples (its examples/elastic/pytorch): the script, its arguments
# here (CPU, small enough for two cores), what its output shows once the job is well under way,
# and what only its last world prints after training.
HOROVOD_EXAMPLES = [
    ("pytorch_synthetic_benchmark_elastic.py",
     ["--no-cuda", "--model", "resnet18", "--batch-size", "4", "--num-warmup-batches", "2",
      "--num-batches-per-iter", "2", "--num-iters", "8"], "Iter #2:", "Total img/sec on 2 CPU(s)"),
    ("pytorch_mnist_elastic.py",
     ["--no-cuda", "--epochs", "2", "--batch-size", "32", "--log-interval", "4"],
     "Train Epoch: 1 [256/", "Test set: Average loss"),
]


def horovod_examples(args, mca):
    """Horovod's own elastic examples, unchanged but for `import gradsync.torch as hvd`, under
    gradsyncrun in place of horovodrun (--horovod-examples: the folder holding them; they need
    torchvision). Each runs on three hosts, loses the third's rank once under way, and must finish
    on the other two from its last commit."""
    if not args.horovod_examples:
        print("horovod-examples: skipped (no --horovod-examples)")
        return
    for script, flags, under_way, finished in HOROVOD_EXAMPLES:
        name = os.path.splitext(script)[0]
        with open(os.path.join(args.horovod_examples, script)) as f:
            source = f.read()
        expect(source.count("import horovod.torch as hvd") == 1,
               "%s does not import horovod.torch as hvd once" % script)
        work = os.path.join(args.work, name)
        os.makedirs(work, exist_ok=True)
        ported = os.path.join(work, script)
        with open(ported, "w") as f:
            f.write(source.replace("import horovod.torch as hvd", "import gradsync.torch as hvd"))
        if "mnist" in script:
            fake_mnist(os.path.join(work, "data"), train=3000, test=500)
            flags = flags + ["--data-dir", os.path.join(work, "data")]
        job = Job(args, mca, name, HOSTS, ["--min-np", "2", "--max-np", "3", "--cooldown", "600",
                                           "--elastic-timeout", "60"],
                  step_seconds=0, command=[args.python, ported] + flags)

        def output():
            with open(job.log_path) as f:
                return f.read()

        try:
            wait_for("%r in its output" % under_way, lambda: under_way in output(), 300,
                     job.process)
            kill_ranks_on(2, script)
            status, text = job.finish(600)
        finally:
            job.kill()
        lines = finished_lines(status, text, script)
        expect(went_on_without_the_third_host(lines),
               "%s did not go on at 2 ranks after the failure" % script, text)
        expect(finished in text, "%s never printed %r" % (script, finished), text)
        print("horovod-examples: %s went on at 2 ranks and finished" % script)


SCENARIOS = {"fail-and-grow": fail_and_grow, "reset-limit": reset_limit,
             "min-np-timeout": min_np_timeout, "libtorch-fail": libtorch_fail,
             "horovod-examples": horovod_examples, "restart-cost": restart_cost}
TESTS = ["fail-and-grow", "reset-limit", "min-np-timeout", "libtorch-fail"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--build", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--libtorch-train", help="examples/libtorch's trainer, for libtorch-fail")
    p.add_argument("--horovod-examples",
                   help="Horovod's examples/elastic/pytorch folder, for horovod-examples")
    p.add_argument("--data-dir", default=os.path.join(REPO, "..", "shared", "data"),
                   help="gradient sets, for restart-cost")
    p.add_argument("scenarios", nargs="*", default=TESTS,
                   help="%s (default: the first four)" % ", ".join(SCENARIOS))
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    subprocess.run([HOSTS_SCRIPT, "down", "3"], check=False)
    made = subprocess.run([HOSTS_SCRIPT, "up", "3", os.path.join(args.work, "hosts")],
                          capture_output=True, text=True)
    if made.returncode != 0:
        print(made.stderr, file=sys.stderr)
        return made.returncode
    mca = made.stdout.strip().split(" --hosts ")[0]
    try:
        for name in args.scenarios:
            SCENARIOS[name](args, mca)
    except Failure as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 1
    finally:
        subprocess.run([HOSTS_SCRIPT, "down", "3"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
