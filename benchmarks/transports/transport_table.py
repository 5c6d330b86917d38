#!/usr/bin/env python3
"""The transport table and its plot from transport_table.sh's output folder.

  transport_table.py OUT_DIR [--markdown FILE] [--plot FILE]

OUT_DIR holds models_<layout>.txt (gradsync_bench_models's table) and pytorch_<layout>.jsonl
(pytorch_sync_benchmark.py's JSON lines) for the layouts 1x2, 1x4, 2x1 and 2x2 (hosts x ranks per
host). One row per set and layout:

  gradsync, per tensor, flat+copy, bucketed   gradsync_bench_models's medians, ms (one run)
  chunked     the fastest of the chunked and pipelined raw strategies (chunk-S, pipe-S), ms, and
              which one
  gs/best     gradsync against the best of every raw strategy; the goal is at most 1.1
  torch gs, Horovod   synchronization time of one PyTorch step (step minus its compute), median
              over repetitions, ms
  hvd/gs      Horovod's against gradsync.torch's, each repetition's pair, median; the goal is at
              least 1.5
A ratio outside its goal is in bold. The plot shows gs/best and hvd/gs per cell against the goals.

A second table follows where pytorch_<layout>.jsonl holds synchronization-only runs
(pytorch_sync_benchmark.py --mode tensor or grouped): per set, layout and mode, gradsync.torch's
and Horovod's synchronization time and hvd/gs, whose goal there is at least 1.1.
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scaling"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from scaling import CHUNKED_COLUMNS, parse_bench_output  # noqa: E402
from summarize_pytorch_sync import load as load_pytorch_runs  # noqa: E402

LAYOUTS = (("1x2", "1 host x 2"), ("1x4", "1 host x 4"), ("2x1", "2 hosts x 1"),
           ("2x2", "2 hosts x 2"))
SETS = ("resnet50", "bert_base", "1000x1KB")
BEST_GOAL = 1.1
HOROVOD_GOAL = 1.5
# pytorch_sync_benchmark.py's synchronization-only modes, and Horovod's time over gradsync's that
# they are held to.
SYNC_MODES = {"tensor": "per tensor", "grouped": "grouped"}
SYNC_ONLY_GOAL = 1.1


def read_layout(out_dir, layout):
    models, torch_runs = {}, []
    path = os.path.join(out_dir, "models_%s.txt" % layout)
    if os.path.exists(path):
        with open(path) as f:
            models = parse_bench_output(f.read())
    path = os.path.join(out_dir, "pytorch_%s.jsonl" % layout)
    if os.path.exists(path):
        torch_runs = load_pytorch_runs([path])
    return models, torch_runs


def cell_row(set_name, models, torch_runs):
    """Figures of one (set, layout): a dict with None for what did not run."""
    row = dict.fromkeys(("gs", "pt", "fc", "bk", "chunked", "chunked_name", "best", "torch_gs",
                         "hvd", "hvd_gs"))
    m = models.get(set_name)
    if m:
        row.update(gs=m["sync_ms"], pt=m["per_tensor_ms"], fc=m["flat_copy_ms"],
                   bk=m.get("bucketed_ms"))
        # chunk4M_ms is the column of the strategy chunk-4M.
        chunked = [(m[c], c[:-3].replace("chunk", "chunk-").replace("pipe", "pipe-"))
                   for c in CHUNKED_COLUMNS if m.get(c)]
        if chunked:
            row["chunked"], row["chunked_name"] = min(chunked)
        raw = [v for v in (row["pt"], row["fc"], row["bk"], row["chunked"]) if v]
        if raw and row["gs"]:
            row["best"] = row["gs"] / min(raw)
    row["torch_gs"], row["hvd"], row["hvd_gs"] = torch_figures(torch_runs, set_name, "step")
    return row


def torch_figures(torch_runs, set_name, mode):
    """gradsync.torch's and Horovod's sync time (medians over repetitions, ms) and Horovod's
    over gradsync's (median of each repetition's pair), for one set and benchmark mode; None for
    what did not run."""
    by_fw = {}
    for r in torch_runs:
        if r["set"] == set_name and r.get("mode", "step") == mode:
            by_fw.setdefault(r["framework"], []).append(r)
    ours = theirs = ratio = None
    if by_fw.get("gradsync"):
        ours = statistics.median(r["sync_ms"] for r in by_fw["gradsync"])
    if by_fw.get("horovod"):
        theirs = statistics.median(r["sync_ms"] for r in by_fw["horovod"])
        by_tag = {r.get("tag", ""): r["sync_ms"] for r in by_fw.get("gradsync", [])}
        pairs = [r["sync_ms"] / by_tag[r.get("tag", "")] for r in by_fw["horovod"]
                 if by_tag.get(r.get("tag", ""), 0) > 0]
        if pairs:
            ratio = statistics.median(pairs)
    return ours, theirs, ratio


def sync_only_markdown(cells):
    """The synchronization-only table: ((set, layout label, mode), (gs, hvd, hvd/gs)) per row."""
    lines = ["| set | layout | mode | gradsync.torch | Horovod | hvd/gs |",
             "|---|---|---|---|---|---|"]
    for (set_name, label, mode), (ours, theirs, ratio) in cells:
        ms = 3 if set_name == "1000x1KB" else 1
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            set_name, label, SYNC_MODES[mode], fmt(ours, ms), fmt(theirs, ms),
            fmt(ratio, 2, lambda v: v >= SYNC_ONLY_GOAL)))
    return "\n".join(lines) + "\n"


def fmt(value, digits, bold_unless=None):
    if value is None:
        return "—"
    text = "%.*f" % (digits, value)
    return "**%s**" % text if bold_unless is not None and not bold_unless(value) else text


def markdown(rows):
    lines = ["| set | layout | gradsync | per tensor | flat+copy | bucketed | chunked | gs/best "
             "| torch gs | Horovod | hvd/gs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (set_name, label), r in rows:
        ms = 3 if set_name == "1000x1KB" else 1
        chunked = fmt(r["chunked"], ms)
        if r["chunked_name"]:
            chunked += " (%s)" % r["chunked_name"]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            set_name, label, fmt(r["gs"], ms), fmt(r["pt"], ms), fmt(r["fc"], ms),
            fmt(r["bk"], ms), chunked, fmt(r["best"], 2, lambda v: v <= BEST_GOAL),
            fmt(r["torch_gs"], 1), fmt(r["hvd"], 1),
            fmt(r["hvd_gs"], 2, lambda v: v >= HOROVOD_GOAL)))
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [label for _, label in LAYOUTS]
    width = 0.8 / len(SETS)
    for panel, (key, goal, title) in enumerate((
            ("best", BEST_GOAL, "gradsync / best raw MPI strategy (lower is better)"),
            ("hvd_gs", HOROVOD_GOAL, "Horovod / gradsync.torch sync time (higher is better)"))):
        ax = axes[panel]
        for k, set_name in enumerate(SETS):
            values = [dict(rows)[(set_name, label)][key] or 0 for label in labels]
            xs = [i + (k - (len(SETS) - 1) / 2) * width for i in range(len(labels))]
            ax.bar(xs, values, width, label=set_name)
        ax.axhline(goal, color="black", linestyle="--", linewidth=1, label="goal %.1f" % goal)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels)
        ax.set_title(title, fontsize=10)
        if key == "hvd_gs":
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("out_dir")
    parser.add_argument("--markdown", help="write the table here (default: stdout)")
    parser.add_argument("--plot", help="write the PNG plot here")
    args = parser.parse_args(argv)
    rows = []
    for layout, label in LAYOUTS:
        models, torch_runs = read_layout(args.out_dir, layout)
        for set_name in SETS:
            rows.append(((set_name, label), cell_row(set_name, models, torch_runs)))
    rows.sort(key=lambda item: SETS.index(item[0][0]))
    table = markdown(rows)
    sync_cells = []
    for set_name in SETS:
        for layout, label in LAYOUTS:
            torch_runs = read_layout(args.out_dir, layout)[1]
            for mode in SYNC_MODES:
                figures = torch_figures(torch_runs, set_name, mode)
                if any(v is not None for v in figures):
                    sync_cells.append(((set_name, label, mode), figures))
    if sync_cells:
        table += "\n" + sync_only_markdown(sync_cells)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    else:
        sys.stdout.write(table)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
