/* A target `core_ctx.c` cannot run on (`tests/elf_core.rs`): the struct is a flavour
 * (`pj_task___v9` matches `pj_task`, as the enum's), `prio` became a signed 8-byte field (a 4-byte signed
 * load cannot be widened) and `legacy` a struct (incompatible with the local u32). */
#include "pj.h"

struct pj_legacy {
    u32 x;
};

struct pj_task___v9 {
    u32 pid;
    u64 start;
    u16 flags;
    struct pj_legacy legacy;
    char comm[8];
    long prio;
    u32 lo : 4, hi : 12;
};

enum pj_state___v9 { PJ_RUNNING = 1, PJ_SLEEPING = 3 };

struct pj_task___v9 pj_task_anchor;
enum pj_state___v9 pj_state_anchor;
