/*
 * The C API's executing paths, for valgrind memcheck on the x86-64 host (run by
 * ffi/check.sh): JIT-compiled code from the x86-64 plugin really runs — sandboxed and
 * trusted, with a host region, a helper, an out-of-bounds stop, a budget stop and an unknown
 * callx stop, maps (host operations, a ring buffer a program writes and the host consumes,
 * a tail call through a prog-array slot set from C, an LPM trie from the host and from a
 * program) — then everything is freed. Memcheck must see no invalid access and no leak.
 *
 *   run X86_64_PLUGIN
 *
 * Exits 0 when every call behaved as expected; prints one line per failed expectation.
 */
#include "packjit.h"

#include <stdio.h>
#include <string.h>

static int failures;

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,              \
                   packjit_last_error());                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define INSN(op, dst, src, off, imm)                                                             \
    (uint8_t)(op), (uint8_t)(((src) << 4) | (dst)), (uint8_t)((off) & 0xff),                    \
        (uint8_t)(((off) >> 8) & 0xff), (uint8_t)((imm) & 0xff), (uint8_t)(((imm) >> 8) & 0xff), \
        (uint8_t)(((imm) >> 16) & 0xff), (uint8_t)(((uint32_t)(imm) >> 24) & 0xff)

/* A helper that reads the buffer the program points it at, after checking the program may. */
static uint64_t sum_bytes(uint64_t addr, uint64_t len, uint64_t c, uint64_t d, uint64_t e)
{
    const uint8_t *p = (const uint8_t *)(uintptr_t)addr;
    uint64_t s = 0, i;
    (void)c;
    (void)d;
    (void)e;
    if (!packjit_helper_access_ok(addr, len, 0))
        return (uint64_t)-1;
    for (i = 0; i < len; i++)
        s += p[i];
    return s;
}

/* r0 = sum of the 16 context bytes via the helper (r1 = ctx, r2 = 16 already). */
static const uint8_t p_helper[] = {INSN(0x85, 0, 0, 0, 1), INSN(0x95, 0, 0, 0, 0)};
/* r0 = *(u64 *)(ctx + 8) + *(u64 *)(region) ; *(u64 *)(region + 8) = r0 */
static uint8_t p_region[] = {INSN(0x79, 0, 1, 8, 0),
                             INSN(0x18, 2, 0, 0, 0), INSN(0, 0, 0, 0, 0), /* lddw r2, region */
                             INSN(0x79, 3, 2, 0, 0), INSN(0x0f, 0, 3, 0, 0),
                             INSN(0x7b, 2, 0, 8, 0), INSN(0x95, 0, 0, 0, 0)};
/* *(u64 *)(ctx + 16) = 1: one word past a 16-byte context */
static const uint8_t p_oob[] = {INSN(0x7a, 1, 0, 16, 1), INSN(0xb7, 0, 0, 0, 0),
                                INSN(0x95, 0, 0, 0, 0)};
/* ja -1 */
static const uint8_t p_spin[] = {INSN(0x05, 0, 0, -1, 0), INSN(0x95, 0, 0, 0, 0)};
/* r1 = 77; callx r1 */
static const uint8_t p_callx[] = {INSN(0xb7, 1, 0, 0, 77), INSN(0x8d, 1, 0, 0, 0),
                                  INSN(0x95, 0, 0, 0, 0)};

/* bpf_ringbuf_output(map 0, ctx, 16, 0) */
static const uint8_t p_ring[] = {INSN(0xbf, 2, 1, 0, 0),
                                 INSN(0x18, 1, 1, 0, 0), INSN(0, 0, 0, 0, 0), /* lddw r1, map 0 */
                                 INSN(0xb7, 3, 0, 0, 16), INSN(0xb7, 4, 0, 0, 0),
                                 INSN(0x85, 0, 0, 0, 130), INSN(0x95, 0, 0, 0, 0)};
/* bpf_tail_call(ctx, map 1, 0); return 7 */
static const uint8_t p_tail[] = {INSN(0x18, 2, 1, 0, 1), INSN(0, 0, 0, 0, 0), /* lddw r2, map 1 */
                                 INSN(0xb7, 3, 0, 0, 0), INSN(0x85, 0, 0, 0, 12),
                                 INSN(0xb7, 0, 0, 0, 7), INSN(0x95, 0, 0, 0, 0)};

