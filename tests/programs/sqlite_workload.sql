-- A large transaction for the sqlite3 shell, run under LD_PRELOAD=liblull.so
-- and without it: the output must be the same.
PRAGMA cache_size = -65536;
PRAGMA temp_store = MEMORY;
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, s TEXT NOT NULL, b BLOB);
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)
INSERT INTO t(k, s, b)
SELECT (x * 7919) % 10007,
       printf('row-%08d-%s', x, hex(x * x)) || substr('abcdefghijklmnopqrstuvwxyz', 1 + x % 26),
       CASE WHEN x % 50 = 0 THEN zeroblob(x % 4000) ELSE NULL END
FROM c;
CREATE INDEX t_k ON t(k);
CREATE INDEX t_s ON t(s DESC);
UPDATE t SET s = s || '-u' WHERE k % 13 = 0;
DELETE FROM t WHERE id % 97 = 0;
COMMIT;
SELECT count(*), sum(k), sum(length(s)), total(length(b)) FROM t;
SELECT k, count(*), min(s), max(s) FROM t GROUP BY k ORDER BY count(*) DESC, k LIMIT 5;
SELECT count(DISTINCT k), count(DISTINCT substr(s, -3)) FROM t;
SELECT group_concat(id, ',') FROM (SELECT id FROM t ORDER BY s DESC LIMIT 20);
SELECT length(group_concat(s, '')) FROM t WHERE k < 500;
SELECT a.k, count(*) FROM t AS a JOIN t AS b ON a.k = b.k AND b.id % 1000 = 1 GROUP BY a.k ORDER BY a.k LIMIT 3;
PRAGMA integrity_check;
