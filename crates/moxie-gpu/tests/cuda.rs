//! The CUDA backend (feature `cuda`).
//!
//! - Without a GPU: opening a device fails cleanly (no panic) when no driver can be loaded.
//! - With NVRTC only (no GPU needed): the kernel source compiles for sm_90 (H100/H200), as
//!   PTX and as a cubin, and the on-disk kernel cache behaves. These skip, saying so, when
//!   libnvrtc cannot be loaded (12.x or 13.x: the one of the driver's CUDA major where there is
//!   a driver; `MOXIE_NVRTC=/path/libnvrtc.so.12` picks one). To run them without a CUDA
//!   toolkit:
//!
//!   ```text
//!   python3 -m venv /work/venv-nvrtc
//!   /work/venv-nvrtc/bin/pip install "nvidia-cuda-nvrtc==13.0.*"
//!   LD_LIBRARY_PATH=/work/venv-nvrtc/lib/python3.11/site-packages/nvidia/cu13/lib \
//!       cargo test -p moxie-gpu --features cuda --test cuda -- --nocapture
//!   ```
//!
//!   (or `CUDA_HOME=/work/venv-nvrtc/lib/python3.11/site-packages/nvidia/cu13` instead of
//!   LD_LIBRARY_PATH: the backend also looks for NVRTC in CUDA toolkits).
//!
//! - On a machine with an NVIDIA GPU (the `#[ignore]`d tests):
//!
//!   ```text
//!   cargo test -p moxie-gpu --features cuda -- --ignored
//!   ```

#![cfg(feature = "cuda")]

use std::sync::Arc;

use moxie_gpu::cuda::{self, CubinOrigin, CudaGpu, Target};
use moxie_gpu::{f32_bytes, kernel_source, Arg, Buffer, Error, GpuBackend, LaunchConfig};

/// Kernels of the tests' own, appended to the kernel source.
const TEST_KERNELS: &str = r#"
extern "C" __global__ void moxie_test_axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}

// One block: every thread writes the block-wide sum (through the prelude's mx_block_sum).
extern "C" __global__ void moxie_test_block_sum(float* out, const float* x, int n) {
    __shared__ float scratch[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        v += x[i];
    }
    float s = mx_block_sum(v, scratch);
    if (threadIdx.x == 0) {
        out[0] = s;
    }
}

// Dynamic shared memory: reverse n floats through shared memory (one block).
extern "C" __global__ void moxie_test_reverse(float* out, const float* x, int n) {
    MX_DYN_SHARED(float, tmp);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        tmp[i] = x[i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        out[i] = tmp[n - 1 - i];
    }
}

// Every argument kind.
extern "C" __global__ void moxie_test_args(long long* out, int a, unsigned int b, long long c,
                                           unsigned long long d, float e) {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = (long long)d;
    out[4] = (long long)(e * 4.0f);
}
"#;

fn test_source() -> String {
    format!("{}\n{TEST_KERNELS}", kernel_source())
}

fn message(e: &Error) -> String {
    e.to_string()
}

// ---------------------------------------------------------------------------------------------
// No driver
// ---------------------------------------------------------------------------------------------

