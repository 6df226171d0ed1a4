// The C ABI the side-by-side bench (benches/peers-native) calls for llvmbpf: load, compile,
// free. The bench calls the compiled function pointer itself (r1 = context, r2 = its length),
// so a timed run is LLVM's code and nothing of the shim.
#include <cstdint>
#include <cstdio>
#include <llvmbpf.hpp>
#include <spdlog/spdlog.h>
#include <string>

using pn_helper = uint64_t (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

static void copy_error(const std::string &msg, char *err, size_t err_len)
{
	if (err_len > 0)
		std::snprintf(err, err_len, "%s", msg.c_str());
}

extern "C" {

// A VM with `helper` registered as `helper_id` and `code` loaded, or NULL with the reason in
// `err`. llvmbpf does its work in compile: load copies the instructions.
void *pn_llvmbpf_load(const void *code, size_t code_len, unsigned helper_id,
		      pn_helper helper, char *err, size_t err_len)
{
	// llvmbpf logs through spdlog; its info-level lines would land in the bench's tables.
	spdlog::set_level(spdlog::level::warn);
	auto *vm = new bpftime::llvmbpf_vm();
	if (vm->register_external_function(helper_id, "pj_mix",
					   reinterpret_cast<void *>(helper)) != 0 ||
	    vm->load_code(code, code_len) != 0) {
		copy_error(vm->get_error_message(), err, err_len);
		delete vm;
		return nullptr;
	}
	return vm;
}

// Lifts to LLVM IR, runs LLVM's O3 pipeline and JITs with ORC (llvmbpf's `compile`).
void *pn_llvmbpf_compile(void *vm, char *err, size_t err_len)
{
	auto *v = static_cast<bpftime::llvmbpf_vm *>(vm);
	auto f = v->compile();
	if (!f) {
		copy_error(v->get_error_message(), err, err_len);
		return nullptr;
	}
	return reinterpret_cast<void *>(*f);
}

void pn_llvmbpf_free(void *vm)
{
	delete static_cast<bpftime::llvmbpf_vm *>(vm);
}
}
