/*
 * The C API's non-executing paths, for valgrind memcheck on the x86-64 host (run by
 * ffi/check.sh): create, load plugins, register helpers, compile (single and batch, for
 * foreign architectures and, with the C test backend, for the host), dump code, stats, every
 * kind of error, free, destroy. Nothing here runs JIT code: the arena's self-probe is
 * turned off (PACKJIT_REMAP_NEVER), so valgrind sees only ordinary code.
 *
 *   smoke ARM64_PLUGIN RV64_PLUGIN [C_BACKEND_PLUGIN]
 *
 * Exits 0 when every call behaved as expected; prints one line per failed expectation.
 */
#include "packjit.h"

#include <stdio.h>
#include <stdlib.h>
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

static uint64_t helper(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e)
{
    return a + b + c + d + e;
}

#define INSN(op, dst, src, off, imm)                                                             \
    (uint8_t)(op), (uint8_t)(((src) << 4) | (dst)), (uint8_t)((off) & 0xff),                    \
        (uint8_t)(((off) >> 8) & 0xff), (uint8_t)((imm) & 0xff), (uint8_t)(((imm) >> 8) & 0xff), \
        (uint8_t)(((imm) >> 16) & 0xff), (uint8_t)(((uint32_t)(imm) >> 24) & 0xff)

static const uint8_t p_call[] = {INSN(0xb7, 1, 0, 0, 2), INSN(0x85, 0, 0, 0, 1),
                                 INSN(0x95, 0, 0, 0, 0)};
static const uint8_t p_const[] = {INSN(0xb7, 0, 0, 0, 5), INSN(0x95, 0, 0, 0, 0)};
static const uint8_t p_unknown_helper[] = {INSN(0x85, 0, 0, 0, 77), INSN(0x95, 0, 0, 0, 0)};
static const uint8_t p_bad_opcode[] = {INSN(0xff, 0, 0, 0, 0), INSN(0x95, 0, 0, 0, 0)};
static const uint8_t p_no_exit[] = {INSN(0xb7, 0, 0, 0, 5)};

static void compile_foreign(PackjitRuntime *rt, uint32_t arch)
{
    PackjitLoadOptions opts;
    PackjitProgram *p = NULL, *batch[3];
    PackjitProgramInfo info;
    PjError errs[3];
    const uint8_t *codes[3] = {p_call, p_const, p_unknown_helper};
    size_t lens[3] = {sizeof p_call, sizeof p_const, sizeof p_unknown_helper};
    uint8_t *code;
    size_t size = 0;
    uint64_t r0 = 0;
    PjProgramEntry entry = NULL;
    int i;

    EXPECT(packjit_load_options_init(&opts) == PJ_OK);
    opts.arch = arch;
    EXPECT(packjit_program_load(rt, p_call, sizeof p_call, &opts, &p) == PJ_OK);
    EXPECT(p != NULL);
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT(packjit_program_info(p, &info) == PJ_OK);
    EXPECT(info.arch == arch && info.executable == 0 && info.code_size > 0);
    EXPECT(packjit_program_code(p, NULL, 0, &size) == PJ_OK && size == info.code_size);
    code = malloc(size);
    EXPECT(code != NULL && packjit_program_code(p, code, size, &size) == PJ_OK);
    free(code);
    /* Foreign code cannot run here. */
    EXPECT(packjit_program_run(p, NULL, 0, &r0) == PJ_ERR_NOT_EXECUTABLE);
    EXPECT(strstr(packjit_last_error(), "compiled for") != NULL);
    EXPECT(packjit_program_entry(p, &entry) == PJ_ERR_NOT_EXECUTABLE && entry == NULL);
    packjit_program_free(p);

    /* Errors with pcs. */
    p = (PackjitProgram *)&info; /* must be overwritten with NULL */
    EXPECT(packjit_program_load(rt, p_unknown_helper, sizeof p_unknown_helper, &opts, &p) ==
           PJ_ERR_UNKNOWN_HELPER);
    EXPECT(p == NULL && packjit_last_error_pc() == 0);
    EXPECT(packjit_program_load(rt, p_bad_opcode, sizeof p_bad_opcode, &opts, &p) ==
           PJ_ERR_VERIFY);
    EXPECT(packjit_program_load(rt, p_no_exit, sizeof p_no_exit, &opts, &p) == PJ_ERR_VERIFY);
    EXPECT(packjit_program_load(rt, p_const, 5, &opts, &p) == PJ_ERR_VERIFY);

    /* Batch with one failure. */
    EXPECT(packjit_program_load_batch(rt, codes, lens, 3, &opts, batch, errs) ==
           PJ_ERR_UNKNOWN_HELPER);
    EXPECT(batch[0] != NULL && batch[1] != NULL && batch[2] == NULL);
    EXPECT(errs[0].code == PJ_OK && errs[2].code == PJ_ERR_UNKNOWN_HELPER && errs[2].pc == 0);
    for (i = 0; i < 3; i++)
        packjit_program_free(batch[i]);
}