/* r0 = bpf_map_lookup_elem(map 0, ctx) ? *(u32 *)r0 : 0 — a longest-prefix match on the key
 * the context holds (sandboxed: the value pointer is checked like any other). */
static const uint8_t p_lpm[] = {INSN(0xbf, 2, 1, 0, 0),
                                INSN(0x18, 1, 1, 0, 0), INSN(0, 0, 0, 0, 0), /* lddw r1, map 0 */
                                INSN(0x85, 0, 0, 0, 1), INSN(0x15, 0, 0, 1, 0),
                                INSN(0x61, 0, 0, 0, 0), INSN(0x95, 0, 0, 0, 0)};

/* An LPM trie key for IPv4: the prefix length in host order, then the address bytes. */
struct lpm_v4 {
    uint32_t prefixlen;
    uint8_t addr[4];
};

static struct lpm_v4 v4(uint32_t prefixlen, uint8_t a, uint8_t b, uint8_t c, uint8_t d)
{
    struct lpm_v4 k;
    k.prefixlen = prefixlen;
    k.addr[0] = a;
    k.addr[1] = b;
    k.addr[2] = c;
    k.addr[3] = d;
    return k;
}

/* An LPM trie from C: nested prefixes, longest-prefix lookups from the host and from a
 * program, iteration, a delete that splices an inner node out, the errnos, then frees (the
 * program keeps the trie until it is freed itself). */
static void lpm(PackjitRuntime *rt)
{
    PackjitMap *t = NULL;
    PackjitProgram *p = NULL;
    PackjitLoadOptions opts;
    const PackjitMap *maps_of_p[1];
    struct lpm_v4 k, next;
    uint32_t v, got = 0, seen = 0;
    uint64_t r0 = 0;
    int steps = 0, rc;

    EXPECT(packjit_map_create(PACKJIT_MAP_TYPE_LPM_TRIE, sizeof k, 4, 16, 0, "nopre", &t) ==
               PJ_ERR_INVALID_ARGUMENT &&
           t == NULL);
    EXPECT(packjit_map_create(PACKJIT_MAP_TYPE_LPM_TRIE, sizeof k, 4, 16,
                              PACKJIT_BPF_F_NO_PREALLOC, "routes", &t) == PJ_OK);
    if (t == NULL)
        return;
    k = v4(8, 10, 0, 0, 0), v = 8;
    EXPECT(packjit_map_update(t, &k, sizeof k, &v, 4, PACKJIT_BPF_ANY) == 0);
    k = v4(16, 10, 1, 0, 0), v = 16;
    EXPECT(packjit_map_update(t, &k, sizeof k, &v, 4, PACKJIT_BPF_NOEXIST) == 0);
    EXPECT(packjit_map_update(t, &k, sizeof k, &v, 4, PACKJIT_BPF_NOEXIST) == -17 /* EEXIST */);
    k = v4(24, 10, 1, 2, 0), v = 24;
    EXPECT(packjit_map_update(t, &k, sizeof k, &v, 4, PACKJIT_BPF_ANY) == 0);
    k = v4(33, 10, 1, 2, 3);
    EXPECT(packjit_map_update(t, &k, sizeof k, &v, 4, PACKJIT_BPF_ANY) == -22 /* EINVAL */);

    k = v4(32, 10, 1, 2, 3);
    EXPECT(packjit_map_lookup(t, &k, sizeof k, &got, 4) == 0 && got == 24);
    k = v4(32, 10, 1, 9, 9);
    EXPECT(packjit_map_lookup(t, &k, sizeof k, &got, 4) == 0 && got == 16);
    k = v4(32, 11, 0, 0, 0);
    EXPECT(packjit_map_lookup(t, &k, sizeof k, &got, 4) == -2 /* ENOENT */);

    EXPECT(packjit_load_options_init(&opts) == PJ_OK);
    maps_of_p[0] = t;
    opts.maps = maps_of_p;
    opts.map_count = 1;
    EXPECT(packjit_program_load(rt, p_lpm, sizeof p_lpm, &opts, &p) == PJ_OK);
    k = v4(32, 10, 1, 2, 200);
    EXPECT(packjit_program_run(p, &k, sizeof k, &r0) == PJ_OK && r0 == 24);
    k = v4(32, 10, 200, 0, 0);
    EXPECT(packjit_program_run(p, &k, sizeof k, &r0) == PJ_OK && r0 == 8);
    k = v4(32, 192, 168, 0, 1);
    EXPECT(packjit_program_run(p, &k, sizeof k, &r0) == PJ_OK && r0 == 0);

    /* Every prefix once, then the end. */
    rc = packjit_map_next_key(t, NULL, 0, &next, sizeof next);
    while (rc == 0 && steps < 8) {
        EXPECT(packjit_map_lookup(t, &next, sizeof next, &got, 4) == 0 &&
               got == next.prefixlen);
        seen |= 1u << (next.prefixlen / 8);
        k = next;
        rc = packjit_map_next_key(t, &k, sizeof k, &next, sizeof next);
        steps++;
    }
    EXPECT(rc == -2 && steps == 3 && seen == ((1u << 1) | (1u << 2) | (1u << 3)));

    /* Deleting the /16 leaves 10.1.2.0/24 and 10.0.0.0/8 reachable through the trie. */
    k = v4(16, 10, 1, 0, 0);
    EXPECT(packjit_map_delete(t, &k, sizeof k) == 0);
    EXPECT(packjit_map_delete(t, &k, sizeof k) == -2);
    k = v4(32, 10, 1, 9, 9);
    EXPECT(packjit_program_run(p, &k, sizeof k, &r0) == PJ_OK && r0 == 8);
    k = v4(32, 10, 1, 2, 3);
    EXPECT(packjit_program_run(p, &k, sizeof k, &r0) == PJ_OK && r0 == 24);
    packjit_map_free(t); /* the program keeps the trie */
    k = v4(32, 10, 1, 2, 3);
    EXPECT(packjit_program_run(p, &k, sizeof k, &r0) == PJ_OK && r0 == 24);
    packjit_program_free(p);
}

