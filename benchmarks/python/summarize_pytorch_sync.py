#!/usr/bin/env python3
"""Markdown tables from pytorch_sync_benchmark.py's JSON lines (no torch or MPI needed).

  summarize_pytorch_sync.py results.jsonl [more.jsonl ...]

Runs are grouped by (set, ranks, framework); a group's figure is the median over its runs (the
driver's repetitions) of each run's median. Ratios compare frameworks side by side: each
repetition's ratio is taken between runs of the same repetition (the same `tag`, minutes apart at
most), and the table gives the median over repetitions with the lowest and highest in brackets.
Lines that are not the benchmark's JSON are skipped, so a raw log can be passed as it is.
Synchronization-only runs (--mode tensor or grouped) are grouped apart, their set named with the
mode.
"""

import json
import statistics
import sys

ORDER = ("gradsync", "gradsync-ddp", "horovod", "ddp")
# (peer, gradsync variant, the project's goal for peer sync / gradsync sync)
RATIOS = (("ddp", "gradsync", 3.0), ("horovod", "gradsync", 2.5),
          ("ddp", "gradsync-ddp", 3.0), ("horovod", "gradsync-ddp", 2.5))
LABEL = {"ddp": "DDP", "horovod": "Horovod", "gradsync": "gs", "gradsync-ddp": "gs-ddp"}


def load(paths):
    records = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("benchmark") == "pytorch_sync":
                    records.append(r)
    return records


def fmt(x, digits=1):
    return "%.*f" % (digits, x)


def ratio_cell(values, goal=None):
    if not values:
        return ""
    med = statistics.median(values)
    text = fmt(med, 2)
    if len(values) > 1:
        text += " (%s–%s)" % (fmt(min(values), 2), fmt(max(values), 2))
    if goal is not None and med < goal:
        text = "**%s**" % text
    return text


def set_label(record):
    """The set, with the mode (and an op other than Average) of a synchronization-only run, or
    the DDP wrappers' communication hook and bucket size: such runs are grouped apart."""
    mode = record.get("mode", "step")
    if mode == "step":
        notes = [record["comm_hook"]] if record.get("comm_hook", "none") != "none" else []
        if record.get("bucket_cap_mb", 25) != 25:
            notes.append("%g MB buckets" % record["bucket_cap_mb"])
        return record["set"] if not notes else "%s (%s)" % (record["set"], ", ".join(notes))
    op = record.get("op", "Average")
    return "%s (%s)" % (record["set"], mode if op == "Average" else mode + ", " + op)


def main(paths):
    records = load(paths)
    if not records:
        print("no pytorch_sync results in %s" % ", ".join(paths), file=sys.stderr)
        return 1
    groups = {}
    for r in records:
        groups.setdefault((set_label(r), r["ranks"]), {}).setdefault(r["framework"], []).append(r)
    # Sets in the order they first ran (the driver's --sets order), ranks ascending.
    set_order = list(dict.fromkeys(set_label(r) for r in records))
    keys = sorted(groups, key=lambda k: (set_order.index(k[0]), k[1]))
    first = records[0]
    print("Medians over each group's runs of the per-run medians (%d timed steps per run, "
          "%d warmup, %d torch thread(s) per rank); ms.\n"
          % (first["iters"], first["warmup"], first["threads"]))
    print("| set | ranks | framework | runs | step | baseline | baseline beside framework "
          "| sync | sync p90 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in keys:
        by_fw = groups[key]
        for fw in sorted(by_fw, key=lambda f: ORDER.index(f) if f in ORDER else len(ORDER)):
            runs = by_fw[fw]

            def med(field):
                return statistics.median(r[field] for r in runs)

            print("| %s | %d | %s | %d | %s | %s | %s | %s | %s |"
                  % (key[0], key[1], fw, len(runs), fmt(med("step_ms")), fmt(med("base_ms")),
                     fmt(med("busy_base_ms")), fmt(med("sync_ms")), fmt(med("sync_ms_p90"))))

    pairs = [(p, g, goal) for p, g, goal in RATIOS
             if any(p in groups[k] and g in groups[k] for k in keys)]
    if not pairs:
        return 0
    print("\ngs: gradsync.torch.DistributedOptimizer; gs-ddp: "
          "gradsync.torch.DistributedDataParallel; DDP: torch's, over gloo.")
    for field, what in (("sync_ms", "synchronization time"), ("step_ms", "step time")):
        print("\n%s ratios, peer / gradsync (above 1: gradsync is faster): median over "
              "repetitions (lowest–highest)%s.\n"
              % (what.capitalize(), "; below the project's goal in bold"
                 if field == "sync_ms" else ""))
        head = ["set", "ranks"] + ["%s/%s%s" % (LABEL[p], LABEL[g], " (goal %s)" % fmt(goal, 1)
                                                if field == "sync_ms" else "")
                                   for p, g, goal in pairs]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for key in keys:
            by_fw = groups[key]
            cells = [key[0], str(key[1])]
            for peer, ours, goal in pairs:
                # Each repetition's peer run against the same repetition's gradsync run.
                peer_by_tag = {r.get("tag", ""): r[field] for r in by_fw.get(peer, [])}
                paired = [r for r in by_fw.get(ours, []) if r.get("tag", "") in peer_by_tag]
                values = [peer_by_tag[r.get("tag", "")] / r[field] for r in paired
                          if r[field] > 0]
                cell = ratio_cell(values, goal if field == "sync_ms" else None)
                # A run whose step took no longer than its compute has no ratio: say so.
                if len(values) < len(paired):
                    cell += " (%d run(s) at %s <= 0 left out)" % (len(paired) - len(values),
                                                                  field)
                cells.append(cell)
            print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    sys.exit(main(sys.argv[1:]))
