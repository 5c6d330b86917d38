"""gradsyncrun's elastic mode (--min-np/--max-np): runs a job as a sequence of worlds.

Open MPI 4.1 cannot shrink or grow a running world, so the driver ends a world whose hosts
changed and starts the next on the hosts there are. The workers' side (gradsync.torch.elastic)
resumes each world from the newest durable commit. A world ends:

  - with status 0 on every rank: training returned, the job is done;
  - with EXIT_RESTART (75): the driver announced other hosts, every rank committed and left;
  - any other way: a rank or a host failed. The host of the rank that failed (as mpirun reports
    it) is left out for --cooldown seconds, and the next world starts from the last commit.

Every world but the first counts towards --reset-limit. Fewer than --min-np slots for longer
than --elastic-timeout ends the job. Each world and why it started is logged on stderr, each line
starting "gradsyncrun: HH:MM:SS.mmm".

Hosts come from --host-discovery-script (Horovod's format: one "host:slots" a line, read every
--discovery-interval seconds), a fixed host list, or the Slurm allocation. The workers poll the
driver's HTTP endpoint (GET /hosts -> {"version": N}); N grows when the usable hosts change.

The driver keeps to one job launch at a time and to mpirun's own failure handling, so that an MPI
with fault tolerance (ULFM) could later keep the survivors instead of restarting them: only
the decision "restart the world" would become "shrink the communicator".
"""

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_RESTART = 75


class ElasticError(Exception):
    """Ends the job with a message that says why."""


def log(message):
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + ".%03d" % (now % 1 * 1000)
    print("gradsyncrun: %s %s" % (stamp, message), file=sys.stderr, flush=True)


def parse_discovery_output(text, where):
    """Horovod's discovery format: 'host:slots' or 'host' (1 slot) a line; '#' comments."""
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, slots = line.partition(":")
        if slots and not re.fullmatch(r"[1-9][0-9]*", slots):
            raise ElasticError("%s, line %d: slots must be a positive whole number, got %r"
                               % (where, number, line))
        hosts.append((name, int(slots or "1")))
    return hosts


