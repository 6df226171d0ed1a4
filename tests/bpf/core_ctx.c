/* CO-RE field relocations (`tests/elf_core.rs`): the context is a `struct pj_task` marked
 * `preserve_access_index`, so clang records every field access in `.BTF.ext` and the loader
 * relocates it against a target BTF (by default the object's own: the local layout). */
#include "pj.h"

#define __core __attribute__((preserve_access_index))

/* __builtin_preserve_field_info kinds (libbpf's enum bpf_field_info_kind). */
#define FIELD_BYTE_OFFSET 0
#define FIELD_BYTE_SIZE 1
#define FIELD_EXISTS 2
#define FIELD_SIGNED 3
#define FIELD_LSHIFT_U64 4
#define FIELD_RSHIFT_U64 5
/* __builtin_preserve_type_info / __builtin_preserve_enum_value kinds. */
#define TYPE_EXISTS 0
#define TYPE_SIZE 1
#define ENUMVAL_EXISTS 0
#define ENUMVAL_VALUE 1

struct pj_task {
    u32 pid;       /* 0 */
    u64 start;     /* 8 */
    u16 flags;     /* 16 */
    u32 legacy;    /* 20: gone in the target */
    char comm[8];  /* 24 */
    int prio;      /* 32 */
    u32 lo : 4, hi : 12; /* 36 */
} __core;

enum pj_state { PJ_RUNNING = 1, PJ_SLEEPING = 2 };

/* Reads the fields both layouts have (and writes one); r0 mixes them. */
SEC("pj/core_read") u64 core_read(struct pj_task *t, u64 len) {
    u64 r = t->pid;
    r = r * 31 + t->start;
    r = r * 31 + t->flags;
    r = r * 31 + (u8)t->comm[2];
    r = r * 31 + (u64)(long)t->prio;
    t->pid = 7;
    return r;
}

/* What the relocations resolve to, one byte each. */
SEC("pj/core_info") u64 core_info(struct pj_task *t, u64 len) {
    u64 r = __builtin_preserve_field_info(t->legacy, FIELD_EXISTS);
    r |= (u64)__builtin_preserve_field_info(t->comm, FIELD_BYTE_SIZE) << 8;
    r |= (u64)__builtin_preserve_field_info(t->prio, FIELD_BYTE_OFFSET) << 16;
    r |= (u64)__builtin_preserve_field_info(t->prio, FIELD_SIGNED) << 24;
    r |= (u64)__builtin_preserve_field_info(t->flags, FIELD_SIGNED) << 25;
    r |= (u64)__builtin_preserve_type_info(*t, TYPE_SIZE) << 32;
    r |= (u64)__builtin_preserve_enum_value(*(enum pj_state *)PJ_SLEEPING, ENUMVAL_VALUE) << 40;
    r |= (u64)__builtin_preserve_enum_value(*(enum pj_state *)PJ_RUNNING, ENUMVAL_EXISTS) << 48;
    r |= (u64)__builtin_preserve_field_info(t->hi, FIELD_LSHIFT_U64) << 56;
    return r;
}

/* Reads the old field unconditionally: unsatisfiable against the target. */
SEC("pj/core_legacy") u64 core_legacy(struct pj_task *t, u64 len) {
    return t->legacy;
}

/* Reads the old field only where the target has it, as CO-RE programs guard version
 * differences: against the target the read is poisoned, and dead. */
SEC("pj/core_guarded") u64 core_guarded(struct pj_task *t, u64 len) {
    if (__builtin_preserve_field_info(t->legacy, FIELD_EXISTS))
        return t->legacy;
    return 7;
}
