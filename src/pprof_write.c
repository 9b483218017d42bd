/* The pprof encoder (src/pprof_write.h): a profile.proto message built in
 * memory, then gzip-compressed to the fd. Owns nothing past the call. The
 * message refers to every Location and Mapping by id and to every string by
 * its index in string_table, whose entry 0 is ""; mapping[0] is the main
 * executable, which is where `go tool pprof BINARY FILE` puts BINARY.
 * Locations carry addresses only: pprof symbolizes them from the mapped
 * files. Runs outside malloc, so it allocates freely. */
#define _GNU_SOURCE
#include "src/pprof_write.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* profile.proto's field numbers */
enum {
    PROFILE_SAMPLE_TYPE = 1,
    PROFILE_SAMPLE = 2,
    PROFILE_MAPPING = 3,
    PROFILE_LOCATION = 4,
    PROFILE_STRING_TABLE = 6,
    PROFILE_TIME_NANOS = 9,
    PROFILE_PERIOD_TYPE = 11,
    PROFILE_PERIOD = 12,
    PROFILE_DEFAULT_SAMPLE_TYPE = 14,
    VALUE_TYPE_TYPE = 1,
    VALUE_TYPE_UNIT = 2,
    SAMPLE_LOCATION_ID = 1,
    SAMPLE_VALUE = 2,
    MAPPING_ID = 1,
    MAPPING_MEMORY_START = 2,
    MAPPING_MEMORY_LIMIT = 3,
    MAPPING_FILE_OFFSET = 4,
    MAPPING_FILENAME = 5,
    MAPPING_BUILD_ID = 6,
    LOCATION_ID = 1,
    LOCATION_MAPPING_ID = 2,
    LOCATION_ADDRESS = 3,
};
enum { WIRE_VARINT = 0, WIRE_BYTES = 2 };

/* ---- a growable byte buffer and the protobuf wire format ------------------------ */

/* A failed allocation sets oom and makes every later append a no-op, so the
 * encoder checks once, at the end. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} pb_buf;

static bool pb_reserve(pb_buf *b, size_t more) {
    if (b->oom) return false;
    if (b->cap - b->len >= more) return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < more) {
        if (cap > SIZE_MAX / 2) return !(b->oom = true);
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return !(b->oom = true);
    b->p = p;
    b->cap = cap;
    return true;
}

static void pb_raw(pb_buf *b, const void *data, size_t n) {
    if (n && pb_reserve(b, n)) {
        memcpy(b->p + b->len, data, n);
        b->len += n;
    }
}

static void pb_varint(pb_buf *b, uint64_t v) {
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n++] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
        v >>= 7;
    } while (v);
    pb_raw(b, tmp, n);
}

/* int64 fields: a negative value is its two's complement, ten bytes */
static void pb_int(pb_buf *b, int field, uint64_t v) {
    pb_varint(b, (uint64_t)field << 3 | WIRE_VARINT);
    pb_varint(b, v);
}

static void pb_bytes(pb_buf *b, int field, const void *data, size_t n) {
    pb_varint(b, (uint64_t)field << 3 | WIRE_BYTES);
    pb_varint(b, n);
    pb_raw(b, data, n);
}

/* ---- string_table ---------------------------------------------------------------- */

/* Strings are appended to the message as they are first met (the order of
 * fields does not matter to a decoder; the order of string_table's entries
 * is their index); `at` remembers where each one's bytes lie, to find it
 * again. */
typedef struct {
    size_t *at, *len;
    size_t n, cap;
} strtab;

static int64_t intern(pb_buf *msg, strtab *t, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < t->n; i++)
        if (t->len[i] == n && !memcmp(msg->p + t->at[i], s, n)) return (int64_t)i;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 32;
        size_t *at = realloc(t->at, cap * sizeof *at);
        if (at) t->at = at;
        size_t *len = realloc(t->len, cap * sizeof *len);
        if (len) t->len = len;
        if (!at || !len) {
            msg->oom = true;
            return 0;
        }
        t->cap = cap;
    }
    pb_bytes(msg, PROFILE_STRING_TABLE, s, n);
    if (msg->oom) return 0;
    t->at[t->n] = msg->len - n;
    t->len[t->n] = n;
    return (int64_t)t->n++;
}

/* ---- mappings: /proc/self/maps ------------------------------------------------------ */

typedef struct {
    uintptr_t start, limit, offset;
    const char *file;   /* into the text of maps */
    uint64_t id;        /* ids follow the message's order: the main executable's first */
    char build_id[129]; /* hex; "" when not found */
} mapping;

