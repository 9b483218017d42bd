#!/usr/bin/env python3
"""bench/report.py: turns one results folder of run.sh into results.md,
summary.csv and PNG plots (gnuplot).

    python3 bench/report.py bench/results/<date>

Input (written by run.sh):
  allocators.txt           name status library     (status: ok | missing)
  <scenario>.csv           allocator,run,metric,value,unit   (every run)
  raw/                     per-run logs and the CSVs the plots read
  machine.txt, preload.txt, errors.txt (optional)

Each table cell is the median over runs, with its ratio to glibc in
parentheses; the last columns compare lull with glibc and with the best of
the four peers (glibc, jemalloc, mimalloc, tcmalloc). "Best" means the
highest for rates (Mops/s, req/s) and the lowest for everything else.
A variant of lull that ran in a scenario (lull-delay0 in burst) gets a
column of its own there, and lull a ratio to it. The hardening scenario has
a table of its own: lull-hard against lull-nohard; so has thp, where lull runs
as lull-thp-never and lull-thp-auto (no plain lull column) and the coverage
of each churn round gets a second table. The footprint section adds
the geomean peak RSS over its scenarios per allocator and its own goals.
Nothing here asserts anything: the goals section only reports.
"""
import csv
import glob
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

ALLOCS = ["glibc", "jemalloc", "mimalloc", "tcmalloc", "lull"]
PEERS = ["glibc", "jemalloc", "mimalloc", "tcmalloc"]
# Variants of lull (bench/lib.sh): a column only where they ran.
DELAY0 = "lull-delay0"  # same library, LULL_CONF=purge_delay_ms=0 (burst)
HARD, NOHARD = "lull-hard", "lull-nohard"  # LULL_HARDENING=ON / OFF (hardening)
THP_NEVER, THP_AUTO = "lull-thp-never", "lull-thp-auto"  # LULL_CONF=thp=never / auto (thp)
VARIANTS = [DELAY0, HARD, NOHARD, "glibc-hugetlb", THP_NEVER, THP_AUTO]
SCENARIOS = ["stall", "throughput", "callgrind", "latency", "burst", "redis", "hardening", "forkexec",
             "hugeoverload", "buffercycle", "footprint", "defrag", "thp"]
HIGHER_BETTER = {"Mops/s", "req/s"}
INFO_UNITS = {"requests", "pairs", "blocks", "%", "keys", "steps", "passes", "bool"}

TITLES = {
    "stall": "Stalls: free of a large block, bulk free, later churn, RSS",
    "throughput": "Throughput (small blocks, 16-1024 B)",
    "callgrind": "Instructions per malloc+free pair (callgrind)",
    "latency": "Request-thread latency while another thread churns 64 MiB blocks",
    "burst": "Refault churn between bursts",
    "redis": "redis-server",
    "hardening": "Hardening: lull with and without its double-free check (issue #8)",
    "forkexec": "fork + execve(/bin/true) + waitpid from a process with a small heap",
    "hugeoverload": "Freed huge blocks under overload: 3 threads, 0.5 % of operations on 20 MiB blocks",
    "buffercycle": "A 32 MiB buffer every request, 100 ms apart, beside a span churn",
    "footprint": "Footprint: peak RSS, RSS after idle, pages given back",
    "defrag": "Active defragmentation of a table 75 % deleted at random (issue 15)",
    "thp": "Transparent hugepages: coverage of a small-object heap, a TLB-bound workload (issue 16)",
}
# footprint metrics are <scenario>_<what>; the geomean is computed here
FOOTPRINT_PEAK = "_peak_rss_mib"
FOOTPRINT_GEOMEAN = "geomean_peak_rss_mib"

