"""Run on 2 ranks by pip_install_test.sh: the installed gradsync works, and nothing else is used."""

import importlib.metadata
import os
import sys
import sysconfig

source_dir = os.path.realpath(sys.argv[1])

import torch  # noqa: E402

import gradsync  # noqa: E402
import gradsync.torch as hvd  # noqa: E402

package_dir = os.path.dirname(os.path.realpath(gradsync.__file__))
site_packages = os.path.realpath(sysconfig.get_paths()["platlib"])


def check(condition, message):
    if not condition:
        print("check_installed: " + message, file=sys.stderr, flush=True)
        sys.exit(1)


check(package_dir == os.path.join(site_packages, "gradsync"),
      "gradsync imported from %s, not from %s" % (package_dir, site_packages))
# The build folder may sit inside the source tree, and the venv inside it: what matters is that
# the package came from the venv's site-packages, not the sources or the build tree's python/.
check(package_dir != os.path.join(source_dir, "bindings", "python", "gradsync"),
      "gradsync imported from the source tree (%s)" % package_dir)
check(importlib.metadata.version("gradsync") == gradsync.__version__,
      "installed version %s, gradsync.__version__ %s"
      % (importlib.metadata.version("gradsync"), gradsync.__version__))

# _core found libgradsync.so beside it ($ORIGIN), not in a build folder.
with open("/proc/self/maps") as maps:
    libraries = {line.split()[-1] for line in maps if "libgradsync" in line}
check(libraries == {os.path.join(package_dir, "libgradsync.so")},
      "libgradsync loaded from %s" % sorted(libraries))

# The wheel holds the package and its metadata only: no headers, CMake files or lib/ folder.
stray = [str(f) for f in importlib.metadata.files("gradsync")
         if f.parts[0] != "gradsync" and not f.parts[0].endswith(".dist-info")]
check(not stray, "the wheel installed files outside the package: %s" % stray)

hvd.init()
rank = hvd.rank()
check(hvd.size() == 2, "size %d, expected 2" % hvd.size())
total = hvd.allreduce(torch.ones(3) * (rank + 1), op=hvd.Sum, name="package.sum")
check(torch.equal(total, torch.full((3,), 3.0)), "allreduce sum gave %s" % total)
mean = hvd.allreduce(torch.ones(3) * rank, name="package.average")
check(torch.equal(mean, torch.full((3,), 0.5)), "allreduce average gave %s" % mean)
hvd.shutdown()
print("check_installed: rank %d: gradsync %s from %s: ok"
      % (rank, gradsync.__version__, package_dir), flush=True)