typedef struct {
    char *text; /* the file's contents, lines cut at '\n' */
    mapping *m; /* in address order, as the file lists them */
    size_t n;
} maps;

/* The whole of a /proc file (its size is not known before reading it),
 * NUL-terminated; NULL with errno. */
static char *read_file(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t len = 0, cap = 16384;
    char *text = malloc(cap);
    while (text) {
        if (cap - len < 4096) {
            char *t = realloc(text, cap *= 2);
            if (!t) free(text);
            text = t;
            continue;
        }
        ssize_t got = read(fd, text + len, cap - len - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            free(text);
            text = NULL;
        }
        if (got <= 0) break;
        len += (size_t)got;
    }
    int err = text ? 0 : errno ? errno : ENOMEM;
    close(fd);
    if (!text)
        errno = err;
    else
        text[len] = '\0';
    return text;
}

/* The executable file-backed mappings: only code is in a stack, and pprof
 * needs the file to symbolize it. */
static int maps_read(maps *out) {
    *out = (maps){0};
    out->text = read_file("/proc/self/maps");
    if (!out->text) return -1;
    size_t cap = 0;
    for (char *line = out->text, *next; *line; line = next) {
        char *eol = strchr(line, '\n');
        next = eol ? eol + 1 : line + strlen(line);
        if (eol) *eol = '\0';
        unsigned long start, limit, offset;
        char perms[5];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %4s %lx %*s %*u %n", &start, &limit, perms, &offset, &path_at) <
                4 ||
            !path_at || perms[2] != 'x' || line[path_at] != '/')
            continue;
        if (out->n == cap) {
            cap = cap ? 2 * cap : 16;
            mapping *m = realloc(out->m, cap * sizeof *m);
            if (!m) return -1;
            out->m = m;
        }
        out->m[out->n++] =
            (mapping){.start = start, .limit = limit, .offset = offset, .file = line + path_at};
    }
    return 0;
}

/* The build id of each loaded object, from its PT_NOTE segments in memory:
 * no file is opened. A mapping takes the id of the object whose executable
 * PT_LOAD segment it lies in. */
static int build_id_of_object(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    maps *mp = arg;
    char hex[sizeof mp->m[0].build_id] = "";
    for (int i = 0; i < info->dlpi_phnum && !hex[0]; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) continue;
        const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
        const uint8_t *end = p + ph->p_memsz;
        /* a note's name and desc are padded to the segment's alignment: 4,
         * or 8 where the linker put .note.gnu.property */
        size_t pad = ph->p_align == 8 ? 7 : 3;
        while ((size_t)(end - p) >= sizeof(ElfW(Nhdr))) {
            const ElfW(Nhdr) *nh = (const void *)p;
            size_t name = (nh->n_namesz + pad) & ~pad, desc = (nh->n_descsz + pad) & ~pad;
            const uint8_t *d = p + sizeof *nh + name;
            if ((size_t)(end - p) - sizeof *nh < name + desc) break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
                !memcmp(p + sizeof *nh, "GNU", 4) && 2 * nh->n_descsz < sizeof hex) {
                for (size_t k = 0; k < nh->n_descsz; k++)
                    snprintf(hex + 2 * k, 3, "%02x", d[k]);
                break;
            }
            p = d + desc;
        }
    }
    if (!hex[0]) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        for (size_t k = 0; k < mp->n; k++)
            if (mp->m[k].start < hi && mp->m[k].limit > lo)
                memcpy(mp->m[k].build_id, hex, sizeof hex);
    }
    return 0;
}

/* Ids in the order written: the main executable's mappings first (pprof
 * takes mapping[0] for it), then the others in address order. */
static void maps_number(maps *mp) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    uint64_t id = 1;
    for (int main_pass = 1; main_pass >= 0; main_pass--)
        for (size_t i = 0; i < mp->n; i++)
            if ((strcmp(mp->m[i].file, exe) == 0) == main_pass) mp->m[i].id = id++;
}

static uint64_t mapping_id_of(const maps *mp, uintptr_t pc) {
    size_t lo = 0, hi = mp->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pc < mp->m[mid].start)
            hi = mid;
        else if (pc >= mp->m[mid].limit)
            lo = mid + 1;
        else
            return mp->m[mid].id;
    }
    return 0; /* unknown: allowed, the Location keeps only its address */
}

/* ---- the message -------------------------------------------------------------------- */