# Goals for lull (from the issues). Reported, never asserted.
GOALS = [
    ("stall", "free_large_us", "<=", 50, "free() of the large block <= 50 us"),
    ("stall", "bulk_free_max_us", "<=", 20, "slowest free in the bulk free <= 20 us"),
    ("stall", "churn_malloc_max_us", "<=", 200, "slowest malloc in the later churn <= 200 us"),
    ("stall", "churn_free_max_us", "<=", 200, "slowest free in the later churn <= 200 us"),
    ("stall", "rss_settled_bulk_mib", "rss_goal", None, "RSS 1.2 s after the bulk free <= live * 1.05 + 8 MiB"),
    ("throughput", "st_mops", ">=mimalloc*", 0.9, "single-thread throughput >= 90 % of mimalloc"),
    ("throughput", "mt_mops", ">=mimalloc*", 0.9, "two-thread throughput >= 90 % of mimalloc"),
    ("throughput", "prodcons_mops", ">=mimalloc*", 0.9, "producer/consumer throughput >= 90 % of mimalloc"),
    ("throughput", "larson_mops", ">=mimalloc*", 0.9, "larson throughput >= 90 % of mimalloc"),
    ("throughput", "larson_live_mops", ">=mimalloc*", 0.9, "larson-live throughput >= 90 % of mimalloc"),
    ("callgrind", "fixed32_instr_per_pair", "<=mimalloc*", 1.0, "instructions per malloc(32)+free <= mimalloc"),
    ("latency", "op_p99", "<=glibc*", 1.0, "request-thread p99 <= glibc"),
    ("latency", "op_p999", "<=glibc*", 1.0, "request-thread p99.9 <= glibc"),
    ("latency", "op_p9999", "<=glibc*", 1.0, "request-thread p99.99 <= glibc"),
    ("latency", "op_max", "<=glibc*", 1.0, "request-thread max <= glibc"),
    # burst (issue #4); gap* is every gap of the run, in its order
    ("burst", "gap*_faults", "<=delay0*", 0.1,
     "faults per burst, {gap} ms gaps: >= 90 % fewer than lull-delay0"),
    ("burst", "gap*_faults", "<peers", None, "faults per burst, {gap} ms gaps: fewer than every peer"),
    # the same counted on every thread, burst and gap: faults the allocator
    # takes on a thread of its own (lull's warm reserve) count too
    ("burst", "gap*_faults_process", "<=delay0*", 0.1,
     "faults per burst and gap, all threads, {gap} ms gaps: >= 90 % fewer than lull-delay0"),
    ("burst", "rss_after_idle_mib", "rss_goal_base", None,
     "RSS after the long idle <= live * 1.05 + 8 MiB (live: rss_base_mib)"),
    ("forkexec", "forkexec_us_median", "<=glibc*", 1.3, "fork+exec+wait median <= 1.3 x glibc (issue 12)"),
    # the mission: no stall from giving memory back, without keeping it
    ("buffercycle", "request_ms_median", "<=glibc*", 0.2,
     "buffer_cycle: a request <= 0.2 x glibc's time (its buffer not faulted back in)"),
    ("buffercycle", "rss_end_mib", "<each", ["tcmalloc"],
     "buffer_cycle: RSS at the end below tcmalloc's (which keeps the buffer too)"),
    # footprint suite: the geomean is over the footprint scenarios (see footprint_geomeans)
    ("footprint", FOOTPRINT_GEOMEAN, "<=glibc*", 1.15, "footprint: geomean peak RSS <= 1.15 x glibc"),
    ("footprint", FOOTPRINT_GEOMEAN, "<each", ["jemalloc", "mimalloc"],
     "footprint: geomean peak RSS below jemalloc's and mimalloc's"),
    ("footprint", FOOTPRINT_PEAK, "worst<=best_peer*", 1.5,
     "footprint: no scenario's peak RSS above 1.5 x the best peer"),
    ("footprint", "survivors_mid_returned_pct", ">=", 90,
     "footprint: returned_pct >= 90 % (4-32 KiB blocks, survivors_mid)"),
    ("footprint", "survivors_small_returned_pct", ">=", 80,
     "footprint: returned_pct >= 80 % (16-1024 B blocks, survivors_small)"),
    # defrag (issue 15): RSS / live at most 1.10 sooner, with fewer bytes moved
    ("defrag", "time_to_target_ms", "<jemalloc", None, "defrag: RSS / live <= 1.10 sooner than jemalloc"),
    ("defrag", "moved_to_target_mib", "<jemalloc", None,
     "defrag: fewer bytes moved than jemalloc to reach it"),
]

COLORS = {"glibc": "#444444", "jemalloc": "#1f77b4", "mimalloc": "#2ca02c",
          "tcmalloc": "#ff7f0e", "lull": "#d62728", DELAY0: "#e377c2",
          THP_NEVER: "#9467bd", THP_AUTO: "#d62728", "glibc-hugetlb": "#aaaaaa"}


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def ratio(a, b):
    if a is None or b is None:
        return None
    if b == 0:
        return None if a != 0 else 1.0
    return a / b


def fmt_ratio(r):
    if r is None:
        return "-"
    return f"{r:.2f}x" if r < 100 else f"{r:,.0f}x"


def load(out):
    status = {}
    path = os.path.join(out, "allocators.txt")
    if os.path.exists(path):
        for line in open(path):
            # name status [library [note...]]
            parts = line.split(maxsplit=3)
            if len(parts) >= 2:
                status[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "",
                                    parts[3].strip() if len(parts) > 3 else "")
    data = {}  # scenario -> metric -> {"unit", "order", "vals": alloc -> [values]}
    for sc in SCENARIOS:
        p = os.path.join(out, f"{sc}.csv")
        if not os.path.exists(p):
            continue
        metrics = data.setdefault(sc, {})
        with open(p) as f:
            for row in csv.DictReader(f):
                try:
                    v = float(row["value"])
                except ValueError:
                    continue
                m = metrics.setdefault(row["metric"], {"unit": row["unit"], "order": len(metrics), "vals": {}})
                m["vals"].setdefault(row["allocator"], []).append(v)
    return status, data


def medians(data):
    med = {}
    for sc, metrics in data.items():
        for name, m in metrics.items():
            for a, vs in m["vals"].items():
                med[(sc, name, a)] = statistics.median(vs)
    return med


def metric_kind(sc, metric, unit):
    """"higher" or "lower" (which is better), or "info" (neither)."""
    if sc == "footprint":
        # the share of the free pages given back; what the program holds
        # (the same for every allocator) and what could be given back
        if metric.endswith("_returned_pct"):
            return "higher"
        if metric.endswith(("_live_mib", "_returnable_mib")):
            return "info"
    if unit in INFO_UNITS:
        return "info"
    return "higher" if unit in HIGHER_BETTER else "lower"


