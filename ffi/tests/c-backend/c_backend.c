/*
 * A tiny packjit backend written in plain C against include/packjit.h: proof that the plugin
 * ABI is really C. It compiles exactly one program shape,
 *
 *     pc 0: mov r0, imm     (0xb7: 64-bit, imm sign-extended; or 0xb4: 32-bit, zero-extended)
 *     pc 1: exit            (0x95)
 *
 * for the architecture it is built for (x86-64, arm64 or riscv64), so the host can load it,
 * compile through the arena vtable and RUN the result. Everything else is refused with
 * PJ_ERR_UNSUPPORTED (or PJ_ERR_VERIFY for malformed bytecode) naming the pc and opcode.
 *
 * Build: cc -std=c99 -Wall -Wextra -Werror -pedantic -shared -fPIC -I include \
 *            -o libpackjit_cbackend.so ffi/tests/c-backend/c_backend.c
 */
#include "packjit.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#define CB_ARCH PJ_ARCH_X86_64
#elif defined(__aarch64__)
#define CB_ARCH PJ_ARCH_AARCH64
#elif defined(__riscv) && __riscv_xlen == 64
#define CB_ARCH PJ_ARCH_RISCV64
#else
#error "the C test backend knows x86-64, aarch64 and riscv64 only"
#endif

#define CB_NAME "cbackend"

static int32_t cb_fail(PjCompileResult *out, int32_t code, int64_t pc, const char *fmt, ...)
{
    va_list ap;
    out->error.code = code;
    out->error.reserved = 0;
    out->error.pc = pc;
    va_start(ap, fmt);
    /* vsnprintf always NUL-terminates and truncates; the message is ASCII. */
    vsnprintf(out->error.message, sizeof out->error.message, fmt, ap);
    va_end(ap);
    return code;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

#if CB_ARCH != PJ_ARCH_X86_64
static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}
#endif

/* Emits "return value" for the target; returns the number of bytes and native insns. */
static size_t emit(uint8_t *buf, uint64_t value, int wide, uint64_t *insns)
{
#if CB_ARCH == PJ_ARCH_X86_64
    size_t n = 0;
    if (wide) {
        /* mov rax, simm32 (REX.W C7 /0): sign-extends like BPF's 64-bit mov. */
        buf[n++] = 0x48;
        buf[n++] = 0xc7;
        buf[n++] = 0xc0;
    } else {
        /* mov eax, imm32: writing eax zero-extends into rax, like BPF's mov32. */
        buf[n++] = 0xb8;
    }
    put32(buf + n, (uint32_t)value);
    n += 4;
    buf[n++] = 0xc3; /* ret */
    *insns = 2;
    return n;
#elif CB_ARCH == PJ_ARCH_AARCH64
    (void)wide; /* the literal already holds the extended value */
    put32(buf, 0x58000040u);     /* ldr x0, #8 (the literal below) */
    put32(buf + 4, 0xd65f03c0u); /* ret */
    put64(buf + 8, value);       /* 64-bit literal, 4-byte aligned as LDR (literal) needs */
    *insns = 2;
    return 16;
#else
    (void)wide;
    put32(buf, 0x00000297u);      /* auipc t0, 0 */
    put32(buf + 4, 0x0102b503u);  /* ld a0, 16(t0) */
    put32(buf + 8, 0x00008067u);  /* ret (jalr x0, 0(ra)) */
    put32(buf + 12, 0x00000013u); /* nop: pads the literal to an 8-byte boundary */
    put64(buf + 16, value);
    *insns = 4;
    return 24;
#endif
}

static uint64_t cb_detect_features(void)
{
    return 0;
}

