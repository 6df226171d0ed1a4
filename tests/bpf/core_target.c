/* The target layout of `core_ctx.c`'s `struct pj_task` (`tests/elf_core.rs` takes this
 * object's `.BTF` as the target BTF): fields reordered, `comm` longer, `flags` wider,
 * `legacy` gone, the bitfield moved; `enum pj_state` renumbered. */
#include "pj.h"

struct pj_task {
    u64 start;     /* 0 */
    char comm[16]; /* 8 */
    int prio;      /* 24 */
    u32 flags;     /* 28 */
    u32 pid;       /* 32 */
    u32 pad : 8, lo : 4, hi : 12; /* 36 */
    u64 extra;     /* 40 */
};

enum pj_state { PJ_SLEEPING = 5, PJ_RUNNING = 1, PJ_DEAD = 9 };

/* Variables, so that clang emits the types. */
struct pj_task pj_task_anchor;
enum pj_state pj_state_anchor;