def best_peer(med, sc, metric, unit):
    vals = [(a, med.get((sc, metric, a))) for a in PEERS]
    vals = [(a, v) for a, v in vals if v is not None]
    kind = metric_kind(sc, metric, unit)
    if not vals or kind == "info":
        return None, None
    if kind == "higher":
        return max(vals, key=lambda x: x[1])
    return min(vals, key=lambda x: x[1])


def footprint_scenarios(med):
    """The footprint scenarios that reported a peak, in the order of the CSV."""
    names = [m[:-len(FOOTPRINT_PEAK)] for (sc, m, _a) in med if sc == "footprint" and m.endswith(FOOTPRINT_PEAK)]
    return list(dict.fromkeys(names))


def footprint_geomeans(med):
    """Per allocator, the geometric mean of the median peak RSS over the
    footprint scenarios that every allocator with footprint figures has (so
    that the means compare the same scenarios); and those scenarios."""
    scs = footprint_scenarios(med)
    allocs = [a for a in ALLOCS if any(med.get(("footprint", s + FOOTPRINT_PEAK, a)) for s in scs)]
    common = [s for s in scs if all((med.get(("footprint", s + FOOTPRINT_PEAK, a)) or 0) > 0 for a in allocs)]
    means = {}
    if not common:
        return means, common
    for a in allocs:
        logs = [math.log(med[("footprint", s + FOOTPRINT_PEAK, a)]) for s in common]
        means[a] = math.exp(sum(logs) / len(logs))
    return means, common


def footprint_worst_row(med, text, target):
    """The goal row of "no scenario above target x the best peer": lull's
    worst peak RSS against the best peer's, over the footprint scenarios."""
    worst = None
    for s in footprint_scenarios(med):
        metric = s + FOOTPRINT_PEAK
        lv = med.get(("footprint", metric, "lull"))
        bp, bv = best_peer(med, "footprint", metric, "MiB")
        r = ratio(lv, bv)
        if r is not None and (worst is None or r > worst[0]):
            worst = (r, s, lv, bp, bv)
    if worst is None:
        return text, "-", "-", "not measured"
    r, s, lv, bp, bv = worst
    return (text, f"worst {fmt_ratio(r)}: {s} ({fmt(lv)} MiB, {bp} {fmt(bv)} MiB)",
            f"<= {target:g}x the best peer", "met" if r <= target else "not met")


def expand_goals(data):
    """GOALS with each gap* metric replaced by one entry per gap of the run."""
    for sc, metric, op, target, text in GOALS:
        if "*" not in metric:
            yield sc, metric, op, target, text
            continue
        pat = re.compile("^" + re.escape(metric).replace(r"\*", r"(\d+)") + "$")
        names = sorted(data.get(sc, {}).items(), key=lambda kv: kv[1]["order"])
        hits = [(name, pat.match(name)) for name, _ in names]
        hits = [(name, mt.group(1)) for name, mt in hits if mt]
        if not hits:
            yield sc, metric, op, target, text.replace("{gap} ms gaps", "each gap")
        for name, gap in hits:
            yield sc, name, op, target, text.replace("{gap}", gap)


def goal_rows(med, status, data):
    data_units = {(sc, name): m["unit"] for sc, ms in data.items() for name, m in ms.items()}
    data_units[("footprint", FOOTPRINT_GEOMEAN)] = "MiB"
    # the footprint geomeans, as if they were medians of a metric (a copy)
    med = dict(med)
    for a, v in footprint_geomeans(med)[0].items():
        med[("footprint", FOOTPRINT_GEOMEAN, a)] = v
    rows = []
    lull_ok = status.get("lull", ("missing",))[0] == "ok"
    for sc, metric, op, target, text in expand_goals(data):
        if lull_ok and op == "worst<=best_peer*":
            rows.append(footprint_worst_row(med, text, target))
            continue
        v = med.get((sc, metric, "lull"))
        unit = data_units.get((sc, metric), "")
        # the geomeans are compared against 1.15x: one decimal, so that a
        # miss by less than the rounding still shows
        num = (lambda x: f"{x:,.1f}") if metric == FOOTPRINT_GEOMEAN else fmt
        if not lull_ok or v is None:
            rows.append((text, "-", "-", "lull missing" if not lull_ok else "not measured"))
            continue
        target_text = None  # the target column, when not "<= goal"
        if op == "<=":
            goal, met = target, v <= target
        elif op == ">=":
            goal, met = target, v >= target
            target_text = f">= {num(goal)} {unit}"
        elif op == "<each":
            # strictly below each of the allocators listed in target
            refs = [(a, med.get((sc, metric, a))) for a in target]
            goal = None
            met = None if any(r is None for _, r in refs) else all(v < r for _, r in refs)
            target_text = ", ".join(f"< {num(r)} {unit} ({a})" for a, r in refs if r is not None) or "-"
        elif op in ("rss_goal", "rss_goal_base"):
            # live: stall's rss_live_mib; burst: the RSS before the first burst
            live = med.get((sc, "rss_live_mib" if op == "rss_goal" else "rss_base_mib", "lull"))
            goal = None if live is None else live * 1.05 + 8
            met = goal is not None and v <= goal
        elif op == "<peers":
            # strictly fewer than the lowest peer
            bp, goal = best_peer(med, sc, metric, unit)
            met = None if goal is None else v < goal
            target_text = f"< {num(goal)} {unit} ({bp})" if goal is not None else None
        elif op == "<jemalloc":
            ref = med.get((sc, metric, "jemalloc"))
            goal = ref
            met = None if ref is None else v < ref
            target_text = f"< {num(ref)} {unit} (jemalloc)" if ref is not None else "jemalloc: not reached"
        elif op == "<=delay0*":
            ref = med.get((sc, metric, DELAY0))
            goal = None if ref is None else ref * target
            met = None if goal is None else v <= goal
            if goal is not None:
                target_text = f"{num(goal)} {unit} ({target:g} x {num(ref)})"
        else:
            ref_alloc = "mimalloc" if "mimalloc" in op else "glibc"
            ref = med.get((sc, metric, ref_alloc))
            goal = None if ref is None else ref * target
            if goal is None:
                met = None
            elif op.startswith(">="):
                met = v >= goal
            else:
                met = v <= goal
        if target_text is None:
            target_text = f"{num(goal)} {unit}" if goal is not None else "-"
        rows.append((text, f"{num(v)} {unit}", target_text,
                     "met" if met else ("n/a" if met is None else "not met")))
    return rows


