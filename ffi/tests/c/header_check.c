/* Compiled by ffi/tests/header.rs as C99 and as C++ with -Wall -Wextra -Werror -pedantic:
 * the header must be self-contained and warning-free in both languages. It also pins a few
 * layout facts of the plugin ABI that C backends rely on. */
#include "packjit.h"

#if defined(__cplusplus)
#define PJ_STATIC_ASSERT(c, m) static_assert(c, #m)
#else
#define PJ_STATIC_ASSERT(c, m) typedef char pj_static_assert_##m[(c) ? 1 : -1]
#endif

PJ_STATIC_ASSERT(sizeof(PjRegion) == 24, pjregion_size);
PJ_STATIC_ASSERT(sizeof(PjHelper) == 16, pjhelper_size);
PJ_STATIC_ASSERT(sizeof(PjError) == 16 + PJ_ERROR_MESSAGE_LEN, pjerror_size);
PJ_STATIC_ASSERT(sizeof(PjCompileRequest) == 80, pjcompilerequest_size);
PJ_STATIC_ASSERT(sizeof(PjBackendVtable) == 56, pjbackendvtable_size);
PJ_STATIC_ASSERT(sizeof(PjMemRegion) == 24, pjmemregion_size);
PJ_STATIC_ASSERT(sizeof(PjExecEnv) == 120, pjexecenv_size);

int packjit_header_check(void);

int packjit_header_check(void)
{
    PackjitConfig cfg;
    PackjitRuntime *rt = NULL;
    int32_t st = packjit_config_init(&cfg);
    if (st == PJ_OK)
        st = packjit_runtime_create(&cfg, &rt);
    packjit_runtime_destroy(rt);
    return st == PJ_OK ? 0 : (int)packjit_status_str(st)[0];
}