static int cmp_pc(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

/* location id of pc: its index in the sorted distinct pcs, plus one */
static uint64_t location_id_of(const uintptr_t *pcs, size_t n, uintptr_t pc) {
    const uintptr_t *hit = bsearch(&pc, pcs, n, sizeof *pcs, cmp_pc);
    return hit ? (uint64_t)(hit - pcs) + 1 : 0;
}

static void value_type(pb_buf *msg, pb_buf *sub, int field, int64_t type, int64_t unit) {
    sub->len = 0;
    pb_int(sub, VALUE_TYPE_TYPE, (uint64_t)type);
    pb_int(sub, VALUE_TYPE_UNIT, (uint64_t)unit);
    pb_bytes(msg, field, sub->p, sub->len);
}

static void encode(pb_buf *msg, pb_buf *sub, strtab *st, const lull_profile_record *records,
                   size_t n, const uintptr_t *pcs, size_t npcs, const maps *mp,
                   int64_t period_bytes, int64_t time_nanos) {
    intern(msg, st, ""); /* index 0 */
    static const char *const types[6][2] = {{"alloc_objects", "count"}, {"alloc_space", "bytes"},
                                            {"inuse_objects", "count"}, {"inuse_space", "bytes"},
                                            {"peak_objects", "count"},  {"peak_space", "bytes"}};
    for (int i = 0; i < 6; i++)
        value_type(msg, sub, PROFILE_SAMPLE_TYPE, intern(msg, st, types[i][0]),
                   intern(msg, st, types[i][1]));
    value_type(msg, sub, PROFILE_PERIOD_TYPE, intern(msg, st, "space"), intern(msg, st, "bytes"));
    pb_int(msg, PROFILE_PERIOD, (uint64_t)period_bytes);
    pb_int(msg, PROFILE_TIME_NANOS, (uint64_t)time_nanos);
    pb_int(msg, PROFILE_DEFAULT_SAMPLE_TYPE, (uint64_t)intern(msg, st, "inuse_space"));

    pb_buf packed = {0};
    for (size_t r = 0; r < n; r++) {
        const lull_profile_record *rec = &records[r];
        uint32_t depth = rec->depth < LULL_PROFILE_MAX_DEPTH ? rec->depth : LULL_PROFILE_MAX_DEPTH;
        sub->len = 0;
        packed.len = 0; /* proto3 packs repeated scalars: one length, then the varints */
        for (uint32_t d = 0; d < depth; d++)
            pb_varint(&packed, location_id_of(pcs, npcs, rec->pc[d]));
        pb_bytes(sub, SAMPLE_LOCATION_ID, packed.p, packed.len);
        const int64_t v[6] = {rec->alloc_objects, rec->alloc_space,  rec->inuse_objects,
                              rec->inuse_space,   rec->peak_objects, rec->peak_space};
        packed.len = 0;
        for (int i = 0; i < 6; i++)
            pb_varint(&packed, (uint64_t)v[i]);
        pb_bytes(sub, SAMPLE_VALUE, packed.p, packed.len);
        if (packed.oom) sub->oom = true;
        pb_bytes(msg, PROFILE_SAMPLE, sub->p, sub->len);
    }
    free(packed.p);
    if (packed.oom) msg->oom = true;

    /* in the order of their ids, which is the main executable's first */
    for (uint64_t id = 1; id <= mp->n; id++) {
        const mapping *m = mp->m;
        while (m->id != id)
            m++;
        int64_t file = intern(msg, st, m->file);
        int64_t build_id = m->build_id[0] ? intern(msg, st, m->build_id) : 0;
        sub->len = 0;
        pb_int(sub, MAPPING_ID, m->id);
        pb_int(sub, MAPPING_MEMORY_START, m->start);
        pb_int(sub, MAPPING_MEMORY_LIMIT, m->limit);
        pb_int(sub, MAPPING_FILE_OFFSET, m->offset);
        pb_int(sub, MAPPING_FILENAME, (uint64_t)file);
        if (build_id) pb_int(sub, MAPPING_BUILD_ID, (uint64_t)build_id);
        pb_bytes(msg, PROFILE_MAPPING, sub->p, sub->len);
    }

    for (size_t i = 0; i < npcs; i++) {
        sub->len = 0;
        pb_int(sub, LOCATION_ID, i + 1);
        uint64_t mid = mapping_id_of(mp, pcs[i]);
        if (mid) pb_int(sub, LOCATION_MAPPING_ID, mid);
        pb_int(sub, LOCATION_ADDRESS, pcs[i]);
        pb_bytes(msg, PROFILE_LOCATION, sub->p, sub->len);
    }
    if (sub->oom) msg->oom = true;
}

/* ---- gzip to the fd ----------------------------------------------------------------- */

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* zlib, loaded at the first dump: linked into liblull.so, libz.so.1 was
 * mapped into every process lull is preloaded in, and a preloaded
 * /bin/true took 7 page faults more (fork+exec is a goal of its own). A
 * dump runs outside malloc, where dlopen may allocate. */
static struct {
    int (*init2)(z_streamp, int, int, int, int, int, const char *, int);
    int (*deflate)(z_streamp, int);
    int (*end)(z_streamp);
} zlib;

static bool zlib_loaded(void) {
    if (__atomic_load_n(&zlib.end, __ATOMIC_ACQUIRE)) return true;
    void *h = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    zlib.init2 =
        (int (*)(z_streamp, int, int, int, int, int, const char *, int))dlsym(h, "deflateInit2_");
    zlib.deflate = (int (*)(z_streamp, int))dlsym(h, "deflate");
    int (*end)(z_streamp) = (int (*)(z_streamp))dlsym(h, "deflateEnd");
    if (!zlib.init2 || !zlib.deflate || !end) return false;
    __atomic_store_n(&zlib.end, end, __ATOMIC_RELEASE);
    return true;
}

static int gzip_to_fd(int fd, const uint8_t *data, size_t len) {
    if (!zlib_loaded()) {
        errno = ENOSYS; /* no libz.so.1 on this system */
        return -1;
    }
    z_stream z = {0};
    /* windowBits 15 + 16: a gzip header and trailer, which pprof expects */
    int rc = zlib.init2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY,
                        ZLIB_VERSION, (int)sizeof(z_stream));
    if (rc != Z_OK) {
        errno = rc == Z_MEM_ERROR ? ENOMEM : EINVAL; /* else a libz older than zlib.h */
        return -1;
    }
    uint8_t out[16384];
    int ret = 0;
    z.next_in = (Bytef *)data;
    while (rc != Z_STREAM_END && ret == 0) {
        /* avail_in is 32 bits: a message past 4 GiB goes in pieces */
        if (z.avail_in == 0 && len) {
            z.avail_in = len > UINT_MAX ? UINT_MAX : (uInt)len;
            len -= z.avail_in;
        }
        z.next_out = out;
        z.avail_out = sizeof out;
        rc = zlib.deflate(&z, len ? Z_NO_FLUSH : Z_FINISH);
        if (rc == Z_STREAM_ERROR) {
            errno = EINVAL;
            ret = -1;
        } else if (write_all(fd, out, sizeof out - z.avail_out) != 0) {
            ret = -1;
        }
    }
    int err = errno;
    zlib.end(&z);
    errno = err;
    return ret;
}