def write_md(out, status, data, med):
    lines = []
    w = lines.append
    w(f"# lull benchmark results: {os.path.basename(os.path.abspath(out))}")
    w("")
    mpath = os.path.join(out, "machine.txt")
    if os.path.exists(mpath):
        w("```")
        lines.extend(l.rstrip("\n") for l in open(mpath))
        w("```")
        w("")
    w("Each cell: median over runs, (ratio to glibc). `lull/best peer` compares lull with the best of "
      "glibc, jemalloc, mimalloc and tcmalloc (highest rate, otherwise lowest value). "
      "Timings come from a shared, noisy 2-core machine; the callgrind counts are exact.")
    w("")
    w("| allocator | status | library |")
    w("|---|---|---|")
    for a in ALLOCS + [a for a in status if a not in ALLOCS]:
        st, lib, note = status.get(a, ("not run", "", ""))
        w(f"| {a} | {st} | `{lib or '(none: default)'}`{' ' + note if note else ''} |")
    w("")
    for sc in SCENARIOS:
        if sc not in data:
            continue
        w(f"## {TITLES.get(sc, sc)}")
        w("")
        if sc == "hardening":
            write_hardening(w, data[sc], med)
            continue
        if sc == "thp":
            write_thp(w, out, data[sc], med)
            continue
        # lull's variants that ran here get a column, and lull a ratio to them
        extra = [a for a in VARIANTS if any(a in m["vals"] for m in data[sc].values())]
        cols = ALLOCS + extra
        w("| metric | unit | " + " | ".join(cols) + " | lull/glibc | lull/best peer |" +
          "".join(f" lull/{a} |" for a in extra))
        w("|---|---|" + "---|" * len(cols) + "---|---|" + "---|" * len(extra))
        for name, m in sorted(data[sc].items(), key=lambda kv: kv[1]["order"]):
            unit = m["unit"]
            g = med.get((sc, name, "glibc"))
            cells = []
            for a in cols:
                v = med.get((sc, name, a))
                st = status.get(a, ("not run",))[0]
                if v is None:
                    cells.append("missing" if st == "missing" else "-")
                elif a == "glibc" or g is None:
                    cells.append(fmt(v))
                else:
                    cells.append(f"{fmt(v)} ({fmt_ratio(ratio(v, g))})")
            lv = med.get((sc, name, "lull"))
            bp, bv = best_peer(med, sc, name, unit)
            if not bp or lv is None:
                vs_best = "-"
            elif ratio(lv, bv) is None:
                vs_best = f"n/a ({bp}: 0)"
            else:
                vs_best = f"{fmt_ratio(ratio(lv, bv))} ({bp})"
            vs_extra = "".join(f" {fmt_ratio(ratio(lv, med.get((sc, name, a))))} |" for a in extra)
            w(f"| {name} | {unit} | " + " | ".join(cells) + f" | {fmt_ratio(ratio(lv, g))} | {vs_best} |" +
              vs_extra)
        w("")
        if sc == "burst":
            write_burst_notes(w, out, extra)
        if sc == "footprint":
            write_footprint_notes(w, out, med)
        for png in PLOTS_BY_SCENARIO.get(sc, []):
            if os.path.exists(os.path.join(out, png)):
                w(f"![{png}]({png})")
                w("")
    w("## Goals for lull (reported, not asserted)")
    w("")
    w("| goal | lull | target | status |")
    w("|---|---|---|---|")
    for text, v, goal, st in goal_rows(med, status, data) + thp_goal_rows(med):
        w(f"| {text} | {v} | {goal} | {st} |")
    w("")
    for extra, title in (("errors.txt", "Errors"), ("preload.txt", "Preload checks")):
        p = os.path.join(out, extra)
        if os.path.exists(p) and os.path.getsize(p) > 0:
            w(f"## {title}")
            w("")
            w("```")
            lines.extend(l.rstrip("\n") for l in open(p))
            w("```")
            w("")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def info_lines(path, prefix):
    """The rest of each line of a raw log that starts with prefix."""
    if not os.path.exists(path):
        return []
    return [l[len(prefix):].strip() for l in open(path, errors="replace") if l.startswith(prefix)]


