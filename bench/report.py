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
a table of its own: lull-hard against lull-nohard.
Nothing here asserts anything: the goals section only reports.
"""
import csv
import glob
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
VARIANTS = [DELAY0, HARD, NOHARD]
SCENARIOS = ["stall", "throughput", "callgrind", "latency", "burst", "redis", "hardening", "forkexec"]
HIGHER_BETTER = {"Mops/s", "req/s"}
INFO_UNITS = {"requests", "pairs", "blocks", "%"}

TITLES = {
    "stall": "Stalls: free of a large block, bulk free, later churn, RSS",
    "throughput": "Throughput (small blocks, 16-1024 B)",
    "callgrind": "Instructions per malloc+free pair (callgrind)",
    "latency": "Request-thread latency while another thread churns 64 MiB blocks",
    "burst": "Refault churn between bursts",
    "redis": "redis-server",
    "hardening": "Hardening: lull with and without its double-free check (issue #8)",
    "forkexec": "fork + execve(/bin/true) + waitpid from a process with a small heap",
}

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
    ("burst", "rss_after_idle_mib", "rss_goal_base", None,
     "RSS after the long idle <= live * 1.05 + 8 MiB (live: rss_base_mib)"),
    ("forkexec", "forkexec_us_median", "<=glibc*", 1.3, "fork+exec+wait median <= 1.3 x glibc (issue 12)"),
]

COLORS = {"glibc": "#444444", "jemalloc": "#1f77b4", "mimalloc": "#2ca02c",
          "tcmalloc": "#ff7f0e", "lull": "#d62728", DELAY0: "#e377c2"}


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


def best_peer(med, sc, metric, unit):
    vals = [(a, med.get((sc, metric, a))) for a in PEERS]
    vals = [(a, v) for a, v in vals if v is not None]
    if not vals or unit in INFO_UNITS:
        return None, None
    if unit in HIGHER_BETTER:
        return max(vals, key=lambda x: x[1])
    return min(vals, key=lambda x: x[1])


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
    rows = []
    lull_ok = status.get("lull", ("missing",))[0] == "ok"
    for sc, metric, op, target, text in expand_goals(data):
        v = med.get((sc, metric, "lull"))
        unit = data_units.get((sc, metric), "")
        if not lull_ok or v is None:
            rows.append((text, "-", "-", "lull missing" if not lull_ok else "not measured"))
            continue
        target_text = None  # the target column, when not "<= goal"
        if op == "<=":
            goal, met = target, v <= target
        elif op in ("rss_goal", "rss_goal_base"):
            # live: stall's rss_live_mib; burst: the RSS before the first burst
            live = med.get((sc, "rss_live_mib" if op == "rss_goal" else "rss_base_mib", "lull"))
            goal = None if live is None else live * 1.05 + 8
            met = goal is not None and v <= goal
        elif op == "<peers":
            # strictly fewer than the lowest peer
            bp, goal = best_peer(med, sc, metric, unit)
            met = None if goal is None else v < goal
            target_text = f"< {fmt(goal)} {unit} ({bp})" if goal is not None else None
        elif op == "<=delay0*":
            ref = med.get((sc, metric, DELAY0))
            goal = None if ref is None else ref * target
            met = None if goal is None else v <= goal
            if goal is not None:
                target_text = f"{fmt(goal)} {unit} ({target:g} x {fmt(ref)})"
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
            target_text = f"{fmt(goal)} {unit}" if goal is not None else "-"
        rows.append((text, f"{fmt(v)} {unit}", target_text,
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
        for png in PLOTS_BY_SCENARIO.get(sc, []):
            if os.path.exists(os.path.join(out, png)):
                w(f"![{png}]({png})")
                w("")
    w("## Goals for lull (reported, not asserted)")
    w("")
    w("| goal | lull | target | status |")
    w("|---|---|---|---|")
    for text, v, goal, st in goal_rows(med, status, data):
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


def bars(out, med, sc, metrics, labels, fname, ylabel, logscale):
    present = [a for a in ALLOCS if any(med.get((sc, m, a)) is not None for m in metrics)]
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
                    v = max(v, 0.1)
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
set yrange [{'0.1' if logscale else '0'}:*]
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
             ["st_mops", "mt_mops", "prodcons_mops", "larson_mops", "larson_live_mops", "larson_10_100_mops"],
             ["1 thread", "2 threads", "producer/consumer", "larson", "larson-live", "larson 10-100 B"],
             "throughput",
             "million ops/s", False)
    if s:
        gp.append("set title 'Throughput (median of runs; higher is better)'")
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
