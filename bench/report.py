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
Nothing here asserts anything: the goals section only reports.
"""
import csv
import os
import shutil
import statistics
import subprocess
import sys

ALLOCS = ["glibc", "jemalloc", "mimalloc", "tcmalloc", "lull"]
PEERS = ["glibc", "jemalloc", "mimalloc", "tcmalloc"]
SCENARIOS = ["stall", "throughput", "callgrind", "latency", "burst", "redis"]
HIGHER_BETTER = {"Mops/s", "req/s"}
INFO_UNITS = {"requests", "pairs", "blocks"}

TITLES = {
    "stall": "Stalls: free of a large block, bulk free, later churn, RSS",
    "throughput": "Throughput (small blocks, 16-1024 B)",
    "callgrind": "Instructions per malloc+free pair (callgrind)",
    "latency": "Request-thread latency while another thread churns 64 MiB blocks",
    "burst": "Refault churn between bursts",
    "redis": "redis-server",
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
    ("throughput", "larson_mops", ">=mimalloc*", 0.9, "larson-like throughput >= 90 % of mimalloc"),
    ("callgrind", "fixed32_instr_per_pair", "<=mimalloc*", 1.0, "instructions per malloc(32)+free <= mimalloc"),
    ("latency", "op_p99", "<=glibc*", 1.0, "request-thread p99 <= glibc"),
    ("latency", "op_p999", "<=glibc*", 1.0, "request-thread p99.9 <= glibc"),
    ("latency", "op_p9999", "<=glibc*", 1.0, "request-thread p99.99 <= glibc"),
    ("latency", "op_max", "<=glibc*", 1.0, "request-thread max <= glibc"),
]

COLORS = {"glibc": "#444444", "jemalloc": "#1f77b4", "mimalloc": "#2ca02c",
          "tcmalloc": "#ff7f0e", "lull": "#d62728"}


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
            parts = line.split()
            if len(parts) >= 2:
                status[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
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


def goal_rows(med, status, data):
    data_units = {(sc, name): m["unit"] for sc, ms in data.items() for name, m in ms.items()}
    rows = []
    lull_ok = status.get("lull", ("missing",))[0] == "ok"
    for sc, metric, op, target, text in GOALS:
        v = med.get((sc, metric, "lull"))
        if not lull_ok or v is None:
            rows.append((text, "-", "-", "lull missing" if not lull_ok else "not measured"))
            continue
        if op == "<=":
            goal, met = target, v <= target
        elif op == "rss_goal":
            live = med.get((sc, "rss_live_mib", "lull"))
            goal = None if live is None else live * 1.05 + 8
            met = goal is not None and v <= goal
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
        unit = data_units.get((sc, metric), "")
        rows.append((text, f"{fmt(v)} {unit}", f"{fmt(goal)} {unit}" if goal is not None else "-",
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
    for a in ALLOCS:
        st, lib = status.get(a, ("not run", ""))
        w(f"| {a} | {st} | `{lib or '(none: default)'}` |")
    w("")
    for sc in SCENARIOS:
        if sc not in data:
            continue
        w(f"## {TITLES.get(sc, sc)}")
        w("")
        w("| metric | unit | " + " | ".join(ALLOCS) + " | lull/glibc | lull/best peer |")
        w("|---|---|" + "---|" * len(ALLOCS) + "---|---|")
        for name, m in sorted(data[sc].items(), key=lambda kv: kv[1]["order"]):
            unit = m["unit"]
            g = med.get((sc, name, "glibc"))
            cells = []
            for a in ALLOCS:
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
            w(f"| {name} | {unit} | " + " | ".join(cells) + f" | {fmt_ratio(ratio(lv, g))} | {vs_best} |")
        w("")
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


def write_summary(out, data, med):
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["scenario", "metric", "unit"] + ALLOCS)
        for sc in SCENARIOS:
            for name, m in sorted(data.get(sc, {}).items(), key=lambda kv: kv[1]["order"]):
                row = [sc, name, m["unit"]]
                for a in ALLOCS:
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
    for a in ALLOCS:
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
    s = bars(out, med, "throughput", ["st_mops", "mt_mops", "prodcons_mops", "larson_mops"],
             ["1 thread", "2 threads", "producer/consumer", "larson-like"], "throughput",
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
    ls = gp_lines(out, "burst_bursts_{a}_r1.csv", "1:3", style="linespoints lw 2 pt 7")
    if ls:
        gp.append(f"""
set output '{os.path.join(out, "burst_faults.png")}'
set title 'Minor faults of the request thread per burst (run 1; last burst follows the long idle)'
set xlabel 'burst'
set ylabel 'minor faults'
set key top right
plot {", ".join(ls)}
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