#[test]
fn open_without_a_driver_is_an_error_not_a_panic() {
    if cuda::driver_available() {
        eprintln!("skipped: a CUDA driver is present (the ignored tests cover this machine)");
        return;
    }
    let e = CudaGpu::open(0).expect_err("no driver, no device");
    let msg = message(&e);
    assert!(msg.contains("CUDA0"), "{msg}");
    assert!(msg.contains("driver"), "{msg}");
    assert!(msg.contains("libcuda.so.1"), "{msg}");
    let e = CudaGpu::open_with_source(3, "").expect_err("no driver, no device");
    assert!(message(&e).starts_with("CUDA3: "), "{e}");
    match cuda::device_count() {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert!(message(&e).contains("driver"), "{e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// NVRTC (no device needed)
// ---------------------------------------------------------------------------------------------

fn skip_without_nvrtc() -> bool {
    match cuda::nvrtc_library() {
        Ok((library, (ma, mi))) => {
            eprintln!("NVRTC {ma}.{mi} from {library}");
            false
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            true
        }
    }
}

#[test]
fn kernel_source_compiles_for_sm90() {
    if skip_without_nvrtc() {
        return;
    }
    let (ma, mi) = cuda::nvrtc_version().unwrap();
    eprintln!("NVRTC {ma}.{mi}");
    assert!(ma >= 12, "NVRTC {ma}.{mi}");

    // The kernel source alone (what the backend loads).
    let alone = cuda::compile(&kernel_source(), Target::Ptx(Some((9, 0)))).unwrap();
    eprintln!(
        "kernel_source(): {} bytes of PTX, options {:?}, log: {}",
        alone.code.len(),
        alone.options,
        if alone.log.is_empty() {
            "(empty)"
        } else {
            &alone.log
        }
    );

    // The int8 products are there and multiply with dp4a.
    let text = String::from_utf8_lossy(&alone.code);
    for k in ["quantize_q8x", "mul_mat_q8_q4_k", "mul_mat_id_q8_iq4_xs"] {
        assert!(
            text.contains(&format!(".entry {k}(")),
            "no kernel {k} in the PTX"
        );
    }
    assert!(text.contains("dp4a.s32.s32"), "no dp4a in the PTX");
    // Prompt batches' int8 products on tensor cores (sm_80 and later).
    for k in ["mul_mat_q8_mma_q4_k", "mul_mat_id_grouped_q8_mma_iq4_xs"] {
        assert!(
            text.contains(&format!(".entry {k}(")),
            "no kernel {k} in the PTX"
        );
    }
    assert!(
        text.contains("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32"),
        "no int8 mma in the PTX"
    );

    // With the test kernels: PTX for compute_90 ...
    let src = test_source();
    let ptx = cuda::compile_ptx(&src, Some((9, 0))).unwrap();
    assert!(
        ptx.contains(".target sm_90"),
        "{}",
        &ptx[..ptx.len().min(600)]
    );
    for k in [
        "moxie_test_axpy",
        "moxie_test_block_sum",
        "moxie_test_reverse",
        "moxie_test_args",
    ] {
        assert!(
            ptx.contains(&format!(".entry {k}(")),
            "{k} missing from the PTX"
        );
    }
    // ... and a cubin for sm_90 (what the backend loads).
    let c = cuda::compile(&src, Target::Cubin((9, 0))).unwrap();
    assert_eq!(&c.code[..4], b"\x7fELF", "a cubin is an ELF image");
    eprintln!(
        "with test kernels: {} bytes of PTX, {} bytes of cubin, log: {}",
        ptx.len(),
        c.code.len(),
        if c.log.is_empty() { "(empty)" } else { &c.log }
    );
    // H200 is sm_90 too; sm_80 (A100) and sm_89 compile as well.
    for arch in [(8, 0), (8, 9)] {
        cuda::compile_cubin(&src, arch).unwrap();
    }
}

#[test]
fn compile_errors_carry_the_log() {
    if skip_without_nvrtc() {
        return;
    }
    let src = "extern \"C\" __global__ void broken(float* y) { y[0] = undefined_thing; }";
    let e = cuda::compile_ptx(src, Some((9, 0))).expect_err("does not compile");
    let msg = message(&e);
    assert!(msg.contains("undefined_thing"), "{msg}");
    assert!(msg.contains("NVRTC"), "{msg}");
    assert!(msg.contains("compute_90"), "{msg}");
    eprintln!("{msg}");

    // An architecture NVRTC does not know.
    let e = cuda::compile_cubin("extern \"C\" __global__ void k() {}", (1, 0)).unwrap_err();
    let msg = message(&e);
    assert!(msg.contains("sm_10"), "{msg}");
    eprintln!("{msg}");
}

#[test]
fn kernel_cache_round_trip_and_damage() {
    if skip_without_nvrtc() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("moxie-kernel-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = format!("{}\n// cache test\n", test_source());

    let (first, origin) = cuda::cached_cubin(&src, (9, 0), Some(&dir)).unwrap();
    assert_eq!(origin, CubinOrigin::Compiled);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(
        files.len(),
        1,
        "one cache file, no temporary left: {files:?}"
    );
    let file = files[0].path();
    assert!(file.to_string_lossy().ends_with("-sm_90.cubin"), "{file:?}");

    let (again, origin) = cuda::cached_cubin(&src, (9, 0), Some(&dir)).unwrap();
    assert_eq!(origin, CubinOrigin::Disk);
    assert_eq!(again, first);

    // Other options (architecture) or source: another key.
    let (_, origin) = cuda::cached_cubin(&src, (8, 0), Some(&dir)).unwrap();
    assert_eq!(origin, CubinOrigin::Compiled);
    let (_, origin) = cuda::cached_cubin(&format!("{src}\n"), (9, 0), Some(&dir)).unwrap();
    assert_eq!(origin, CubinOrigin::Compiled);

    // A damaged file is recompiled (and rewritten).
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&file, &bytes).unwrap();
    let (fixed, origin) = cuda::cached_cubin(&src, (9, 0), Some(&dir)).unwrap();
    assert_eq!(origin, CubinOrigin::Compiled);
    assert_eq!(fixed, first);
    assert_eq!(
        cuda::cached_cubin(&src, (9, 0), Some(&dir)).unwrap().1,
        CubinOrigin::Disk
    );
    // A truncated one too.
    std::fs::write(&file, &bytes[..10]).unwrap();
    assert_eq!(
        cuda::cached_cubin(&src, (9, 0), Some(&dir)).unwrap().1,
        CubinOrigin::Compiled
    );

    // A cache that cannot be written (its directory would be under a file) is no error.
    let blocked = dir.join("not-a-dir");
    std::fs::write(&blocked, b"x").unwrap();
    let (c, origin) = cuda::cached_cubin(&src, (9, 0), Some(&blocked.join("kernels"))).unwrap();
    assert_eq!(origin, CubinOrigin::Compiled);
    assert_eq!(c, first);

    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cache_dir_follows_the_environment() {
    // Only reads the variables this process was started with, so other tests are unaffected.
    let dir = cuda::kernel_cache_dir();
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if set("MOXIE_KERNEL_CACHE") {
        assert_eq!(
            dir.unwrap(),
            std::path::PathBuf::from(std::env::var_os("MOXIE_KERNEL_CACHE").unwrap())
        );
    } else if set("XDG_CACHE_HOME") {
        assert!(dir.unwrap().ends_with("moxie/kernels"));
    } else if set("HOME") {
        assert!(dir.unwrap().ends_with(".cache/moxie/kernels"));
    }
}

// ---------------------------------------------------------------------------------------------
// On a GPU (ignored: `cargo test -p moxie-gpu --features cuda -- --ignored`)
// ---------------------------------------------------------------------------------------------

fn gpu() -> Arc<dyn GpuBackend> {
    CudaGpu::open_with_source(0, &test_source()).expect("CUDA0 with the test kernels")
}

fn read_f32(b: &Buffer, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    b.read_f32(0, &mut v).unwrap();
    v
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_open_describes_the_device() {
    let n = cuda::device_count().unwrap();
    assert!(n >= 1);
    let g = CudaGpu::open(0).unwrap();
    eprintln!("{g:?}");
    assert_eq!(g.name(), "CUDA0");
    assert!(g.compute_capability().0 >= 7);
    assert!(g.driver_version().0 >= 12, "{:?}", g.driver_version());
    // The kernels were compiled by an NVRTC of the driver's CUDA major or older.
    let (library, nvrtc) = cuda::nvrtc_library().unwrap();
    eprintln!("NVRTC {}.{} from {library}", nvrtc.0, nvrtc.1);
    assert!(nvrtc.0 <= g.driver_version().0, "{nvrtc:?}");
    // Opened once per process.
    assert!(Arc::ptr_eq(&g, &CudaGpu::open(0).unwrap()));
    let e = CudaGpu::open(n).unwrap_err();
    let msg = message(&e);
    assert!(msg.contains(&format!("CUDA{n}")), "{msg}");
    assert!(msg.contains(&format!("{n} CUDA device")), "{msg}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_memory_info() {
    let g = gpu();
    let (total, free) = g.memory().unwrap();
    eprintln!("total {total} free {free}");
    assert!(total > 1 << 30 && free <= total && free > 0);
    // Memory given back to the pool counts as free again.
    let b = Buffer::new(&g, 1 << 30).unwrap();
    g.synchronize().unwrap();
    let (_, during) = g.memory().unwrap();
    // (Other tests run alongside and allocate too: a loose margin.)
    assert!(during + (1 << 30) <= free + (512 << 20), "{during} {free}");
    drop(b);
    g.synchronize().unwrap();
    let (_, after) = g.memory().unwrap();
    assert!(after + (512 << 20) >= free, "{after} {free}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_upload_download_round_trip() {
    let g = gpu();
    // Sizes around the staging chunk, and more than two chunks (double buffering).
    for len in [
        1usize,
        3,
        4096,
        cuda::STAGING_CHUNK - 1,
        cuda::STAGING_CHUNK,
        cuda::STAGING_CHUNK + 7,
        5 * cuda::STAGING_CHUNK / 2 + 3,
    ] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
        let b = Buffer::from_bytes(&g, &data).unwrap();
        let mut back = vec![0u8; len];
        b.read(0, &mut back).unwrap();
        assert!(back == data, "round trip of {len} bytes");
        // Partial reads and writes at an offset.
        if len > 100 {
            b.write(10, &[0xAB; 50]).unwrap();
            let mut part = vec![0u8; 70];
            b.read(0, &mut part).unwrap();
            assert_eq!(&part[..10], &data[..10]);
            assert!(part[10..60].iter().all(|&x| x == 0xAB));
            assert_eq!(&part[60..], &data[60..70]);
        }
        g.zero(b.ptr(), len).unwrap();
        b.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == 0), "zero of {len} bytes");
    }
    // Uploads queued back to back (the staging buffers are reused while the copies run),
    // then one read of all.
    let n = 3 * cuda::STAGING_CHUNK / 4;
    let b = Buffer::new(&g, 8 * n).unwrap();
    for i in 0..8 {
        b.write(i * n, &vec![i as u8 + 1; n]).unwrap();
    }
    let mut all = vec![0u8; 8 * n];
    b.read(0, &mut all).unwrap();
    for i in 0..8 {
        assert!(
            all[i * n..(i + 1) * n].iter().all(|&x| x == i as u8 + 1),
            "part {i}"
        );
    }
    // Many small uploads (more than the small-upload ring holds), each followed by a kernel
    // that reads the buffer it overwrote: each lands in order.
    let m = 4096usize;
    let small = Buffer::from_f32(&g, &vec![1.0f32; m]).unwrap();
    let acc = Buffer::from_f32(&g, &vec![0.0f32; m]).unwrap();
    for round in 0..40 {
        let v = vec![round as f32; m];
        small.write_f32(0, &v).unwrap();
        // acc += 1 * small
        g.launch(
            "moxie_test_axpy",
            LaunchConfig::linear(m.div_ceil(256) as u32, 256),
            &[
                Arg::Ptr(acc.ptr()),
                Arg::Ptr(small.ptr()),
                Arg::F32(1.0),
                Arg::I32(m as i32),
            ],
        )
        .unwrap();
    }
    let want: f32 = (0..40).map(|r| r as f32).sum();
    assert!(read_f32(&acc, m).iter().all(|&x| x == want));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_copy_and_launch_speed() {
    // Not a check: numbers for the record (run with --nocapture).
    let g = gpu();
    let len = 256 << 20;
    let data = vec![7u8; len];
    let b = Buffer::new(&g, len).unwrap();
    b.write(0, &data).unwrap();
    g.synchronize().unwrap();
    let t = std::time::Instant::now();
    b.write(0, &data).unwrap();
    g.synchronize().unwrap();
    let up = t.elapsed();
    let mut back = vec![0u8; len];
    let t = std::time::Instant::now();
    b.read(0, &mut back).unwrap();
    let down = t.elapsed();
    assert!(back == data);
    let gbs = |d: std::time::Duration| len as f64 / d.as_secs_f64() / 1e9;
    eprintln!(
        "upload {:.1} GB/s, download {:.1} GB/s (256 MiB, pageable source)",
        gbs(up),
        gbs(down)
    );

    let x = Buffer::from_f32(&g, &[1.0; 256]).unwrap();
    let y = Buffer::from_f32(&g, &[0.0; 256]).unwrap();
    let args = [
        Arg::Ptr(y.ptr()),
        Arg::Ptr(x.ptr()),
        Arg::F32(1.0),
        Arg::I32(256),
    ];
    let n = 20_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        g.launch("moxie_test_axpy", LaunchConfig::linear(1, 256), &args)
            .unwrap();
    }
    let queued = t.elapsed();
    g.synchronize().unwrap();
    let all = t.elapsed();
    eprintln!(
        "{n} launches: {:.2} us each to queue, {:.2} us each to run",
        queued.as_secs_f64() * 1e6 / n as f64,
        all.as_secs_f64() * 1e6 / n as f64
    );
    let mut one = [0u8; 4];
    let t = std::time::Instant::now();
    for _ in 0..1000 {
        y.read(0, &mut one).unwrap();
    }
    eprintln!(
        "4-byte download round trip: {:.1} us",
        t.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(f32::from_ne_bytes(one), n as f32);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_concurrent_copies() {
    let g = gpu();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let g = Arc::clone(&g);
            s.spawn(move || {
                for round in 0..20usize {
                    let len = 1000 + round * 50_000;
                    let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ t).collect();
                    let b = Buffer::from_bytes(&g, &data).unwrap();
                    let mut back = vec![0u8; len];
                    b.read(0, &mut back).unwrap();
                    assert!(back == data, "thread {t} round {round}");
                }
            });
        }
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_kernel_launches() {
    let g = gpu();
    let n = 100_003usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let bx = Buffer::from_f32(&g, &x).unwrap();
    let by = Buffer::from_f32(&g, &y).unwrap();
    g.launch(
        "moxie_test_axpy",
        LaunchConfig::linear(n.div_ceil(256) as u32, 256),
        &[
            Arg::Ptr(by.ptr()),
            Arg::Ptr(bx.ptr()),
            Arg::F32(2.0),
            Arg::I32(n as i32),
        ],
    )
    .unwrap();
    let out = read_f32(&by, n);
    for i in 0..n {
        assert_eq!(out[i], 2.0 * x[i] + y[i], "element {i}");
    }

    // The prelude's block reduction.
    let v: Vec<f32> = (0..5000).map(|i| (i % 7) as f32).collect();
    let bv = Buffer::from_f32(&g, &v).unwrap();
    let bs = Buffer::new(&g, 4).unwrap();
    g.launch(
        "moxie_test_block_sum",
        LaunchConfig::linear(1, 256),
        &[
            Arg::Ptr(bs.ptr()),
            Arg::Ptr(bv.ptr()),
            Arg::I32(v.len() as i32),
        ],
    )
    .unwrap();
    assert_eq!(read_f32(&bs, 1)[0], v.iter().sum::<f32>());

    // Dynamic shared memory, past the 48 KiB that needs no opt-in.
    let m = 20_000usize; // 80 000 bytes
    let src: Vec<f32> = (0..m).map(|i| i as f32).collect();
    let bsrc = Buffer::from_f32(&g, &src).unwrap();
    let bdst = Buffer::new(&g, 4 * m).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [512, 1, 1],
        shared_bytes: (4 * m) as u32,
    };
    g.launch(
        "moxie_test_reverse",
        cfg,
        &[
            Arg::Ptr(bdst.ptr()),
            Arg::Ptr(bsrc.ptr()),
            Arg::I32(m as i32),
        ],
    )
    .unwrap();
    let rev = read_f32(&bdst, m);
    assert!(rev.iter().rev().eq(src.iter()));

    // Every argument kind reaches the kernel intact.
    let bo = Buffer::new(&g, 5 * 8).unwrap();
    g.launch(
        "moxie_test_args",
        LaunchConfig::linear(1, 1),
        &[
            Arg::Ptr(bo.ptr()),
            Arg::I32(-7),
            Arg::U32(4_000_000_000),
            Arg::I64(-(1 << 40)),
            Arg::U64(1 << 50),
            Arg::F32(2.25),
        ],
    )
    .unwrap();
    let mut raw = [0u8; 40];
    bo.read(0, &mut raw).unwrap();
    let got: Vec<i64> = raw
        .chunks(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, [-7, 4_000_000_000, -(1 << 40), 1 << 50, 9]);

    // f32_bytes is what uploads use.
    assert_eq!(f32_bytes(&[1.0]).len(), 4);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_launch_errors() {
    let g = gpu();
    let e = g
        .launch("no_such_kernel", LaunchConfig::linear(1, 1), &[])
        .unwrap_err();
    let msg = message(&e);
    assert!(
        msg.contains("no_such_kernel") && msg.contains("CUDA0"),
        "{msg}"
    );
    // Wrong argument count / sizes: refused before the launch (driver 12.4+ tells sizes).
    let b = Buffer::new(&g, 16).unwrap();
    let e = g
        .launch(
            "moxie_test_axpy",
            LaunchConfig::linear(1, 32),
            &[Arg::Ptr(b.ptr()), Arg::Ptr(b.ptr()), Arg::F32(1.0)],
        )
        .unwrap_err();
    let msg = message(&e);
    assert!(msg.contains("takes 4 parameters"), "{msg}");
    let e = g
        .launch(
            "moxie_test_axpy",
            LaunchConfig::linear(1, 32),
            &[
                Arg::Ptr(b.ptr()),
                Arg::Ptr(b.ptr()),
                Arg::F32(1.0),
                Arg::I64(4),
            ],
        )
        .unwrap_err();
    assert!(message(&e).contains("sizes"), "{e}");
    // A block too big for the device: the launch itself fails.
    let e = g
        .launch(
            "moxie_test_axpy",
            LaunchConfig::linear(1, 4096),
            &[
                Arg::Ptr(b.ptr()),
                Arg::Ptr(b.ptr()),
                Arg::F32(1.0),
                Arg::I32(4),
            ],
        )
        .unwrap_err();
    assert!(message(&e).contains("cuLaunchKernel"), "{e}");
    // The device still works afterwards.
    g.synchronize().unwrap();
}