int lull_pprof_write(int fd, const lull_profile_record *records, size_t n, int64_t period_bytes,
                     int64_t time_nanos) {
    int ret = -1, err = ENOMEM;
    pb_buf msg = {0}, sub = {0};
    strtab st = {0};
    maps mp = {0};
    uintptr_t *pcs = NULL;
    size_t npcs = 0;

    if (n > SIZE_MAX / sizeof *pcs / LULL_PROFILE_MAX_DEPTH) goto out;
    pcs = malloc(n * LULL_PROFILE_MAX_DEPTH * sizeof *pcs + 1); /* + 1: n may be 0 */
    if (!pcs) goto out;
    for (size_t r = 0; r < n; r++)
        for (uint32_t d = 0; d < records[r].depth && d < LULL_PROFILE_MAX_DEPTH; d++)
            pcs[npcs++] = records[r].pc[d];
    qsort(pcs, npcs, sizeof *pcs, cmp_pc);
    size_t distinct = 0;
    for (size_t i = 0; i < npcs; i++)
        if (i == 0 || pcs[i] != pcs[distinct - 1]) pcs[distinct++] = pcs[i];
    npcs = distinct;

    if (maps_read(&mp) != 0) {
        err = errno ? errno : ENOMEM;
        goto out;
    }
    dl_iterate_phdr(build_id_of_object, &mp);
    maps_number(&mp);

    encode(&msg, &sub, &st, records, n, pcs, npcs, &mp, period_bytes, time_nanos);
    if (msg.oom) goto out;
    if (gzip_to_fd(fd, msg.p, msg.len) != 0) {
        err = errno;
        goto out;
    }
    ret = 0;
out:
    free(pcs);
    free(mp.m);
    free(mp.text);
    free(st.at);
    free(st.len);
    free(sub.p);
    free(msg.p);
    if (ret) errno = err;
    return ret;
}
