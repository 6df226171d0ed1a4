/* The C ABI the side-by-side bench (benches/peers-native) calls for ubpf: load, compile, free.
 * The bench calls the compiled function pointer itself (r1 = context, r2 = its length), so a
 * timed run is the JIT's code and nothing of the shim. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ubpf.h>

typedef uint64_t (*pn_helper)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

/* Copies ubpf's message (which the caller of ubpf_load/ubpf_compile must free) into `err`. */
static void take_error(char *msg, char *err, size_t err_len)
{
    if (err_len == 0)
        return;
    snprintf(err, err_len, "%s", msg ? msg : "(no message)");
    free(msg);
}

/* A VM with `helper` registered as `helper_id` and `code` loaded (ubpf's loader validates the
 * instructions and, by default, keeps them read-only), or NULL with the reason in `err`. */
void *pn_ubpf_load(const void *code, size_t code_len, unsigned helper_id, pn_helper helper,
                   char *err, size_t err_len)
{
    struct ubpf_vm *vm = ubpf_create();
    if (!vm) {
        take_error(NULL, err, err_len);
        return NULL;
    }
    if (ubpf_register(vm, helper_id, "pj_mix", (external_function_t)helper) != 0) {
        ubpf_destroy(vm);
        snprintf(err, err_len, "ubpf_register failed");
        return NULL;
    }
    char *msg = NULL;
    if (ubpf_load(vm, code, (uint32_t)code_len, &msg) != 0) {
        take_error(msg, err, err_len);
        ubpf_destroy(vm);
        return NULL;
    }
    return vm;
}

/* ubpf_compile (its basic mode: the function takes the context and its length). */
void *pn_ubpf_compile(void *vm, char *err, size_t err_len)
{
    char *msg = NULL;
    ubpf_jit_fn f = ubpf_compile((struct ubpf_vm *)vm, &msg);
    if (!f)
        take_error(msg, err, err_len);
    return (void *)f;
}

void pn_ubpf_free(void *vm)
{
    ubpf_destroy((struct ubpf_vm *)vm);
}
