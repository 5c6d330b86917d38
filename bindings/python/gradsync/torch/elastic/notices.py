"""What an elastic worker learns from its launcher (gradsyncrun --min-np/--max-np), through the
environment it starts in and the launcher's small HTTP endpoint:

  GRADSYNC_ELASTIC_CHECKPOINT_DIR  where commits are written and found (store.py)
  GRADSYNC_ELASTIC_DRIVER          host:port of the launcher; GET /hosts answers
                                   {"version": N}, N growing each time the hosts change
  GRADSYNC_ELASTIC_HOSTS_VERSION   the version this world was started with
  GRADSYNC_ELASTIC_WORLD           0 for the job's first world, then 1, 2, ... per restart

Rank 0 alone asks the launcher, from a thread of its own once a second, so a commit never waits on
the network; ``State.check_host_updates`` broadcasts its answer to the other ranks.
"""

import json
import os
import sys
import threading
import time
import urllib.request

# The exit status with which every rank leaves a world whose hosts changed, once its state is
# committed: the launcher then starts the next world at once (sysexits.h's EX_TEMPFAIL).
EXIT_RESTART = 75

_POLL_SECONDS = 1.0


def checkpoint_dir():
    return os.environ.get("GRADSYNC_ELASTIC_CHECKPOINT_DIR") or None


def world():
    return int(os.environ.get("GRADSYNC_ELASTIC_WORLD", "0"))


def under_launcher():
    return "GRADSYNC_ELASTIC_DRIVER" in os.environ


class _HostWatch:
    def __init__(self, driver, version):
        self._url = "http://%s/hosts" % driver
        self._started_with = version
        self._seen = version
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="gradsync-elastic-hosts", daemon=True).start()

    def changed(self):
        with self._lock:
            return self._seen != self._started_with

    def _run(self):
        # Straight to the launcher: an http_proxy set for the hosts' own traffic would send the
        # polls where they never reach it.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        told = False
        while True:
            try:
                with opener.open(self._url, timeout=5) as reply:
                    version = int(json.loads(reply.read().decode())["version"])
                with self._lock:
                    self._seen = version
            except Exception as error:  # http.client's errors (a reply cut short) are no OSError
                # The launcher restarts the world if it is gone; one that cannot be reached is
                # said once, since the job then never hears of other hosts.
                if not told:
                    told = True
                    print("gradsync: the elastic launcher at %s cannot be reached (%s); hosts "
                          "added or leaving go unnoticed until it can" % (self._url, error),
                          file=sys.stderr, flush=True)
            time.sleep(_POLL_SECONDS)


_watch = None
_watch_lock = threading.Lock()


def hosts_changed():
    """Whether the launcher has announced hosts other than this world's (rank 0 calls it)."""
    global _watch
    driver = os.environ.get("GRADSYNC_ELASTIC_DRIVER")
    if not driver:
        return False
    with _watch_lock:
        if _watch is None:
            _watch = _HostWatch(driver, int(os.environ.get("GRADSYNC_ELASTIC_HOSTS_VERSION", "0")))
    return _watch.changed()
