"""An allocation-heavy Python workload to run under LD_PRELOAD=liblull.so.

Dicts, lists, sets, big strings and bytes, threads (threading), a JSON round
trip, and objects made in one thread and dropped in another. Prints
"checksum <hex>" on stdout: the same with any allocator (it is compared with
a run without the preload). Exits 1 on an internal mismatch.
"""

import hashlib
import json
import queue
import sys
import threading
import zlib

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
THREADS = 4
digest = hashlib.sha256()


def check(cond, what):
    if not cond:
        sys.stderr.write("FAIL: %s\n" % what)
        sys.exit(1)


def dicts_and_lists(seed):
    d = {}
    for i in range(15000):
        d["k%d-%d" % (seed, i)] = [i, str(i * seed), (i, i * 2), {"n": i}]
    total = 0
    for k in list(d.keys())[::3]:
        total += d.pop(k)[0]
    lst = [x * x for x in range(50000)]
    lst.sort(key=lambda x: (x % 1000, x))
    s = set(range(0, 100000, 7)) ^ set(range(0, 100000, 11))
    nested = [[j for j in range(i % 50)] for i in range(2000)]
    return "%d:%d:%d:%d:%d:%d" % (
        len(d), total, lst[12345], len(s), sum(map(len, nested)), sum(lst[:1000])
    )


def big_strings(seed):
    parts = ["%08d:%s" % (i, "xyz" * (i % 17)) for i in range(25000)]
    s = "|".join(parts)
    s2 = s.replace("xyz", "ab").upper()
    b = s2.encode() * 3
    big = bytearray(b)
    for i in range(0, len(big), 4096):
        big[i] = (big[i] + seed) % 256
    chunks = [bytes(big[i : i + 65536]) for i in range(0, len(big), 65536)]
    joined = b"".join(reversed(chunks))
    huge = "q" * (32 * 1024 * 1024) + str(seed)  # one 32 MiB string
    return "%d:%d:%08x:%d" % (len(s), len(s2), zlib.crc32(joined), len(huge))


def json_round_trip(seed):
    doc = {
        "seed": seed,
        "items": [
            {"id": i, "name": "item-%d" % i, "tags": ["t%d" % (i % 7), "u%d" % (i % 5)],
             "vals": [i * 0.5, i * 1.25, -i], "ok": i % 2 == 0, "none": None}
            for i in range(8000)
        ],
        "nested": {"a" * (i % 30 + 1): {"b": list(range(i % 40))} for i in range(500)},
    }
    text = json.dumps(doc, sort_keys=True)
    back = json.loads(text)
    check(back == doc, "json round trip changed the document")
    text2 = json.dumps(back, sort_keys=True, indent=1)
    return "%d:%d:%s" % (len(text), len(text2), hashlib.sha256(text.encode()).hexdigest()[:16])


def worker(tid, results, handoff_out, handoff_in):
    out = []
    for r in range(ROUNDS):
        seed = tid * 100 + r
        out.append(dicts_and_lists(seed) if r % 3 == 0 else "")
        out.append(big_strings(seed) if r % 3 == 1 else "")
        out.append(json_round_trip(seed) if r % 3 == 2 else "")
        # Objects made here, dropped by the next thread.
        handoff_out.put({i: "v%d" % (i * seed) for i in range(10000)})
        got = handoff_in.get()
        out.append(str(sum(len(v) for v in got.values())))
        del got
    results[tid] = out


def main():
    results = [None] * THREADS
    queues = [queue.Queue() for _ in range(THREADS)]
    threads = [
        threading.Thread(target=worker, args=(t, results, queues[t], queues[(t + 1) % THREADS]))
        for t in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in range(THREADS):
        check(results[t] is not None, "thread %d did not finish" % t)
        for line in results[t]:
            digest.update(line.encode())
            digest.update(b"\n")
    print("checksum %s" % digest.hexdigest())


if __name__ == "__main__":
    main()
