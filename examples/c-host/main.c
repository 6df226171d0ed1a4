/*
 * examples/c-host: embedding packjit from plain C through include/packjit.h.
 *
 *   c-host [PLUGIN.so]
 *
 * Loads a backend plugin (argv[1], else $PACKJIT_PLUGIN, else the plugin for this CPU found
 * in $PACKJIT_PLUGIN_DIR or next to the executable), registers a C helper, loads and runs
 * a program that calls it, compiles a batch of programs with one commit, runs them, dumps
 * one program's native code, prints the arena statistics and frees everything.
 *
 * Output: lines starting with two spaces vary between runs and machines (addresses, sizes,
 * bytes); all other lines are deterministic and checked by run.sh against expected.txt.
 */
#include "packjit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Helper 1, "fold": r0 = r1 * 10 + r2. */
static uint64_t fold(uint64_t r1, uint64_t r2, uint64_t r3, uint64_t r4, uint64_t r5)
{
    (void)r3;
    (void)r4;
    (void)r5;
    return r1 * 10 + r2;
}

/* One eBPF instruction, little-endian, as in the bytecode format (RFC 9669). */
#define INSN(op, dst, src, off, imm)                                                             \
    (uint8_t)(op), (uint8_t)(((src) << 4) | (dst)), (uint8_t)((off) & 0xff),                    \
        (uint8_t)(((off) >> 8) & 0xff), (uint8_t)((imm) & 0xff), (uint8_t)(((imm) >> 8) & 0xff), \
        (uint8_t)(((imm) >> 16) & 0xff), (uint8_t)(((uint32_t)(imm) >> 24) & 0xff)

#define MOV64_IMM 0xb7
#define ADD64_REG 0x0f
#define ADD64_IMM 0x07
#define SUB64_IMM 0x17
#define LDXDW 0x79
#define JNE_IMM 0x55
#define CALL 0x85
#define EXIT 0x95

/* mov r1, 4; mov r2, 2; call fold; exit  -> 42 */
static const uint8_t prog_helper[] = {
    INSN(MOV64_IMM, 1, 0, 0, 4), INSN(MOV64_IMM, 2, 0, 0, 2), INSN(CALL, 0, 0, 0, 1),
    INSN(EXIT, 0, 0, 0, 0)};

/* mov r0, 7; exit */
static const uint8_t prog_const[] = {INSN(MOV64_IMM, 0, 0, 0, 7), INSN(EXIT, 0, 0, 0, 0)};

/* r0 = ctx[0] + ctx[1] (two u64 loads through r1 = ctx) */
static const uint8_t prog_ctx[] = {INSN(LDXDW, 0, 1, 0, 0), INSN(LDXDW, 2, 1, 8, 0),
                                   INSN(ADD64_REG, 0, 2, 0, 0), INSN(EXIT, 0, 0, 0, 0)};

/* r0 = 10 + 9 + ... + 1 with a backward branch */
static const uint8_t prog_loop[] = {
    INSN(MOV64_IMM, 0, 0, 0, 0), INSN(MOV64_IMM, 1, 0, 0, 10), INSN(ADD64_REG, 0, 1, 0, 0),
    INSN(SUB64_IMM, 1, 0, 0, 1), INSN(JNE_IMM, 1, 0, -3, 0), INSN(EXIT, 0, 0, 0, 0)};

/* mov r1, 6; mov r2, 9; call fold; add r0, 1; exit -> 70 */
static const uint8_t prog_helper2[] = {
    INSN(MOV64_IMM, 1, 0, 0, 6), INSN(MOV64_IMM, 2, 0, 0, 9), INSN(CALL, 0, 0, 0, 1),
    INSN(ADD64_IMM, 0, 0, 0, 1), INSN(EXIT, 0, 0, 0, 0)};

/* call 99 (not registered): refused at load time, naming the pc */
static const uint8_t prog_bad[] = {INSN(MOV64_IMM, 1, 0, 0, 1), INSN(CALL, 0, 0, 0, 99),
                                   INSN(EXIT, 0, 0, 0, 0)};

/* r0 = *(u64 *)(ctx + 16): one word past the 16-byte context. Sandboxed (the default), the
 * program stops at pc 0 with PJ_ERR_OUT_OF_BOUNDS instead of reading host memory. */