def write_burst_notes(w, out, extra):
    """What the per-gap figures are, as the program said it, and lull's
    purge delay at the end (run 1's logs)."""
    for log in sorted(glob.glob(os.path.join(out, "raw", "burst_*_r1.log"))):
        steady = info_lines(log, "INFO burst steady_state ")
        if steady:
            w(f"Steady state: {steady[0]}; every burst is in "
              "`raw/burst_bursts_<allocator>_r<run>.csv`. "
              "`rss_base_mib`: RSS before the first burst (nothing of a burst live).")
            w("")
            break
    if DELAY0 in extra:
        w(f"`{DELAY0}`: lull's library with `LULL_CONF=purge_delay_ms=0` "
          "(checked on lull's counter page in every run).")
        w("")
    for a in ["lull"] + extra:
        log = os.path.join(out, "raw", f"burst_{a}_r1.log")
        for said in info_lines(log, "INFO burst lull_at_end "):
            w(f"- {a} (run 1), lull's counter page at the end: `{said}`")
    w("")


def write_footprint_notes(w, out, med):
    """The geomean peak RSS per allocator, what the figures are, and each
    scenario's configuration as the program printed it (run 1)."""
    means, common = footprint_geomeans(med)
    if means:
        g = means.get("glibc")
        parts = []
        for a, v in means.items():
            rel = f" ({ratio(v, g):.3f}x glibc)" if g and a != "glibc" else ""
            parts.append(f"{a} {v:,.1f} MiB{rel}")
        w(f"**Geomean peak RSS** over the {len(common)} footprint scenarios: " + "; ".join(parts) + ".")
        w("")
    long_idle = peak_reset = None  # as the programs said it (run 1)
    for log in sorted(glob.glob(os.path.join(out, "raw", "footprint-*_r1.log"))):
        for said in info_lines(log, "INFO footprint idle "):
            m = re.search(r"long=(\d+) ms", said)
            if m and int(m.group(1)) > 0 and long_idle is None:
                long_idle = f"{int(m.group(1)) / 1000:g} s"
        for said in info_lines(log, "INFO footprint peak_reset "):
            peak_reset = peak_reset or said
    w("One process per scenario. `peak_rss_mib`: VmHWM over the measured part (the workload and the frees "
      "that end it), reset at its start through `/proc/self/clear_refs`"
      + (f" (but here: {peak_reset})" if peak_reset and not peak_reset.startswith("clear_refs") else "")
      + "; `rss_idle_mib`: RSS 1.2 s after it; "
      "`rss_idle_long_mib`: after the long idle"
      + (f" ({long_idle})" if long_idle else "") + "; `live_mib`: the bytes the program still holds (what it "
      "asked malloc for); `idle_rss_per_live`: RSS after the last idle / live; `time_s`: wall clock of the "
      "measured part. `returnable_mib`: the 4 KiB pages the blocks at the peak overlapped that no "
      "surviving block overlaps (from the blocks' addresses, so per allocator); `returned_pct`: (peak RSS "
      "- RSS after the long idle) / returnable, clipped to 0-100. RSS includes the program and its own "
      "arrays (`INFO footprint base_rss_mib` in the logs).")
    w("")
    for s in footprint_scenarios(med):
        logs = sorted(glob.glob(os.path.join(out, "raw", f"footprint-{s}_*_r1.log")))
        said = info_lines(logs[0], "INFO footprint config ") if logs else []
        if said:
            w(f"- `{s}`: {said[0]}")
    w("")


def write_hardening(w, metrics, med):
    """lull-hard against lull-nohard: instructions per pair, throughput."""
    w(f"`{HARD}`: LULL_HARDENING=ON, the default build (local double-free check on free). "
      f"`{NOHARD}`: LULL_HARDENING=OFF (`-DLULL_NO_DOUBLE_FREE_CHECK`: that check compiled out). "
      "Safe-linked free lists are in both: no switch removes them. "
      "Both built from one copy of the working tree with the same flags (Release). "
      "Instructions: callgrind, exact, one run. Throughput: `bench_throughput` st and mt with "
      "50 M ops (`--quick`: 1 M), median of the runs (min-max in brackets); `*_cpu_ns_per_op` is the "
      "process's CPU time per op, which waiting for a CPU on a busy machine does not inflate.")
    w("")
    w(f"| metric | unit | {HARD} | {NOHARD} | hardened/unhardened | cost of hardening |")
    w("|---|---|---|---|---|---|")
    for name, m in sorted(metrics.items(), key=lambda kv: kv[1]["order"]):
        unit = m["unit"]
        cells = []
        for a in (HARD, NOHARD):
            vs = m["vals"].get(a)
            if not vs:
                cells.append("missing")
            elif len(vs) > 1:
                cells.append(f"{fmt(med[('hardening', name, a)])} ({fmt(min(vs))}-{fmt(max(vs))})")
            else:
                cells.append(fmt(vs[0]))
        h, n = med.get(("hardening", name, HARD)), med.get(("hardening", name, NOHARD))
        r = ratio(h, n)
        if r is None:
            cost = "-"
        elif unit in HIGHER_BETTER:
            cost = f"{(r - 1) * 100:+.1f} % throughput"
        else:
            cost = f"{h - n:+.3g} {unit} ({(r - 1) * 100:+.1f} %)"
        w(f"| {name} | {unit} | " + " | ".join(cells) + f" | {fmt_ratio(r)} | {cost} |")
    w("")