static int32_t cb_compile(const PjCompileRequest *req, PjCompileResult *out)
{
    const PjArenaVtable *arena;
    const uint8_t *insn;
    uint64_t count, value, insns = 0;
    uint8_t buf[32];
    size_t len;
    int32_t imm, st;
    PjRegion region;

    if (out == NULL)
        return PJ_ERR_INVALID_ARGUMENT;
    if (out->struct_size != sizeof(PjCompileResult))
        return PJ_ERR_ABI; /* cannot trust the layout enough to write a message */
    if (req == NULL)
        return cb_fail(out, PJ_ERR_INVALID_ARGUMENT, -1, "request is NULL");
    if (req->struct_size != sizeof(PjCompileRequest))
        return cb_fail(out, PJ_ERR_ABI, -1, CB_NAME ": request is %u bytes, expected %u",
                       (unsigned)req->struct_size, (unsigned)sizeof(PjCompileRequest));
    arena = req->arena;
    if (arena == NULL || arena->abi_version != PJ_ABI_VERSION ||
        arena->struct_size != sizeof(PjArenaVtable) || arena->alloc == NULL ||
        arena->write == NULL || arena->free == NULL)
        return cb_fail(out, PJ_ERR_ABI, -1, CB_NAME ": missing or incompatible arena vtable");
    if (req->flags != 0)
        return cb_fail(out, PJ_ERR_UNSUPPORTED, -1, CB_NAME ": unknown compile flags 0x%x",
                       (unsigned)req->flags);
    if (req->features != 0)
        return cb_fail(out, PJ_ERR_UNSUPPORTED, -1,
                       CB_NAME ": no optional features, got 0x%llx",
                       (unsigned long long)req->features);
    if (req->code == NULL || req->code_len == 0 || req->code_len % 8 != 0)
        return cb_fail(out, PJ_ERR_VERIFY, -1,
                       "bytecode length %llu is not a positive multiple of 8",
                       (unsigned long long)req->code_len);
    count = req->code_len / 8;

    /* pc 0: mov r0, imm (dst r0, src 0, off 0). */
    insn = req->code;
    if ((insn[0] != 0xb7 && insn[0] != 0xb4) || insn[1] != 0x00 || insn[2] != 0 || insn[3] != 0)
        return cb_fail(out, PJ_ERR_UNSUPPORTED, 0,
                       "opcode 0x%02x (regs 0x%02x) is not supported by " CB_NAME
                       ", which compiles only `mov r0, imm; exit`",
                       insn[0], insn[1]);
    imm = (int32_t)((uint32_t)insn[4] | (uint32_t)insn[5] << 8 | (uint32_t)insn[6] << 16 |
                    (uint32_t)insn[7] << 24);
    /* 0xb7 sign-extends imm to 64 bits; 0xb4 writes the low 32 bits and zeroes the rest. */
    value = insn[0] == 0xb7 ? (uint64_t)(int64_t)imm : (uint64_t)(uint32_t)imm;

    if (count < 2)
        return cb_fail(out, PJ_ERR_VERIFY, 0, "program falls off its end (no exit)");
    insn = req->code + 8;
    if (insn[0] != 0x95)
        return cb_fail(out, PJ_ERR_UNSUPPORTED, 1,
                       "opcode 0x%02x is not supported by " CB_NAME
                       ", which compiles only `mov r0, imm; exit`",
                       insn[0]);
    if (count > 2)
        return cb_fail(out, PJ_ERR_UNSUPPORTED, 2,
                       "opcode 0x%02x after exit: " CB_NAME
                       " compiles only the two-instruction `mov r0, imm; exit`",
                       req->code[16]);

    len = emit(buf, value, insn[-8] == 0xb7, &insns);
    memset(&region, 0, sizeof region);
    st = arena->alloc(arena->ctx, len, &region);
    if (st != PJ_OK)
        return cb_fail(out, st, -1, CB_NAME ": arena alloc of %u bytes failed", (unsigned)len);
    st = arena->write(arena->ctx, &region, 0, buf, len);
    if (st != PJ_OK) {
        arena->free(arena->ctx, &region);
        return cb_fail(out, st, -1, CB_NAME ": arena write failed");
    }
    out->region = region;
    out->entry = region.exec_addr;
    out->code_size = len;
    out->native_insns = insns;
    out->error.code = PJ_OK;
    out->error.pc = -1;
    out->error.message[0] = '\0';
    return PJ_OK;
}

static const PjBackendVtable cb_vtable = {
    PJ_ABI_VERSION,          /* abi_version */
    sizeof(PjBackendVtable), /* struct_size */
    CB_ARCH,                 /* arch */
    0,                       /* reserved */
    CB_NAME,                 /* name */
    "0.1.0",                 /* version */
    0,                       /* features */
    cb_detect_features,      /* detect_features */
    cb_compile,              /* compile */
};

/* The plugin entry point (PJ_PLUGIN_SYMBOL); its type is PjPluginEntry. */
const PjBackendVtable *packjit_plugin_v1(void);

const PjBackendVtable *packjit_plugin_v1(void)
{
    return &cb_vtable;
}