static const uint8_t prog_oob[] = {INSN(LDXDW, 0, 1, 16, 0), INSN(EXIT, 0, 0, 0, 0)};

/* mov r0, 1; ja -1: spins forever; a budget stops it. */
static const uint8_t prog_spin[] = {INSN(MOV64_IMM, 0, 0, 0, 1), INSN(0x05, 0, 0, -1, 0),
                                    INSN(EXIT, 0, 0, 0, 0)};

#define BATCH 5

static int failed(const char *what, int32_t st)
{
    fprintf(stderr, "c-host: %s failed: %s (%d): %s\n", what, packjit_status_str(st), (int)st,
            packjit_last_error());
    return 1;
}

/* Runs the two sandbox stops: an out-of-bounds read and a budget that runs out. */
static int sandbox_stops(PackjitRuntime *rt, uint64_t *ctx, size_t ctx_len)
{
    PackjitLoadOptions opts;
    PackjitProgram *p = NULL;
    uint64_t r0 = 0;
    int32_t st;

    st = packjit_program_load(rt, prog_oob, sizeof prog_oob, NULL, &p);
    if (st != PJ_OK)
        return failed("loading the out-of-bounds program", st);
    st = packjit_program_run(p, ctx, ctx_len, &r0);
    printf("sandbox: %s at pc %lld\n", packjit_status_str(st),
           (long long)packjit_last_error_pc());
    printf("  %s (address 0x%llx)\n", packjit_last_error(),
           (unsigned long long)packjit_last_error_addr());
    packjit_program_free(p);
    if (st != PJ_ERR_OUT_OF_BOUNDS)
        return 1;

    packjit_load_options_init(&opts);
    opts.flags = PACKJIT_LOAD_BUDGET;
    opts.budget = 1000;
    st = packjit_program_load(rt, prog_spin, sizeof prog_spin, &opts, &p);
    if (st != PJ_OK)
        return failed("loading the spinning program", st);
    st = packjit_program_run(p, NULL, 0, &r0);
    printf("budget: %s at pc %lld\n", packjit_status_str(st),
           (long long)packjit_last_error_pc());
    packjit_program_free(p);
    return st == PJ_ERR_BUDGET ? 0 : 1;
}

static void print_stats(const char *when, const PackjitRuntime *rt)
{
    PackjitArenaStats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    if (packjit_runtime_stats(rt, &st) != PJ_OK) {
        printf("%s: stats failed: %s\n", when, packjit_last_error());
        return;
    }
    printf("%s: allocations=%llu commits=%llu\n", when, (unsigned long long)st.allocations,
           (unsigned long long)st.commits);
    printf("  packs=%llu reserved=%llu used=%llu code=%llu fragmentation=%u%% flushes=%llu "
           "remaps=%llu pending=%llu dual_mapped=%u remap_on_commit=%u\n",
           (unsigned long long)st.packs, (unsigned long long)st.bytes_reserved,
           (unsigned long long)st.bytes_used, (unsigned long long)st.bytes_code,
           (unsigned)(st.fragmentation_permille / 10), (unsigned long long)st.icache_flushes,
           (unsigned long long)st.remaps, (unsigned long long)st.pending_frees,
           (unsigned)st.dual_mapped, (unsigned)st.remap_on_commit);
}