GLIBC_HUGE = "glibc-hugetlb"  # glibc with glibc.malloc.hugetlb=1 (thp: a reference, not a peer)
THP_ALLOCS = PEERS + [GLIBC_HUGE, THP_NEVER, THP_AUTO]
THP_ROUND = re.compile(r"^churn_r\d+_coverage_pct$")


def thp_best_peer(med, name, unit):
    """The best peer for a thp metric: the highest coverage or rate, the
    lowest of everything else (RSS, time, misses)."""
    vals = [(a, med.get(("thp", name, a))) for a in PEERS]
    vals = [(a, v) for a, v in vals if v is not None]
    if not vals or name.endswith(("_live_mib", "_ops")):
        return None, None
    higher = unit in HIGHER_BETTER or name.endswith("_pct")
    return (max if higher else min)(vals, key=lambda x: x[1])


def write_thp(w, out, metrics, med):
    """The four peers and lull's two THP variants, each cell with its ratio
    to glibc (where glibc's is not 0: coverage is 0 % without MADV_HUGEPAGE);
    lull-thp-auto against lull-thp-never and against the best peer; then the
    coverage after each churn round."""
    said = {}  # what the programs said (run 1 of each allocator)
    for log in sorted(glob.glob(os.path.join(out, "raw", "thp-*_r1.log"))):
        for key in ("thp_enabled", "thp_defrag", "tlb_counter", "config"):
            for line in info_lines(log, f"INFO thp {key} "):
                said.setdefault(key, set()).add(line)
        a = re.sub(r"^thp-(coverage|tlb)_(.*)_r1\.log$", r"\2", os.path.basename(log))
        for line in info_lines(log, "INFO thp lull_thp "):
            said.setdefault("lull_thp", set()).add(f"{a}: {line}")
    w(f"`{THP_NEVER}`, `{THP_AUTO}`: lull's library with `LULL_CONF=thp=never` and `thp=auto`. "
      f"`{GLIBC_HUGE}`: glibc with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (its heap advised MADV_HUGEPAGE), "
      "a reference for what coverage is worth on this machine, not a peer (not in \"best peer\"). "
      "Coverage: AnonHugePages / Anonymous of `/proc/self/smaps_rollup`, the whole process "
      "(coverage mode) or the heap alone (`tlb_heap_coverage_pct`). "
      "`coverage_alloc_pct`: after a heap of 64-4096 B objects is allocated; `churn_*`: over the rounds of "
      "free a random half, idle, allocate again (`_half_`: after the idle, the heap half free); "
      "`tlb_*`: random reads and writes of 64-256 B objects, in dependent chains.")
    w("")
    for key, title in (("thp_enabled", "THP enabled"), ("thp_defrag", "THP defrag"),
                       ("tlb_counter", "TLB counter"), ("lull_thp", "lull's thp key")):
        for line in sorted(said.get(key, ())):
            w(f"- {title}: `{line}`")
    for line in sorted(said.get("config", ())):
        w(f"- config: `{line}`")
    w("")
    present = [a for a in THP_ALLOCS if any(a in m["vals"] for m in metrics.values())]
    w("| metric | unit | " + " | ".join(present) + f" | {THP_AUTO}/{THP_NEVER} | {THP_AUTO}/best peer |")
    w("|---|---|" + "---|" * len(present) + "---|---|")
    rounds = []
    for name, m in sorted(metrics.items(), key=lambda kv: kv[1]["order"]):
        if THP_ROUND.match(name):
            rounds.append(name)
            continue
        unit = m["unit"]
        g = med.get(("thp", name, "glibc"))
        cells = []
        for a in present:
            v = med.get(("thp", name, a))
            if v is None:
                cells.append("-")
            elif a == "glibc" or not g:
                cells.append(fmt(v))
            else:
                cells.append(f"{fmt(v)} ({fmt_ratio(ratio(v, g))})")
        auto, never = med.get(("thp", name, THP_AUTO)), med.get(("thp", name, THP_NEVER))
        bp, bv = thp_best_peer(med, name, unit)
        vs_best = "-" if not bp or auto is None else (
            f"n/a ({bp}: 0)" if ratio(auto, bv) is None else f"{fmt_ratio(ratio(auto, bv))} ({bp})")
        w(f"| {name} | {unit} | " + " | ".join(cells) + f" | {fmt_ratio(ratio(auto, never))} | {vs_best} |")
    w("")
    if rounds:
        w("Coverage after each churn round's allocation (%, median over runs):")
        w("")
        w("| round | " + " | ".join(present) + " |")
        w("|---|" + "---|" * len(present))
        for name in rounds:
            n = int(re.search(r"\d+", name).group(0))
            w(f"| {n} | " + " | ".join(fmt(med.get(("thp", name, a))) for a in present) + " |")
        w("")
    if os.path.exists(os.path.join(out, "thp.png")):
        w("![thp.png](thp.png)")
        w("")


