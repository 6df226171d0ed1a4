//! Compiles ubpf's VM (C) and llvmbpf (C++20 against LLVM) from source directories the user
//! gives, with the shims in `shim/`, and links them into the bench.
//!
//! * `UBPF_SRC`: a checkout of https://github.com/iovisor/ubpf (its `vm/` is used). Required.
//! * `LLVMBPF_SRC`: a checkout of https://github.com/eunomia-bpf/llvmbpf. Optional: without
//!   it the bench has no llvmbpf column.
//! * `LLVM_CONFIG`: the `llvm-config` to build llvmbpf against (default `llvm-config-19`).
//!   llvmbpf also needs spdlog and fmt (Debian: `libspdlog-dev`).
//!
//! The sources are compiled directly rather than through their CMake projects: ubpf's would
//! build its tests and tools, llvmbpf's fetches spdlog from GitHub at configure time.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(llvmbpf)");
    println!("cargo::rerun-if-env-changed=UBPF_SRC");
    println!("cargo::rerun-if-env-changed=LLVMBPF_SRC");
    println!("cargo::rerun-if-env-changed=LLVM_CONFIG");
    println!("cargo::rerun-if-changed=shim");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());

    let ubpf = PathBuf::from(env::var("UBPF_SRC").expect(
        "UBPF_SRC: set it to a checkout of https://github.com/iovisor/ubpf \
         (scripts/peers-native.sh UBPF_SRC LLVMBPF_SRC)",
    ));
    let vm = ubpf.join("vm");
    assert!(
        vm.join("inc/ubpf.h").exists(),
        "{}: not a ubpf checkout",
        ubpf.display()
    );
    // ubpf's CMake generates this from `ubpf_config.h.inc`; the only setting that matters
    // here is that <elf.h> exists (glibc has it), which enables its ELF loader.
    std::fs::write(
        out.join("ubpf_config.h"),
        "#pragma once\n#define UBPF_HAS_ELF_H 1\n",
    )
    .unwrap();
    let mut c = cc::Build::new();
    c.include(vm.join("inc"))
        .include(&vm)
        .include(&out)
        // ubpf takes helper ids below UBPF_MAX_EXT_FUNCS, 64 by default; the programs call
        // `pj_mix` as 77, as for every engine. ubpf.h lets a build raise it.
        .define("UBPF_MAX_EXT_FUNCS", "128")
        .opt_level(2)
        .warnings(false)
        .file("shim/ubpf_shim.c");
    // The files of ubpf's `vm` library target (vm/CMakeLists.txt).
    for f in [
        "ubpf_instruction_valid.c",
        "ubpf_jit_arm64.c",
        "ubpf_jit.c",
        "ubpf_jit_support.c",
        "ubpf_jit_x86_64.c",
        "ubpf_safe.c",
        "ubpf_loader.c",
        "ubpf_vm.c",
    ] {
        c.file(vm.join(f));
        println!("cargo::rerun-if-changed={}", vm.join(f).display());
    }
    c.compile("ubpf_peers");
    println!("cargo::rustc-link-lib=m");
    println!("cargo::rustc-env=PN_UBPF_REV={}", revision(&ubpf));

    let Some(llvmbpf) = env::var_os("LLVMBPF_SRC").map(PathBuf::from) else {
        println!("cargo::warning=LLVMBPF_SRC not set: no llvmbpf column");
        println!("cargo::rustc-env=PN_LLVMBPF_REV=(not built)");
        println!("cargo::rustc-env=PN_LLVM_VERSION=(not built)");
        return;
    };
    println!("cargo::rustc-env=PN_LLVMBPF_REV={}", revision(&llvmbpf));
    assert!(
        llvmbpf.join("include/llvmbpf.hpp").exists(),
        "{}: not an llvmbpf checkout",
        llvmbpf.display()
    );
    let llvm_config = env::var("LLVM_CONFIG").unwrap_or_else(|_| "llvm-config-19".into());
    let query = |arg: &str| {
        let o = Command::new(&llvm_config)
            .arg(arg)
            .output()
            .unwrap_or_else(|e| panic!("{llvm_config}: {e} (apt-get install llvm-19-dev)"));
        assert!(o.status.success(), "{llvm_config} {arg} failed");
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    println!("cargo::rustc-env=PN_LLVM_VERSION={}", query("--version"));
    let includedir = query("--includedir");
    let libdir = query("--libdir");
    // llvmbpf (as of 658ba89, 2024-09) includes two headers unconditionally that newer LLVMs
    // dropped: `llvm/Transforms/IPO/PassManagerBuilder.h` (the legacy pass manager, which it
    // only uses below LLVM 17) and `llvm/Support/Host.h` (moved to `llvm/TargetParser/` in
    // LLVM 17). Stand-ins for the missing ones, so its sources build unchanged.
    let compat = out.join("llvm-compat");
    for (header, text) in [
        ("llvm/Transforms/IPO/PassManagerBuilder.h", "#pragma once\n"),
        (
            "llvm/Support/Host.h",
            "#pragma once\n#include <llvm/TargetParser/Host.h>\n",
        ),
    ] {
        if !std::path::Path::new(&includedir).join(header).exists() {
            let path = compat.join(header);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }
    let mut cpp = cc::Build::new();
    cpp.cpp(true)
        .std("c++20")
        .include(llvmbpf.join("include"))
        .include(llvmbpf.join("src"))
        .include(&includedir)
        .include(&compat)
        .opt_level(2)
        .warnings(false)
        .file("shim/llvmbpf_shim.cpp");
    // llvm-config's own -D flags (its --cxxflags also carry -std and -fno-exceptions, which
    // llvmbpf cannot take: it throws).
    for flag in query("--cxxflags").split_whitespace() {
        if flag.starts_with("-D") {
            cpp.flag(flag);
        }
    }
    // Debian's spdlog is built against an external fmt.
    for d in [
        "SPDLOG_FMT_EXTERNAL",
        "SPDLOG_SHARED_LIB",
        "SPDLOG_COMPILED_LIB",
    ] {
        cpp.define(d, None);
    }
    for f in [
        "llvm_jit_context.cpp",
        "compiler.cpp",
        "compiler_utils.cpp",
        "vm.cpp",
    ] {
        cpp.file(llvmbpf.join("src").join(f));
        println!(
            "cargo::rerun-if-changed={}",
            llvmbpf.join("src").join(f).display()
        );
    }
    cpp.compile("llvmbpf_peers");
    println!("cargo::rustc-link-search=native={libdir}");
    for lib in query("--libs").split_whitespace() {
        if let Some(l) = lib.strip_prefix("-l") {
            println!("cargo::rustc-link-lib=dylib={l}");
        }
    }
    println!("cargo::rustc-link-arg=-Wl,-rpath,{libdir}");
    println!("cargo::rustc-link-lib=dylib=spdlog");
    println!("cargo::rustc-link-lib=dylib=fmt");
    println!("cargo::rustc-link-lib=dylib=stdc++");
    println!("cargo::rustc-cfg=llvmbpf");
}

/// The source tree's commit (printed with the figures), or "unknown" outside git.
fn revision(dir: &std::path::Path) -> String {
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["log", "-1", "--format=%h %cs"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