int main(int argc, char **argv)
{
    const char *plugin = argc > 1 ? argv[1] : getenv("PACKJIT_PLUGIN");
    const uint8_t *codes[BATCH] = {prog_const, prog_ctx, prog_loop, prog_helper2, prog_bad};
    size_t lens[BATCH] = {sizeof prog_const, sizeof prog_ctx, sizeof prog_loop,
                          sizeof prog_helper2, sizeof prog_bad};
    PackjitProgram *batch[BATCH];
    PjError errors[BATCH];
    PackjitRuntime *rt = NULL;
    PackjitProgram *prog = NULL;
    PackjitBackendInfo info;
    PackjitProgramInfo pinfo;
    PackjitConfig cfg;
    uint64_t ctx[2] = {100, 200};
    uint64_t r0 = 0;
    uint8_t *code = NULL;
    size_t code_size = 0, i;
    int32_t st;
    int rc = 1;

    printf("packjit %s (header %d.%d.%d, plugin ABI %u)\n", packjit_version_string(),
           PACKJIT_VERSION_MAJOR, PACKJIT_VERSION_MINOR, PACKJIT_VERSION_PATCH,
           (unsigned)packjit_abi_version());
    if (packjit_version() >> 16 != PACKJIT_VERSION_MAJOR) {
        fprintf(stderr, "c-host: header and library versions differ\n");
        return 1;
    }

    packjit_config_init(&cfg);
    st = packjit_runtime_create(&cfg, &rt);
    if (st != PJ_OK)
        return failed("packjit_runtime_create", st);

    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    st = plugin ? packjit_load_plugin(rt, plugin, &info)
                : packjit_load_host_plugin(rt, NULL, &info);
    if (st != PJ_OK) {
        failed("loading the backend plugin", st);
        goto out;
    }
    printf("backend: loaded\n");
    printf("  %s %s (arch code %u) from %s, features supported 0x%llx detected 0x%llx\n",
           info.name, info.version, (unsigned)info.arch, info.origin,
           (unsigned long long)info.supported_features,
           (unsigned long long)info.detected_features);

    st = packjit_register_helper(rt, 1, "fold", fold);
    if (st != PJ_OK) {
        failed("packjit_register_helper", st);
        goto out;
    }

    /* One program, loaded and committed on its own. */
    st = packjit_program_load(rt, prog_helper, sizeof prog_helper, NULL, &prog);
    if (st != PJ_OK) {
        failed("loading the helper program", st);
        goto out;
    }
    st = packjit_program_run(prog, NULL, 0, &r0);
    if (st != PJ_OK) {
        failed("running the helper program", st);
        goto out;
    }
    printf("helper program: r0 = %llu\n", (unsigned long long)r0);

    /* Its native code, size first, then the bytes. */
    memset(&pinfo, 0, sizeof pinfo);
    pinfo.struct_size = sizeof pinfo;
    if (packjit_program_info(prog, &pinfo) == PJ_OK &&
        packjit_program_code(prog, NULL, 0, &code_size) == PJ_OK &&
        (code = malloc(code_size)) != NULL &&
        packjit_program_code(prog, code, code_size, &code_size) == PJ_OK) {
        printf("helper program code: %s\n",
               code_size == pinfo.code_size ? "size matches info" : "SIZE MISMATCH");
        printf("  %llu bytes, %llu native insns at 0x%llx:",
               (unsigned long long)code_size, (unsigned long long)pinfo.native_insns,
               (unsigned long long)pinfo.entry_addr);
        for (i = 0; i < code_size && i < 16; i++)
            printf(" %02x", code[i]);
        printf("%s\n", code_size > 16 ? " ..." : "");
    } else {
        printf("helper program code: dump failed: %s\n", packjit_last_error());
    }
    free(code);

    /* A batch: compiled together, committed once. The last program is refused. */
    st = packjit_program_load_batch(rt, codes, lens, BATCH, NULL, batch, errors);
    printf("batch: status %s\n", packjit_status_str(st));
    for (i = 0; i < BATCH; i++) {
        if (batch[i] == NULL) {
            printf("batch[%u]: error %s at pc %lld\n", (unsigned)i,
                   packjit_status_str(errors[i].code), (long long)errors[i].pc);
            printf("  %s\n", errors[i].message);
            continue;
        }
        st = packjit_program_run(batch[i], ctx, sizeof ctx, &r0);
        if (st != PJ_OK)
            printf("batch[%u]: run failed: %s\n", (unsigned)i, packjit_last_error());
        else
            printf("batch[%u]: r0 = %llu\n", (unsigned)i, (unsigned long long)r0);
    }
    print_stats("loaded", rt);
    if (sandbox_stops(rt, ctx, sizeof ctx) != 0)
        goto out;

    for (i = 0; i < BATCH; i++)
        packjit_program_free(batch[i]); /* NULL entries are ignored */
    packjit_program_free(prog);
    prog = NULL;
    packjit_reclaim(rt, NULL); /* let the deferred frees finish before reading stats */
    print_stats("freed", rt);
    rc = 0;

out:
    packjit_program_free(prog);
    packjit_runtime_destroy(rt);
    printf("done (exit %d)\n", rc);
    return rc;
}