def thp_goal_rows(med):
    """Issue 16's goals, for lull-thp-auto (reported, not asserted)."""
    rows = []
    if not any(k[0] == "thp" for k in med):
        return rows
    for metric, target, text in (("coverage_alloc_pct", 90, "thp=auto: coverage after allocation >= 90 %"),
                                 ("churn_coverage_min_pct", 80,
                                  "thp=auto: coverage through the churn (its lowest round) >= 80 %")):
        v = med.get(("thp", metric, THP_AUTO))
        rows.append((text, "-" if v is None else f"{fmt(v)} %", f">= {target} %",
                     "not measured" if v is None else ("met" if v >= target else "not met")))
    # in operations per second of CPU time: the wall clock of one run moves
    # by 2x on the shared machine, the CPU time by 10-20 %
    text = "thp=auto: TLB-bound workload faster than thp=never and every peer (tlb_cpu_mops)"
    v = med.get(("thp", "tlb_cpu_mops", THP_AUTO))
    refs = [(a, med.get(("thp", "tlb_cpu_mops", a))) for a in PEERS + [THP_NEVER]]
    refs = [(a, r) for a, r in refs if r is not None]
    if v is None or not refs:
        rows.append((text, "-", "-", "not measured"))
    else:
        best = max(refs, key=lambda x: x[1])
        rows.append((text, f"{fmt(v)} Mops/s", f"> {fmt(best[1])} Mops/s ({best[0]}; now {fmt_ratio(v / best[1])})",
                     "met" if v > best[1] else "not met"))
    return rows


def write_summary(out, data, med):
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["scenario", "metric", "unit"] + ALLOCS + VARIANTS)
        for sc in SCENARIOS:
            for name, m in sorted(data.get(sc, {}).items(), key=lambda kv: kv[1]["order"]):
                row = [sc, name, m["unit"]]
                for a in ALLOCS + VARIANTS:
                    v = med.get((sc, name, a))
                    row.append("" if v is None else f"{v:.6g}")
                wr.writerow(row)


# ---- plots ------------------------------------------------------------------

PLOTS_BY_SCENARIO = {
    "stall": ["stall.png"],
    "throughput": ["throughput.png"],
    "latency": ["latency_cdf.png", "latency_rss.png"],
    "burst": ["burst_faults.png", "burst_rss.png"],
    "footprint": ["footprint.png"],
    "defrag": ["defrag_ratio.png", "defrag_moved.png"],
}


def raw_file(out, pattern, alloc):
    """The run-1 raw CSV of an allocator, if any."""
    p = os.path.join(out, "raw", pattern.format(a=alloc))
    return p if os.path.exists(p) and os.path.getsize(p) > 0 else None


def gp_lines(out, pattern, using, title_suffix="", style="lines lw 2"):
    parts = []
    for a in ALLOCS + [DELAY0]:
        p = raw_file(out, pattern, a)
        if p:
            parts.append(f"'{p}' using {using} with {style} lc rgb '{COLORS[a]}' title '{a}{title_suffix}'")
    return parts


def bars(out, med, sc, metrics, labels, fname, ylabel, logscale, ymin=0.1, allocs=None, ymax="*"):
    present = [a for a in (allocs or ALLOCS) if any(med.get((sc, m, a)) is not None for m in metrics)]
    if not present:
        return None
    dat = os.path.join(out, "raw", f"{fname}.dat")
    with open(dat, "w") as f:
        f.write("metric," + ",".join(present) + "\n")
        for m, lab in zip(metrics, labels):
            vals = []
            for a in present:
                v = med.get((sc, m, a))
                if v is None:
                    v = "NaN"
                elif logscale:
                    v = max(v, ymin)
                vals.append(str(v))
            f.write(f"\"{lab}\"," + ",".join(vals) + "\n")
    cols = ", ".join(
        f"'{dat}' using {i + 2}:xtic(1) title '{a}' lc rgb '{COLORS[a]}'" for i, a in enumerate(present))
    return f"""
set output '{os.path.join(out, fname + ".png")}'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set key top left
set ylabel '{ylabel}'
{'set logscale y' if logscale else 'unset logscale y'}
set yrange [{ymin if logscale else '0'}:{ymax}]
set grid ytics
plot {cols}
unset logscale
unset style data
set yrange [*:*]
"""