class Discovery:
    """The hosts that may run ranks now: from a script, or a fixed list."""

    def __init__(self, script=None, fixed=None):
        self.script = script
        self.fixed = fixed

    def hosts(self):
        if self.script is None:
            return list(self.fixed)
        try:
            done = subprocess.run([self.script], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            log("host discovery script %s failed: %s" % (self.script, e))
            return None
        if done.returncode != 0:
            log("host discovery script %s exited with %d: %s"
                % (self.script, done.returncode, done.stderr.strip()))
            return None
        try:
            return parse_discovery_output(done.stdout, self.script)
        except ElasticError as e:  # a bad answer is kept out, as a failed run is
            log(str(e))
            return None


class HostsEndpoint:
    """GET /hosts -> {"version": N}: what the workers' rank 0 polls."""

    def __init__(self, bind_address):
        endpoint = self
        self.version = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/hosts":
                    self.send_error(404)
                    return
                body = json.dumps({"version": endpoint.version}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((bind_address, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def address_towards(host):
    """This machine's address on the route to ``host`` (what its ranks can reach us at)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # no packet is sent: connect() on UDP only picks the route
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


class Terminated(ElasticError):
    """SIGTERM or SIGHUP reached the driver, which ended the world running then."""


# mpirun's reports of the rank that failed: a signal, or an exit status.
_SIGNALED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_EXITED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s+(\d+)")
_LOST_DAEMON = re.compile(r"[Rr]emote daemon.* on node (\S+)")
# ssh's own reports of a host it could not reach, which mpirun relays while it starts daemons.
_UNREACHABLE = re.compile(r"ssh: (?:connect to host (\S+) port \d+|Could not resolve hostname "
                          r"([^\s:]+))")


def failed_host(lines, layout):
    """The host of the rank mpirun reports as failed, and a description, from its output; the
    layout is the world's [(host, slots)], ranks placed by slot in order (mpirun's default)."""
    def host_of(rank):
        for host, slots in layout:
            if rank < slots:
                return host
            rank -= slots
        return None

    text = "\n".join(lines)
    match = _SIGNALED.search(text)
    if match:
        rank = int(match.group(1))
        return host_of(rank), "rank %d on %s was killed by signal %s" % (
            rank, host_of(rank), match.group(3))
    hosts = {host for host, _ in layout}
    for pattern, what in ((_LOST_DAEMON, "lost the launch daemon on %s"),
                          (_UNREACHABLE, "ssh could not reach %s")):
        match = pattern.search(text)
        if match:
            node = next(group for group in match.groups() if group).rstrip(".;,")
            if node in hosts:
                return node, what % node
            # Another name for one of the world's hosts (an address where discovery gave a
            # name): leaving it out would leave nothing out, and the next world would start at
            # once on the same host.
            return None, (what % node) + ", a name that is not one of this world's hosts"
    match = _EXITED.search(text)
    if match:
        rank = int(match.group(1))
        code = _EXIT_CODE.search(text, match.end())
        return host_of(rank), "rank %d on %s exited with status %s" % (
            rank, host_of(rank), code.group(1) if code else "?")
    return None, "the world ended without saying which rank failed"


# How long mpirun has to end its world after SIGTERM before its session is killed.
END_GRACE_SECONDS = 10.0


def _end_world(process):
    """Ends mpirun's session (it and the ranks it started), unless it has ended: SIGTERM, then
    SIGKILL where mpirun has not ended within END_GRACE_SECONDS (one stuck in a rank's start, or
    in a signal handler, would otherwise hold the launcher for ever)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=END_GRACE_SECONDS if sig == signal.SIGTERM else None)
        except subprocess.TimeoutExpired:
            pass


class Driver:
    def __init__(self, discovery, min_np, max_np, make_command, environ, checkpoint_dir,
                 reset_limit=None, cooldown=60.0, elastic_timeout=600.0,
                 discovery_interval=1.0):
        self.discovery = discovery
        self.min_np = min_np
        self.max_np = max_np
        self.make_command = make_command  # [(host, slots)] -> (argv, env) for mpirun
        self.environ = environ
        self.checkpoint_dir = checkpoint_dir
        self.reset_limit = reset_limit
        self.cooldown = cooldown
        self.elastic_timeout = elastic_timeout
        self.interval = discovery_interval
        self.left_out = {}  # host -> time until which it is left out
        self.last_seen = None

    def usable(self):
        """Discovered hosts minus those cooling down, or None when discovery failed."""
        hosts = self.discovery.hosts()
        if hosts is None:
            return None
        now = time.monotonic()
        return [(h, s) for h, s in hosts if self.left_out.get(h, 0) <= now]

    def layout(self, hosts):
        """At most --max-np slots of ``hosts``, in their order."""
        chosen, total = [], 0
        for host, slots in hosts:
            take = min(slots, self.max_np - total)
            if take <= 0:
                break
            chosen.append((host, take))
            total += take
        return chosen

    def wait_for_hosts(self):
        deadline = time.monotonic() + self.elastic_timeout
        while True:
            hosts = self.usable()
            if hosts is not None and sum(s for _, s in hosts) >= self.min_np:
                return hosts
            if time.monotonic() >= deadline:
                have = 0 if hosts is None else sum(s for _, s in hosts)
                raise ElasticError(
                    "only %d slots for longer than --elastic-timeout (%g s); --min-np is %d"
                    % (have, self.elastic_timeout, self.min_np))
            time.sleep(self.interval)

    def run(self):
        endpoint = None
        world, resets, unnamed = 0, 0, 0
        reason = "the job starts"

        def terminate(signum, frame):
            del frame
            raise Terminated("%s reached the launcher" % signal.Signals(signum).name)

        # mpirun runs in a session of its own (so that a failed world's whole tree can be
        # ended): a signal that ends the driver must end the world too, not leave it running.
        previous = {signum: signal.signal(signum, terminate)
                    for signum in (signal.SIGTERM, signal.SIGHUP)}
        try:
            while True:
                hosts = self.wait_for_hosts()
                layout = self.layout(hosts)
                np = sum(s for _, s in layout)
                if endpoint is None:
                    endpoint = HostsEndpoint("0.0.0.0")
                log("world %d: %d ranks on %s (%s)" % (
                    world, np, ",".join("%s:%d" % h for h in layout), reason))
                env = dict(self.environ)
                # A failed world's survivors are killed, not asked to finish: what they would
                # save is in their last commit, which a kill cannot tear (docs/elastic.md,
                # "Durability"). Open MPI otherwise waits a second after its SIGTERM, on every
                # host, before it kills.
                env.setdefault("OMPI_MCA_odls_base_sigkill_timeout", "0")
                env.update({
                    # Towards this world's first host, where rank 0 runs.
                    "GRADSYNC_ELASTIC_DRIVER": "%s:%d" % (address_towards(layout[0][0]),
                                                          endpoint.port),
                    "GRADSYNC_ELASTIC_HOSTS_VERSION": str(endpoint.version),
                    "GRADSYNC_ELASTIC_WORLD": str(world),
                    "GRADSYNC_ELASTIC_CHECKPOINT_DIR": self.checkpoint_dir,
                })
                status, lines = self.run_world(layout, env, endpoint)
                pause = 0.0
                if status == 0:
                    log("world %d: training finished" % world)
                    return 0
                if status == EXIT_RESTART:
                    reason = "the hosts changed"
                else:
                    host, what = failed_host(lines, layout)
                    reason = "world %d failed: %s" % (world, what)
                    if host is not None:
                        self.left_out[host] = time.monotonic() + self.cooldown
                        reason += "; %s left out for %g s" % (host, self.cooldown)
                        unnamed = 0
                    else:
                        # Nothing to leave out: the next world waits, longer each time, rather
                        # than start at once on what may be the same dead host.
                        unnamed += 1
                        pause = min(self.cooldown, self.interval * 2 ** unnamed)
                        reason += "; the next world starts in %g s" % pause
                log("world %d ended (status %d): %s" % (world, status, reason))
                time.sleep(pause)
                resets += 1
                if self.reset_limit is not None and resets > self.reset_limit:
                    raise ElasticError("reset limit %d reached: %s" % (self.reset_limit, reason))
                world += 1
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if endpoint is not None:
                endpoint.close()

    def run_world(self, layout, env, endpoint):
        """Runs one world to its end, announcing host changes; its status and mpirun's output."""
        argv, env = self.make_command(layout, env)
        process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True,
                                   errors="replace", start_new_session=True)
        lines = []

        def relay():
            for line in process.stderr:
                sys.stderr.write(line)
                lines.append(line.rstrip("\n"))
                del lines[:-200]

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        announced = False
        try:
            while process.poll() is None:
                try:
                    process.wait(timeout=self.interval)  # returns the moment mpirun ends
                    break
                except subprocess.TimeoutExpired:
                    pass
                if announced:
                    continue
                hosts = self.usable()
                if hosts is not None and self.layout(hosts) != layout and \
                        sum(s for _, s in hosts) >= self.min_np:
                    endpoint.version += 1
                    announced = True
                    log("hosts changed to %s: asking world's ranks to commit and restart"
                        % ",".join("%s:%d" % h for h in self.layout(hosts)))
        except BaseException:  # Ctrl-C, SIGTERM or SIGHUP, or the driver's own failure
            _end_world(process)
            raise
        reader.join(timeout=5)
        return process.returncode, lines
