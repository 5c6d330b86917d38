#!/usr/bin/env python3
"""Scaling run: gradient synchronization of real models' gradient sets at 1, 2, 4, ... ranks.

Each layout runs gradsync_bench_models through gradsyncrun (so -H, --hostfile, --mpi-args and
every gradsync setting work as they do for a job), and its rows are added to a results file.
`report` turns that file into a Markdown table and a PNG plot.

  scaling.py run --bench PATH --ranks 1,2,4,8 [--series NAME] [--sets resnet50,bert_base]
                 [--iters N] [--warmup N] [--data-dir DIR] [--results FILE]
                 [-- gradsyncrun flags: -H host:slots,... | --hostfile F, --mpi-args "...", ...]
  scaling.py report [--results FILE] [--compute-ms MS] [--markdown FILE] [--plot FILE]

What is reported, per set and layout:
  sync_ms     median time to synchronize every gradient of one step (the slowest rank's)
  flat_ms     one MPI_Allreduce of the same bytes in one buffer, measured in the same run
  busbw       bus bandwidth of the step, bytes * 2(n-1)/n / sync time, GB/s (1e9 bytes)
  step_ms     compute_ms + sync_ms: a step whose backward does not overlap communication
  efficiency  step_ms at 1 rank / step_ms at n ranks (weak scaling: the batch per rank is fixed)
compute_ms is the time one rank spends on forward and backward; measure it for your model and
hardware and pass it with --compute-ms (the same for every set, or SET=MS,...).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GRADSYNCRUN = os.path.join(HERE, "..", "..", "launch", "gradsyncrun")
DEFAULT_RESULTS = "scaling-results.json"
DEFAULT_COMPUTE_MS = 100.0


# gradsync_bench_models's chunked and pipelined raw strategies, by column.
CHUNKED_COLUMNS = ("chunk1M_ms", "chunk4M_ms", "chunk16M_ms", "chunk64M_ms", "pipe1M_ms",
                   "pipe4M_ms", "pipe16M_ms")


def parse_bench_output(text):
    """Rows of gradsync_bench_models's table, read by its header's column names:
    {set: {tensors, mb, sync_ms, per_tensor_ms, flat_copy_ms, bucketed_ms, flat_ms, and the
    chunked and pipelined strategies' chunk1M_ms ... pipe16M_ms}}, with None for a strategy that
    did not run ("-"). Several tables may follow one another: a set's later
    row replaces the values it has (a rerun of some strategies with more iterations)."""
    keys = {"tensors": "tensors", "MB": "mb", "gradsync_ms": "sync_ms",
            "pertens_ms": "per_tensor_ms", "flatcpy_ms": "flat_copy_ms",
            "bucket_ms": "bucketed_ms", "flat_ms": "flat_ms"}
    keys.update({name: name for name in CHUNKED_COLUMNS})
    rows, header = {}, None
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "set":
            header = words
            continue
        if header is None or len(words) != len(header):
            continue
        try:
            row = {}
            for name, value in zip(header[1:], words[1:]):
                if name in keys:
                    row[keys[name]] = None if value == "-" else float(value)
            row["tensors"] = int(row["tensors"])
        except (KeyError, TypeError, ValueError):
            continue
        merged = rows.setdefault(words[0], {})
        merged.update({k: v for k, v in row.items() if v is not None or k not in merged})
    return rows


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def run_layouts(args, launch_flags):
    results = load(args.results)
    for ranks in args.ranks:
        command = [sys.executable, GRADSYNCRUN, "-np", str(ranks)] + launch_flags + \
            [args.bench, "--sets", args.sets, "--iters", str(args.iters),
             "--warmup", str(args.warmup)]
        if args.data_dir:
            command += ["--data-dir", args.data_dir]
        print("scaling: " + " ".join(shlex.quote(w) for w in command), file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            print("scaling: the run at %d ranks failed (exit %d)" % (ranks, done.returncode),
                  file=sys.stderr)
            return 1
        rows = parse_bench_output(done.stdout)
        if not rows:
            sys.stderr.write(done.stdout)
            print("scaling: no result rows at %d ranks" % ranks, file=sys.stderr)
            return 1
        results = [r for r in results if not (r["series"] == args.series and r["ranks"] == ranks)]
        for name, row in rows.items():
            results.append(dict(row, series=args.series, ranks=ranks, set=name))
        with open(args.results, "w") as f:
            json.dump(results, f, indent=1)
        print("scaling: %s at %d ranks: %s" % (args.series, ranks, ", ".join(
            "%s %.1f ms" % (n, r["sync_ms"]) for n, r in sorted(rows.items()))), file=sys.stderr)
    return 0


def compute_times(text, sets):
    """'120' -> every set 120 ms; 'resnet50=120,bert_base=300' -> per set (others: default)."""
    if "=" not in text:
        return {s: float(text) for s in sets}
    times = {s: DEFAULT_COMPUTE_MS for s in sets}
    for item in text.split(","):
        name, _, value = item.partition("=")
        times[name.strip()] = float(value)
    return times


def derive(results, compute):
    """Adds busbw, step_ms and efficiency (against the 1-rank row of the same set)."""
    one_rank = {}
    for r in results:
        if r["ranks"] == 1:
            one_rank.setdefault(r["set"], r)
    rows = []
    for r in sorted(results, key=lambda r: (r["set"], r["series"], r["ranks"])):
        row = dict(r)
        n = r["ranks"]
        seconds = r["sync_ms"] / 1e3
        row["busbw"] = r["mb"] * 1e6 * 2 * (n - 1) / n / seconds / 1e9 if n > 1 and seconds else 0
        row["step_ms"] = compute[r["set"]] + r["sync_ms"]
        base = one_rank.get(r["set"])
        row["efficiency"] = (compute[r["set"]] + base["sync_ms"]) / row["step_ms"] if base else None
        rows.append(row)
    return rows


def markdown(rows, compute):
    lines = ["| set | layout | ranks | sync ms | flat MPI ms | busbw GB/s | step ms | efficiency |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eff = "%.1f%%" % (100 * r["efficiency"]) if r["efficiency"] is not None else "-"
        lines.append("| %s | %s | %d | %.2f | %.2f | %.2f | %.1f | %s |" % (
            r["set"], r["series"], r["ranks"], r["sync_ms"], r["flat_ms"], r["busbw"],
            r["step_ms"], eff))
    lines.append("")
    lines.append("step = compute + sync with compute per step: " + ", ".join(
        "%s %g ms" % (s, ms) for s, ms in sorted(compute.items())) + ".")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (sync_axis, eff_axis) = plt.subplots(1, 2, figsize=(13, 4.6))
    # One colour per gradient set, one marker and line style per layout, so that a set's layouts
    # read as one family.
    sets = sorted({r["set"] for r in rows})
    layouts = sorted({r["series"] for r in rows}, key=lambda s: (s != "1 host", s))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = [("o", "-"), ("s", "--"), ("D", ":"), ("^", "-."), ("v", "--"), ("P", ":")]
    for name, series in sorted({(r["set"], r["series"]) for r in rows}):
        points = sorted((r["ranks"], r) for r in rows if r["set"] == name and r["series"] == series)
        ranks = [n for n, _ in points]
        marker, line = styles[layouts.index(series) % len(styles)]
        look = dict(marker=marker, linestyle=line, color=colours[sets.index(name) % len(colours)],
                    label="%s, %s" % (name, series))
        sync_axis.plot(ranks, [r["sync_ms"] for _, r in points], **look)
        eff = [(n, r["efficiency"]) for n, r in points if r["efficiency"] is not None]
        eff_axis.plot([n for n, _ in eff], [100 * e for _, e in eff], **look)
    all_ranks = sorted({r["ranks"] for r in rows})
    for axis in (sync_axis, eff_axis):
        axis.set_xscale("log", base=2)
        axis.set_xticks(all_ranks)
        axis.set_xticklabels([str(n) for n in all_ranks])
        axis.minorticks_off()
        axis.set_xlabel("ranks")
        axis.grid(True, alpha=0.3)
    sync_axis.set_yscale("log")
    sync_axis.set_ylabel("gradient sync per step, ms (median)")
    sync_axis.set_title("Synchronization time")
    eff_axis.set_ylabel("scaling efficiency, % of 1 rank")
    eff_axis.set_title("Weak-scaling efficiency (step = compute + sync)")
    eff_axis.set_ylim(0, 105)
    eff_axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def report(args):
    results = load(args.results)
    if not results:
        print("scaling: no results in %s" % args.results, file=sys.stderr)
        return 1
    compute = compute_times(args.compute_ms, {r["set"] for r in results})
    rows = derive(results, compute)
    text = markdown(rows, compute)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.plot:
        plot(rows, args.plot)
    return 0


def main(argv):
    launch_flags = []
    if "--" in argv:
        split = argv.index("--")
        argv, launch_flags = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run gradsync_bench_models at each rank count")
    run.add_argument("--bench", required=True, help="path of gradsync_bench_models")
    run.add_argument("--ranks", default="1,2,4",
                     type=lambda t: [int(n) for n in t.split(",")], help="e.g. 1,2,4,8")
    run.add_argument("--series", default="1 host", help="the layout's name in the table")
    run.add_argument("--sets", default="resnet50,bert_base,vgg16")
    run.add_argument("--iters", type=int, default=20)
    run.add_argument("--warmup", type=int, default=3)
    run.add_argument("--data-dir")
    run.add_argument("--results", default=DEFAULT_RESULTS)
    rep = sub.add_parser("report", help="table and plot from a results file")
    rep.add_argument("--results", default=DEFAULT_RESULTS)
    rep.add_argument("--compute-ms", default=str(DEFAULT_COMPUTE_MS))
    rep.add_argument("--markdown", help="write the table here (default: standard output)")
    rep.add_argument("--plot", help="write the PNG plot here")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_layouts(args, launch_flags)
    return report(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