static void on_record(void *user, const void *data, size_t len)
{
    uint64_t *sum = user, w;
    if (len != 16)
        return;
    memcpy(&w, data, 8);
    *sum += w;
    memcpy(&w, (const uint8_t *)data + 8, 8);
    *sum += w;
}

/* Maps from C: host operations with their errnos, a ring buffer a program writes, a tail call
 * through a slot set from C; the handles are freed in an order that leaves the maps to the
 * programs for a while. */
static void maps(PackjitRuntime *rt)
{
    PackjitMap *h = NULL, *rb = NULL, *pa = NULL, *h2 = NULL;
    PackjitProgram *ring = NULL, *tail = NULL;
    PackjitLoadOptions opts;
    const PackjitMap *ring_maps[1], *tail_maps[2];
    uint32_t k = 1, next;
    uint64_t v = 42, got = 0, sum = 0, r0 = 0, ctx[2] = {5, 6};
    size_t size = 0;

    EXPECT(packjit_map_create(PACKJIT_MAP_TYPE_HASH, 4, 8, 8, 0, "h", &h) == PJ_OK);
    EXPECT(packjit_map_lookup(h, &k, 4, &got, 8) == -2 /* ENOENT */);
    EXPECT(packjit_map_update(h, &k, 4, &v, 8, PACKJIT_BPF_NOEXIST) == 0);
    EXPECT(packjit_map_update(h, &k, 4, &v, 8, PACKJIT_BPF_NOEXIST) == -17 /* EEXIST */);
    EXPECT(packjit_map_lookup(h, &k, 4, &got, 8) == 0 && got == 42);
    EXPECT(packjit_map_next_key(h, NULL, 0, &next, 4) == 0 && next == 1);
    EXPECT(packjit_map_next_key(h, &next, 4, &next, 4) == -2);
    EXPECT(packjit_map_value_size(h, &size) == PJ_OK && size == 8);
    EXPECT(packjit_map_ref(h, &h2) == PJ_OK);
    packjit_map_free(h);
    EXPECT(packjit_map_delete(h2, &k, 4) == 0);
    EXPECT(packjit_map_lookup(h2, NULL, 4, &got, 8) == -22 /* EINVAL */);
    packjit_map_free(h2);
    EXPECT(packjit_map_create(PACKJIT_MAP_TYPE_HASH, 0, 8, 8, 0, "bad", &h) ==
               PJ_ERR_INVALID_ARGUMENT &&
           h == NULL);

    EXPECT(packjit_map_create(PACKJIT_MAP_TYPE_RINGBUF, 0, 0, 1 << 16, 0, "rb", &rb) == PJ_OK);
    EXPECT(packjit_map_create(PACKJIT_MAP_TYPE_PROG_ARRAY, 4, 4, 2, 0, "pa", &pa) == PJ_OK);
    EXPECT(packjit_load_options_init(&opts) == PJ_OK);
    ring_maps[0] = rb;
    opts.maps = ring_maps;
    opts.map_count = 1;
    EXPECT(packjit_program_load(rt, p_ring, sizeof p_ring, &opts, &ring) == PJ_OK);
    tail_maps[0] = rb;
    tail_maps[1] = pa;
    opts.maps = tail_maps;
    opts.map_count = 2;
    EXPECT(packjit_program_load(rt, p_tail, sizeof p_tail, &opts, &tail) == PJ_OK);
    EXPECT(packjit_program_run(tail, ctx, sizeof ctx, &r0) == PJ_OK && r0 == 7);
    EXPECT(packjit_prog_array_set(rt, pa, 0, ring) == PJ_OK);
    packjit_program_free(ring); /* the slot keeps it */
    EXPECT(packjit_program_run(tail, ctx, sizeof ctx, &r0) == PJ_OK && r0 == 0);
    ctx[0] = 100;
    EXPECT(packjit_program_run(tail, ctx, sizeof ctx, &r0) == PJ_OK && r0 == 0);
    EXPECT(packjit_prog_array_set(rt, pa, 2, NULL) == PJ_ERR_INVALID_ARGUMENT);
    {
        PackjitMap *rb2 = NULL;
        PackjitMapInfo info;
        EXPECT(packjit_map_create(PACKJIT_MAP_TYPE_RINGBUF, 0, 0, 1 << 16, 0, "x", &rb2) ==
               PJ_OK);
        EXPECT(packjit_ringbuf_consume(rb2, on_record, &sum) == 0);
        EXPECT(packjit_ringbuf_consume(pa, on_record, &sum) == -22);
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        EXPECT(packjit_map_info(pa, &info) == PJ_OK && info.map_type == 3 &&
               strcmp(info.name, "pa") == 0);
        packjit_map_free(rb2);
    }
    /* Two records, written by the program the tail calls landed in. */
    EXPECT(packjit_ringbuf_consume(rb, on_record, &sum) == 2 && sum == 5 + 6 + 100 + 6);
    EXPECT(packjit_ringbuf_consume(rb, on_record, &sum) == 0);
    packjit_map_free(rb); /* the programs keep it */
    EXPECT(packjit_prog_array_set(rt, pa, 0, NULL) == PJ_OK);
    packjit_program_free(tail);
    packjit_map_free(pa);
}

