"""gradsyncrun's elastic driver without MPI: discovery's format, reading mpirun's failure reports,
and the world loop itself, whose worlds here are small scripts that end the way mpirun's do."""
import io
import os
import signal
import sys
import tempfile
import threading
import time
import unittest
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "launch"))
import elastic_driver as ed  # noqa: E402


class DiscoveryTest(unittest.TestCase):
    def test_horovod_format(self):
        text = "# usable now\nnode1:2\nnode2\n\nnode3:4  # big one\n"
        self.assertEqual(ed.parse_discovery_output(text, "s"),
                         [("node1", 2), ("node2", 1), ("node3", 4)])
        with self.assertRaisesRegex(ed.ElasticError, "line 1: slots"):
            ed.parse_discovery_output("node1:x\n", "s")

    def answer_of(self, body):
        """What discovery makes of a script with this body, and what it logged."""
        with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(f.name, 0o755)
        try:
            with redirect_stderr(io.StringIO()) as err:
                hosts = ed.Discovery(script=f.name).hosts()
            return hosts, err.getvalue()
        finally:
            os.unlink(f.name)

    def test_a_failing_script_gives_no_answer(self):
        hosts, log = self.answer_of("echo broken >&2\nexit 3\n")
        self.assertIsNone(hosts)
        self.assertIn("exited with 3: broken", log)

    def test_a_script_that_prints_nonsense_gives_no_answer(self):
        """As a failing one: the world running goes on, and the next waits for a good answer."""
        hosts, log = self.answer_of("echo 'WARNING: token expired'\necho node1:2\n")
        self.assertIsNone(hosts)
        self.assertIn("slots", log)


class FailedHostTest(unittest.TestCase):
    LAYOUT = [("a", 2), ("b", 1), ("c", 2)]

    def test_killed_rank(self):
        lines = ["mpirun noticed that process rank 2 with PID 4242 on node b exited on signal 9 "
                 "(Killed)."]
        self.assertEqual(ed.failed_host(lines, self.LAYOUT),
                         ("b", "rank 2 on b was killed by signal 9"))

    def test_rank_that_exited(self):
        lines = ["Primary job  terminated normally, but 1 process returned", "a non-zero exit code.",
                 "  Process name: [[5183,1],4]", "  Exit code:    1"]
        self.assertEqual(ed.failed_host(lines, self.LAYOUT),
                         ("c", "rank 4 on c exited with status 1"))

    def test_lost_daemon_and_nothing_said(self):
        lines = ["ORTE has lost communication with a remote daemon.",
                 "  Remote daemon: [[5183,0],2] on node c"]
        self.assertEqual(ed.failed_host(lines, self.LAYOUT)[0], "c")
        self.assertIsNone(ed.failed_host(["something else"], self.LAYOUT)[0])

    def test_a_host_ssh_could_not_reach(self):
        refused = ["ssh: connect to host b port 22: Connection refused",
                   "ORTE was unable to reliably start one or more daemons."]
        self.assertEqual(ed.failed_host(refused, self.LAYOUT), ("b", "ssh could not reach b"))
        unknown = ["ssh: Could not resolve hostname c: Name or service not known"]
        self.assertEqual(ed.failed_host(unknown, self.LAYOUT)[0], "c")

    def test_a_node_named_otherwise_than_the_worlds_hosts_names_none(self):
        # Left out under that name, the host would stay in the next world, started at once.
        lines = ["  Remote daemon: [[5183,0],2] on node 10.0.0.3"]
        host, what = ed.failed_host(lines, self.LAYOUT)
        self.assertIsNone(host)
        self.assertIn("10.0.0.3, a name that is not one of this world's hosts", what)


def world_script(body):
    """A stand-in for mpirun: a Python program that does `body` (given the world number)."""
    return [sys.executable, "-c", "import os, sys\nworld = int(os.environ['GRADSYNC_ELASTIC_WORLD'])"
            "\n" + body]