int main(int argc, char **argv)
{
    PackjitConfig cfg;
    PackjitRuntime *rt = NULL;
    PackjitArenaStats st;
    PackjitBackendInfo bi;
    PackjitProgram *p = NULL;
    uint64_t n = 0, pending = 1;
    int32_t code;

    if (argc < 3) {
        fprintf(stderr, "usage: smoke ARM64_PLUGIN RV64_PLUGIN [C_BACKEND_PLUGIN]\n");
        return 2;
    }
    for (code = PJ_ERR_UNKNOWN_CALLX; code <= PJ_OK; code++)
        EXPECT(packjit_status_str(code)[0] != '\0');

    /* Bad arguments first. */
    EXPECT(packjit_runtime_create(NULL, NULL) == PJ_ERR_INVALID_ARGUMENT);
    memset(&cfg, 0, sizeof cfg);
    EXPECT(packjit_runtime_create(&cfg, &rt) == PJ_ERR_ABI && rt == NULL);
    EXPECT(packjit_config_init(&cfg) == PJ_OK);
    cfg.remap_policy = PACKJIT_REMAP_NEVER; /* no self-probe: nothing JIT-compiled runs */
    cfg.pack_size = 64 * 1024;
    EXPECT(packjit_runtime_create(&cfg, &rt) == PJ_OK && rt != NULL);
    if (rt == NULL)
        return 1;
    EXPECT(packjit_load_plugin(rt, NULL, NULL) == PJ_ERR_INVALID_ARGUMENT);
    EXPECT(packjit_load_plugin(rt, "/nonexistent/libpackjit_none.so", NULL) == PJ_ERR_PLUGIN);
    EXPECT(packjit_load_plugins(rt, "/nonexistent", &n) == PJ_ERR_PLUGIN && n == 0);
    EXPECT(packjit_register_helper(rt, 1, "sum", NULL) == PJ_ERR_INVALID_ARGUMENT);
    EXPECT(packjit_program_load(rt, p_const, sizeof p_const, NULL, NULL) ==
           PJ_ERR_INVALID_ARGUMENT);

    memset(&bi, 0, sizeof bi);
    bi.struct_size = sizeof bi;
    EXPECT(packjit_load_plugin(rt, argv[1], &bi) == PJ_OK && bi.arch == PJ_ARCH_AARCH64);
    EXPECT(packjit_load_plugin(rt, argv[2], &bi) == PJ_OK && bi.arch == PJ_ARCH_RISCV64);
    EXPECT(packjit_load_plugin(rt, argv[1], NULL) == PJ_ERR_PLUGIN); /* one per arch */
    EXPECT(packjit_backend_count(rt, &n) == PJ_OK && n == 2);
    EXPECT(packjit_backend_info(rt, 1, &bi) == PJ_OK && strcmp(bi.name, "packjit-rv64") == 0);
    EXPECT(packjit_register_helper(rt, 1, "sum", helper) == PJ_OK);
    EXPECT(packjit_register_helper(rt, 1, "again", helper) == PJ_ERR_INVALID_ARGUMENT);

    compile_foreign(rt, PJ_ARCH_AARCH64);
    compile_foreign(rt, PJ_ARCH_RISCV64);

    /* Host-arch compile into the packed arena (committed, never run). */
    if (argc > 3) {
        EXPECT(packjit_load_plugin(rt, argv[3], &bi) == PJ_OK && bi.arch == PJ_ARCH_X86_64);
        EXPECT(packjit_program_load(rt, p_const, sizeof p_const, NULL, &p) == PJ_OK);
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        EXPECT(packjit_runtime_stats(rt, &st) == PJ_OK && st.allocations == 1 &&
               st.commits == 1 && st.packs == 1);
        packjit_program_free(p);
        EXPECT(packjit_program_load(rt, p_call, sizeof p_call, NULL, &p) == PJ_ERR_UNSUPPORTED);
    }
    EXPECT(packjit_reclaim(rt, &pending) == PJ_OK && pending == 0);
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT(packjit_runtime_stats(rt, &st) == PJ_OK && st.allocations == 0);
    st.struct_size = 8;
    EXPECT(packjit_runtime_stats(rt, &st) == PJ_ERR_ABI);

    packjit_runtime_destroy(rt);
    printf("smoke: %s (%d failed expectations)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
