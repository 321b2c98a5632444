//! Compiles the CPU emulator (emu/emu.cpp, which includes the kernel files) into a static
//! library for `src/emu.rs`.

use std::path::Path;

fn main() {
    for dir in ["emu", "kernels"] {
        println!("cargo:rerun-if-changed={dir}");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {dir}/: {e}"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        for f in files {
            println!("cargo:rerun-if-changed={}", f.display());
        }
    }
    // MXEMU_UCONTEXT=1 builds the portable ucontext fiber switch instead of the x86-64 one.
    println!("cargo:rerun-if-env-changed=MXEMU_UCONTEXT");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file(Path::new("emu").join("emu.cpp"))
        // Kernels at -O0 would make the emulator (and every test on it) several times slower.
        .opt_level(2)
        .std("c++17")
        .flag("-fno-strict-aliasing")
        // No fused multiply-adds the source does not ask for: reproducible results.
        .flag("-ffp-contract=off")
        // The emulator's thread-locals (and __shared__ variables) without __tls_get_addr calls.
        .flag("-ftls-model=initial-exec")
        // The hand-written context switch keeps no shadow stack.
        .flag_if_supported("-fcf-protection=none")
        .extra_warnings(false);
    if std::env::var_os("MXEMU_UCONTEXT").is_some_and(|v| !v.is_empty() && v != "0") {
        build.define("MXEMU_UCONTEXT", "1");
    }
    build.compile("mxemu");
}
