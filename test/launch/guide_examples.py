#!/usr/bin/env python3
"""Runs the examples of docs/launching.md, so that none of them can go stale.

Every ```console, ```sh or ```bash block of the guide must follow a `<!-- example: KIND -->`
comment; KIND says which test runs it: `shell` (launch_guide_examples, any machine), `slurm`
(slurm_demo_batch, inside its single-node Slurm) or `multihost` (multihost_2x2, on its namespace
hosts). In a block, lines starting with `$ ` are commands, run one after the other by bash in one
scratch folder; the other lines are output that must appear in what the commands print (standard
output and error together): anything may come before the first, each next one must follow on the
next line unless a line `...` (any lines) stands between them, and `...` inside a line matches any
text. A command must exit with status 0, or with 2 (a usage error) where its output shows
gradsyncrun's refusal (a line starting `gradsyncrun: `).

  guide_examples.py check DOC
  guide_examples.py run DOC KIND --workdir DIR [--path DIR]... [--link NAME=TARGET]...
                        [--replace OLD=NEW]...
"""
import argparse
import os
import re
import subprocess
import sys

KINDS = ("shell", "slurm", "multihost")
TAG = re.compile(r"<!--\s*example:\s*(\S+)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
EXAMPLE_LANGUAGES = ("console", "sh", "bash")


class Example:
    def __init__(self, kind, line, lines):
        self.kind, self.line = kind, line
        self.steps = []  # (command, expected output lines)
        for text in lines:
            if text.startswith("$ "):
                self.steps.append((text[2:], []))
            elif self.steps:
                self.steps[-1][1].append(text)


def parse(path):
    """The guide's examples, and the problems with its tags."""
    examples, problems = [], []
    with open(path) as f:
        lines = f.read().splitlines()
    pending = None  # (kind, line number) of the last tag not yet used
    i = 0
    while i < len(lines):
        tag = TAG.search(lines[i])
        fence = FENCE.match(lines[i])
        if tag:
            pending = (tag.group(1), i + 1)
        elif fence:
            end = i + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            if fence.group(1) in EXAMPLE_LANGUAGES:
                if pending is None:
                    problems.append("%s:%d: example without an `<!-- example: KIND -->` tag"
                                    % (path, i + 1))
                elif pending[0] not in KINDS:
                    problems.append("%s:%d: unknown example kind %r" % (path, pending[1],
                                                                       pending[0]))
                else:
                    example = Example(pending[0], i + 1, lines[i + 1:end])
                    if not example.steps:
                        problems.append("%s:%d: example without a `$ ` command" % (path, i + 1))
                    examples.append(example)
            pending = None
            i = end
        elif lines[i].strip():
            pending = pending if lines[i].lstrip().startswith("<!--") else None
        i += 1
    return examples, problems


def pattern(line):
    return re.compile(".*".join(re.escape(part) for part in line.split("...")) + r"\s*$")


def matches(expected, output):
    """Whether the expected lines appear in order in output; a line `...` skips any lines."""
    actual = output.splitlines()
    position = 0
    gap = True  # commands print banners and logs before what an example shows
    for line in expected:
        if line.strip() == "...":
            gap = True
            continue
        regex = pattern(line)
        while position < len(actual) and not regex.match(actual[position]):
            if not gap:
                return False
            position += 1
        if position == len(actual):
            return False
        position += 1
        gap = False
    return True


def run(args):
    examples, problems = parse(args.doc)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    os.makedirs(args.workdir, exist_ok=True)
    for link in args.link:
        name, _, target = link.partition("=")
        path = os.path.join(args.workdir, name)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(os.path.abspath(target), path)
    # Examples set the variables they show; none may leak in from the test's environment (PATH,
    # set below, is the one gradsyncrun forwards that every example has).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRADSYNC_", "HOROVOD_", "NCCL_"))
           and k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([os.path.abspath(p) for p in args.path] + [env.get("PATH", "")])
    chosen = [e for e in examples if e.kind == args.kind]
    if not chosen:
        print("guide_examples: no %s examples in %s" % (args.kind, args.doc), file=sys.stderr)
        return 1
    failed = 0
    for example in chosen:
        for command, expected in example.steps:
            for replacement in args.replace:
                old, _, new = replacement.partition("=")
                command = command.replace(old, new)
            print("== %s:%d: $ %s" % (args.doc, example.line, command), flush=True)
            done = subprocess.run(["bash", "-c", command], cwd=args.workdir, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=args.timeout)
            print(done.stdout, end="", flush=True)
            if not matches(expected, done.stdout):
                print("FAIL: the output lacks, in order:\n  " + "\n  ".join(expected))
                failed += 1
            refused = any(line.startswith("gradsyncrun: ") for line in expected)
            if done.returncode != (2 if refused else 0):
                print("FAIL: exit status %d, wanted %d" % (done.returncode, 2 if refused else 0))
                failed += 1
    print("guide_examples: %d %s example(s), %d failed" % (len(chosen), args.kind, failed))
    return 1 if failed else 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check")
    check.add_argument("doc")
    runner = sub.add_parser("run")
    runner.add_argument("doc")
    runner.add_argument("kind", choices=KINDS)
    runner.add_argument("--workdir", required=True)
    runner.add_argument("--path", action="append", default=[])
    runner.add_argument("--link", action="append", default=[])
    runner.add_argument("--replace", action="append", default=[])
    runner.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args(argv)
    if args.command == "check":
        examples, problems = parse(args.doc)
        print("\n".join(problems) or "%d examples, every one tagged" % len(examples))
        return 1 if problems else 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