def plots(out, med):
    if not shutil.which("gnuplot"):
        print("report: gnuplot not found, no plots", file=sys.stderr)
        return
    gp = ["set terminal pngcairo size 1000,600 noenhanced font 'sans,10'", "set grid",
          "set datafile separator ','", "set key autotitle columnhead"]
    s = bars(out, med, "stall",
             ["free_large_us", "bulk_free_max_us", "churn_malloc_max_us", "churn_free_max_us"],
             ["free(large block)", "slowest free in bulk free", "slowest malloc in churn",
              "slowest free in churn"], "stall", "microseconds (log)", True)
    if s:
        gp.append("set title 'Stalls on the request thread (median of runs; lower is better)'")
        gp.append(s)
    s = bars(out, med, "throughput",
             ["st_mops", "mt_mops", "st_live300000_mops", "mt_live300000_mops",
              "st_live300000_touch_mops", "prodcons_mops", "larson_mops", "larson_live_mops",
              "larson_10_100_mops"],
             ["1 thread", "2 threads", "1 thread, 300k live", "2 threads, 300k live",
              "300k live, read before free", "producer/consumer", "larson", "larson-live",
              "larson 10-100 B"],
             "throughput",
             "million ops/s", False)
    if s:
        gp.append("set title 'Throughput (median of runs; higher is better)'")
        gp.append(s)
    fscs = footprint_scenarios(med)
    s = bars(out, med, "footprint", [f + FOOTPRINT_PEAK for f in fscs], fscs, "footprint",
             "peak RSS (MiB, log)", True, ymin=1)
    if s:
        gp.append("set title 'Footprint: peak RSS per scenario (median of runs; lower is better)'")
        gp.append("set xtics rotate by -25")  # the scenario names are long
        gp.append(s)
        gp.append("set xtics norotate")
    s = bars(out, med, "thp", ["coverage_alloc_pct", "churn_coverage_median_pct", "churn_coverage_min_pct",
                               "tlb_heap_coverage_pct"],
             ["after allocation", "churn: median round", "churn: lowest round", "TLB workload's heap"],
             "thp", "hugepage coverage (%)", False, allocs=THP_ALLOCS, ymax=100)
    if s:
        gp.append("set title 'Hugepage coverage, AnonHugePages / Anonymous (median of runs; higher is better)'")
        gp.append(s)
    lat = gp_lines(out, "latency_cdf_{a}_r1.csv", "1:((1-$2) > 0 ? 1-$2 : 1/0)")
    if lat:
        gp.append(f"""
set output '{os.path.join(out, "latency_cdf.png")}'
set title 'Request-thread malloc/free latency while another thread churns 64 MiB blocks (run 1)'
set logscale xy
set xlabel 'latency (ns)'
set ylabel 'fraction of calls slower (1 - CDF)'
set key top right
set format y '%g'
plot {", ".join(lat)}
unset logscale
set format y
""")
    for fname, pattern, title in (
            ("latency_rss.png", "latency_rss_{a}_r1.csv", "RSS during the latency scenario (run 1)"),
            ("burst_rss.png", "burst_rss_{a}_r1.csv", "RSS over the bursts and the final idle (run 1)")):
        ls = gp_lines(out, pattern, "1:2")
        if ls:
            gp.append(f"""
set output '{os.path.join(out, fname)}'
set title '{title}'
set xlabel 'time (s)'
set ylabel 'RSS (MiB)'
set key top right
plot {", ".join(ls)}
""")
    for fname, using, title, ylabel in (
            ("defrag_ratio.png", "($1/1000):4",
             "Fragmentation during active defrag: (RSS - RSS before the fill) / live (run 1)",
             "RSS / live"),
            ("defrag_moved.png", "($1/1000):5", "Bytes moved by active defrag (run 1)", "moved (MiB)")):
        ls = gp_lines(out, "defrag_ts_{a}_r1.csv", using)
        if ls:
            target = "1.10 with lines dt 2 lc rgb '#888888' title 'target 1.10', " if "ratio" in fname else ""
            gp.append(f"""
set output '{os.path.join(out, fname)}'
set title '{title}'
set xlabel 'time since the first defrag step (s)'
set ylabel '{ylabel}'
set key top right
plot {target}{", ".join(ls)}
""")
    ls = gp_lines(out, "burst_bursts_{a}_r1.csv", "1:($3 + 1)", style="linespoints lw 2 pt 7")
    if ls:
        gp.append(f"""
set output '{os.path.join(out, "burst_faults.png")}'
set title 'Minor faults of the request thread per burst (run 1; last burst follows the long idle)'
set xlabel 'burst'
set ylabel 'minor faults + 1 (log)'
set logscale y
set key top right
plot {", ".join(ls)}
unset logscale
""")
    script = "\n".join(gp)
    path = os.path.join(out, "raw", "plots.gp")
    with open(path, "w") as f:
        f.write(script + "\n")
    r = subprocess.run(["gnuplot", path], capture_output=True, text=True)
    if r.returncode != 0:
        print("report: gnuplot failed:\n" + r.stderr[-2000:], file=sys.stderr)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    out = sys.argv[1]
    status, data = load(out)
    med = medians(data)
    plots(out, med)
    write_summary(out, data, med)
    write_md(out, status, data, med)


if __name__ == "__main__":
    main()