class DriverTest(unittest.TestCase):
    def driver(self, hosts, body, **kwargs):
        self.layouts = []

        def make_command(layout, env):
            self.layouts.append(layout)
            return world_script(body), env

        settings = dict(min_np=2, max_np=3, cooldown=30.0, elastic_timeout=2.0,
                        discovery_interval=0.05)
        settings.update(kwargs)
        return ed.Driver(ed.Discovery(fixed=hosts), settings.pop("min_np"), settings.pop("max_np"),
                         make_command, dict(os.environ), "/unused", **settings)

    def run_driver(self, driver):
        with redirect_stderr(io.StringIO()) as err:
            try:
                status = driver.run()
            except ed.ElasticError as e:
                status = str(e)
        return status, err.getvalue()

    def test_a_failed_host_is_left_out_and_the_job_goes_on(self):
        body = ("if world == 0:\n"
                "    print('mpirun noticed that process rank 2 with PID 7 on node h3 exited on "
                "signal 9 (Killed).', file=sys.stderr)\n"
                "    sys.exit(137)\n")
        driver = self.driver([("h1", 1), ("h2", 1), ("h3", 1), ("h4", 1)], body)
        status, log = self.run_driver(driver)
        self.assertEqual(status, 0, log)
        self.assertEqual(self.layouts, [[("h1", 1), ("h2", 1), ("h3", 1)],
                                        [("h1", 1), ("h2", 1), ("h4", 1)]])
        self.assertIn("world 0 failed: rank 2 on h3 was killed by signal 9; h3 left out for 30 s",
                      log)
        self.assertIn("world 1: training finished", log)

    def test_hosts_that_change_are_announced_and_the_world_restarts(self):
        # World 0 adds a host to the discovery's file, then waits, as rank 0 does, for the
        # driver's endpoint to announce it, and leaves with the restart status.
        with tempfile.TemporaryDirectory() as work:
            listing = os.path.join(work, "hosts")
            with open(listing, "w") as f:
                f.write("h1\nh2\n")
            script = os.path.join(work, "discover.sh")
            with open(script, "w") as f:
                f.write("#!/bin/sh\ncat %s\n" % listing)
            os.chmod(script, 0o755)
            body = ("import json, time, urllib.request\n"
                    "if world == 0:\n"
                    "    open(%r, 'a').write('h3\\n')\n"
                    "    url = 'http://%%s/hosts' %% os.environ['GRADSYNC_ELASTIC_DRIVER']\n"
                    "    for _ in range(200):\n"
                    "        if json.load(urllib.request.urlopen(url))['version'] > 0:\n"
                    "            sys.exit(75)\n"
                    "        time.sleep(0.05)\n"
                    "    sys.exit(1)\n" % listing)
            driver = self.driver([], body)
            driver.discovery = ed.Discovery(script=script)
            status, log = self.run_driver(driver)
        self.assertEqual(status, 0, log)
        self.assertEqual(self.layouts, [[("h1", 1), ("h2", 1)],
                                        [("h1", 1), ("h2", 1), ("h3", 1)]])
        self.assertIn("world 0 ended (status 75): the hosts changed", log)

    def test_a_world_that_ends_is_seen_at_once_not_after_the_interval(self):
        driver = self.driver([("h1", 2)], "sys.exit(0)", discovery_interval=60.0)
        started = time.monotonic()
        status, log = self.run_driver(driver)
        self.assertEqual(status, 0, log)
        self.assertLess(time.monotonic() - started, 30.0)

    def test_a_failed_world_is_killed_without_a_grace_period_unless_the_user_set_one(self):
        body = "print(os.environ.get('OMPI_MCA_odls_base_sigkill_timeout'), file=sys.stderr)"
        status, log = self.run_driver(self.driver([("h1", 2)], body))
        self.assertEqual(status, 0, log)
        self.assertIn("\n0\n", "\n" + log)
        driver = self.driver([("h1", 2)], body)
        driver.environ["OMPI_MCA_odls_base_sigkill_timeout"] = "5"
        status, log = self.run_driver(driver)
        self.assertIn("\n5\n", "\n" + log)

    def test_reset_limit(self):
        driver = self.driver([("h1", 2)], "sys.exit(1)", reset_limit=1, cooldown=0.0)
        status, log = self.run_driver(driver)
        self.assertIn("reset limit 1 reached: world 1 failed", status)
        self.assertEqual(len(self.layouts), 2)

    def test_a_failure_that_names_no_host_delays_the_next_world_longer_each_time(self):
        driver = self.driver([("h1", 2)], "sys.exit(1)", reset_limit=2, cooldown=30.0,
                             discovery_interval=0.05)
        status, log = self.run_driver(driver)
        self.assertIn("reset limit 2 reached", status)
        self.assertIn("without saying which rank failed; the next world starts in 0.1 s", log)
        self.assertIn("without saying which rank failed; the next world starts in 0.2 s", log)

    def test_sigterm_to_the_launcher_ends_the_world(self):
        self.end_the_world_on_sigterm("")

    def test_a_world_that_ignores_sigterm_is_killed_after_the_grace(self):
        grace = ed.END_GRACE_SECONDS
        ed.END_GRACE_SECONDS = 0.5
        try:
            self.end_the_world_on_sigterm("import signal\n"
                                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n")
        finally:
            ed.END_GRACE_SECONDS = grace

    def end_the_world_on_sigterm(self, prologue):
        with tempfile.TemporaryDirectory() as work:
            pid_file = os.path.join(work, "pid")
            body = (prologue + "open(%r, 'w').write(str(os.getpid()))\n"
                    "import time\n"
                    "time.sleep(60)\n" % pid_file)
            driver = self.driver([("h1", 2)], body)

            def send_sigterm():
                deadline = time.monotonic() + 20
                while not os.path.exists(pid_file) and time.monotonic() < deadline:
                    time.sleep(0.02)
                os.kill(os.getpid(), signal.SIGTERM)

            threading.Thread(target=send_sigterm, daemon=True).start()
            started = time.monotonic()
            status, _ = self.run_driver(driver)
            self.assertEqual(status, "SIGTERM reached the launcher")
            self.assertLess(time.monotonic() - started, 30.0)
            with open(pid_file) as f:
                world = int(f.read())
            with self.assertRaises(ProcessLookupError):  # ended and reaped, not left running
                os.kill(world, 0)
        self.assertIs(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)

    def test_too_few_slots_for_too_long(self):
        driver = self.driver([("h1", 1)], "sys.exit(0)", elastic_timeout=0.2)
        status, _ = self.run_driver(driver)
        self.assertEqual(status, "only 1 slots for longer than --elastic-timeout (0.2 s); "
                                 "--min-np is 2")
        self.assertEqual(self.layouts, [])


if __name__ == "__main__":
    unittest.main()