int main(int argc, char **argv)
{
    PackjitConfig cfg;
    PackjitRuntime *rt = NULL;
    PackjitLoadOptions opts;
    PackjitProgram *p = NULL;
    PjMemRegion region;
    uint64_t data[2] = {1000, 0};
    uint8_t ctx[16];
    uint64_t r0 = 0, pending = 1;
    uint64_t addr = (uint64_t)(uintptr_t)data;
    int i;

    if (argc < 2) {
        fprintf(stderr, "usage: run X86_64_PLUGIN\n");
        return 2;
    }
    for (i = 0; i < 16; i++)
        ctx[i] = (uint8_t)(i + 1);
    EXPECT(packjit_config_init(&cfg) == PJ_OK);
    EXPECT(packjit_runtime_create(&cfg, &rt) == PJ_OK && rt != NULL);
    if (rt == NULL)
        return 1;
    EXPECT(packjit_load_plugin(rt, argv[1], NULL) == PJ_OK);
    EXPECT(packjit_register_helper(rt, 1, "sum_bytes", sum_bytes) == PJ_OK);

    /* Sandboxed (the default): the helper may read the context it is pointed at. */
    EXPECT(packjit_program_load(rt, p_helper, sizeof p_helper, NULL, &p) == PJ_OK);
    EXPECT(packjit_program_run(p, ctx, sizeof ctx, &r0) == PJ_OK && r0 == 136);
    packjit_program_free(p);

    /* A per-program read-write region. */
    p_region[1 * 8 + 4] = (uint8_t)addr;
    p_region[1 * 8 + 5] = (uint8_t)(addr >> 8);
    p_region[1 * 8 + 6] = (uint8_t)(addr >> 16);
    p_region[1 * 8 + 7] = (uint8_t)(addr >> 24);
    p_region[2 * 8 + 4] = (uint8_t)(addr >> 32);
    p_region[2 * 8 + 5] = (uint8_t)(addr >> 40);
    p_region[2 * 8 + 6] = (uint8_t)(addr >> 48);
    p_region[2 * 8 + 7] = (uint8_t)(addr >> 56);
    region.start = addr;
    region.len = sizeof data;
    region.flags = PJ_REGION_WRITABLE;
    EXPECT(packjit_load_options_init(&opts) == PJ_OK);
    opts.regions = &region;
    opts.region_count = 1;
    EXPECT(packjit_program_load(rt, p_region, sizeof p_region, &opts, &p) == PJ_OK);
    EXPECT(packjit_program_run(p, ctx, sizeof ctx, &r0) == PJ_OK);
    EXPECT(r0 == 1000 + 0x100f0e0d0c0b0a09ull && data[1] == r0);
    packjit_program_free(p);
    /* The same program without the region stops at the lddw'd pointer's load. */
    EXPECT(packjit_program_load(rt, p_region, sizeof p_region, NULL, &p) == PJ_OK);
    EXPECT(packjit_program_run(p, ctx, sizeof ctx, &r0) == PJ_ERR_OUT_OF_BOUNDS);
    EXPECT(packjit_last_error_pc() == 3 && packjit_last_error_addr() == addr);
    packjit_program_free(p);

    /* Out of bounds: stopped before the write; nothing around the context changes. */
    EXPECT(packjit_program_load(rt, p_oob, sizeof p_oob, NULL, &p) == PJ_OK);
    EXPECT(packjit_program_run(p, ctx, sizeof ctx, &r0) == PJ_ERR_OUT_OF_BOUNDS);
    EXPECT(packjit_last_error_pc() == 0);
    EXPECT(packjit_last_error_addr() == (uint64_t)(uintptr_t)ctx + 16);
    EXPECT(strstr(packjit_last_error(), "8-byte write") != NULL);
    packjit_program_free(p);

    /* Budget. */
    EXPECT(packjit_load_options_init(&opts) == PJ_OK);
    opts.flags = PACKJIT_LOAD_BUDGET;
    opts.budget = 10000;
    EXPECT(packjit_program_load(rt, p_spin, sizeof p_spin, &opts, &p) == PJ_OK);
    EXPECT(packjit_program_run(p, NULL, 0, &r0) == PJ_ERR_BUDGET && packjit_last_error_pc() == 0);
    packjit_program_free(p);

    /* Unknown callx id, trusted code too. */
    EXPECT(packjit_load_options_init(&opts) == PJ_OK);
    opts.flags = PACKJIT_LOAD_TRUSTED | PACKJIT_LOAD_BLIND_CONSTANTS;
    EXPECT(packjit_program_load(rt, p_callx, sizeof p_callx, &opts, &p) == PJ_OK);
    EXPECT(packjit_program_run(p, NULL, 0, &r0) == PJ_ERR_UNKNOWN_CALLX &&
           packjit_last_error_pc() == 1);
    EXPECT(strstr(packjit_last_error(), "77") != NULL);
    packjit_program_free(p);

    maps(rt);
    lpm(rt);

    EXPECT(packjit_reclaim(rt, &pending) == PJ_OK && pending == 0);
    packjit_runtime_destroy(rt);
    printf("run: %s (%d failed expectations)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
