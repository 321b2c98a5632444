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
    // MXEMU_FP_CONTRACT=1 fuses a * b + c as NVRTC does by default (see below).
    println!("cargo:rerun-if-env-changed=MXEMU_FP_CONTRACT");
    let fuse = std::env::var_os("MXEMU_FP_CONTRACT").is_some_and(|v| !v.is_empty() && v != "0");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file(Path::new("emu").join("emu.cpp"))
        // Kernels at -O0 would make the emulator (and every test on it) several times slower.
        .opt_level(2)
        .std("c++17")
        .flag("-fno-strict-aliasing")
        // The emulator's thread-locals (and __shared__ variables) without __tls_get_addr calls.
        .flag("-ftls-model=initial-exec")
        // The hand-written context switch keeps no shadow stack.
        .flag_if_supported("-fcf-protection=none")
        .extra_warnings(false);
    if fuse {
        // Fused multiply-adds wherever the compiler finds a * b + c, as NVRTC compiles the
        // kernels for a GPU (MX_FMUL and MX_FADD stay unfused, as __fmul_rn does there), so
        // that tests on this build see where a kernel's results depend on fusion: scripts/test.sh
        // runs the float-rounding agreement test on it. On x86-64 that needs the FMA unit.
        build
            .flag("-ffp-contract=fast")
            .define("MXEMU_FP_CONTRACT", "1");
        if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
            build.flag("-mfma");
        }
    } else {
        // No fused multiply-adds the source does not ask for: reproducible results.
        build.flag("-ffp-contract=off");
    }
    if std::env::var_os("MXEMU_UCONTEXT").is_some_and(|v| !v.is_empty() && v != "0") {
        build.define("MXEMU_UCONTEXT", "1");
    }
    build.compile("mxemu");
}
