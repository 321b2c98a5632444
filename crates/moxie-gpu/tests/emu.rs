//! The CPU emulator of CUDA's execution model (`emu/`), tested with its own kernels
//! (`emu/test_kernels.cu`): block and warp reductions, shuffles and votes against the PTX
//! definition, shared memory, grids, atomics, the errors (divergent barriers, arguments, launch
//! shapes, memory), the f16 conversions of `kernels/common.cuh` against the `half` crate, and
//! launches from parallel threads.

use std::sync::Arc;
use std::time::Instant;

use bytemuck::Pod;
use moxie_gpu::emu::{self, EmuGpu};
use moxie_gpu::{Arg, Buffer, DevPtr, Error, GpuBackend, LaunchConfig};

fn device() -> (Arc<EmuGpu>, Arc<dyn GpuBackend>) {
    let gpu = EmuGpu::new("EMU0", 1 << 30);
    let backend: Arc<dyn GpuBackend> = gpu.clone();
    (gpu, backend)
}

fn upload<T: Pod>(b: &Arc<dyn GpuBackend>, data: &[T]) -> Buffer {
    Buffer::from_bytes(b, bytemuck::cast_slice(data)).unwrap()
}

fn output<T: Pod>(b: &Arc<dyn GpuBackend>, n: usize) -> Buffer {
    Buffer::new(b, n * size_of::<T>()).unwrap()
}

fn read<T: Pod>(buf: &Buffer) -> Vec<T> {
    let mut v = vec![T::zeroed(); buf.len() / size_of::<T>()];
    buf.read(0, bytemuck::cast_slice_mut(&mut v)).unwrap();
    v
}

fn shape(grid: [u32; 3], block: [u32; 3], shared_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        shared_bytes,
    }
}

/// The message of a failed launch (panics if it did not fail as a kernel error).
fn launch_error(b: &Arc<dyn GpuBackend>, name: &str, cfg: LaunchConfig, args: &[Arg]) -> String {
    match b.launch(name, cfg, args) {
        Err(Error::Kernel { kernel, msg }) => {
            assert_eq!(kernel, name);
            msg
        }
        other => panic!("{name}: expected a kernel error, got {other:?}"),
    }
}

/// Small integers as floats: sums are exact in any order.
fn small_ints(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104729) % 201) as f32 - 100.0)
        .collect()
}

fn check_block_reduce(b: &Arc<dyn GpuBackend>, threads: u32, rows: usize, n: usize, seed: usize) {
    let x = small_ints(rows * n, seed);
    let xb = upload(b, &x);
    let sums = output::<f32>(b, rows * threads as usize);
    let maxs = output::<f32>(b, rows * threads as usize);
    b.launch(
        "emutest_block_reduce",
        LaunchConfig::linear(rows as u32, threads),
        &[
            Arg::Ptr(xb.ptr()),
            Arg::Ptr(sums.ptr()),
            Arg::Ptr(maxs.ptr()),
            Arg::I32(n as i32),
        ],
    )
    .unwrap();
    let (s, m) = (read::<f32>(&sums), read::<f32>(&maxs));
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let want_sum: f32 = row.iter().sum();
        let want_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for t in 0..threads as usize {
            let o = r * threads as usize + t;
            assert_eq!(
                s[o], want_sum,
                "sum, {threads} threads, row {r}, thread {t}"
            );
            assert_eq!(
                m[o], want_max,
                "max, {threads} threads, row {r}, thread {t}"
            );
        }
    }
}

#[test]
fn block_sum_and_max() {
    let (gpu, b) = device();
    for (threads, n) in [(1024, 5000), (1024, 1024), (96, 777), (96, 1), (32, 100)] {
        check_block_reduce(&b, threads, 3, n, threads as usize + n);
    }
    assert_eq!(gpu.launches(), 5);
}

#[derive(Clone, Copy)]
enum Mode {
    Up,
    Down,
    Bfly,
    Idx,
}

/// The lane a shuffle reads, as PTX defines `shfl.sync` (with the `c` operand CUDA's
/// `__shfl_*_sync` pass for `width`); the lane itself when out of its segment.
fn ptx_source(mode: Mode, lane: u32, b: u32, width: u32) -> u32 {
    let c = match mode {
        Mode::Up => (32 - width) << 8,
        _ => ((32 - width) << 8) | 0x1f,
    };
    let bval = b & 31;
    let cval = c & 31;
    let segmask = (c >> 8) & 31;
    let max_lane = ((lane & segmask) | (cval & !segmask)) as i32;
    let min_lane = lane & segmask;
    let (j, pval) = match mode {
        Mode::Up => {
            let j = lane as i32 - bval as i32;
            (j, j >= max_lane)
        }
        Mode::Down => {
            let j = (lane + bval) as i32;
            (j, j <= max_lane)
        }
        Mode::Bfly => {
            let j = (lane ^ bval) as i32;
            (j, j <= max_lane)
        }
        Mode::Idx => {
            let j = (min_lane | (bval & !segmask)) as i32;
            (j, j <= max_lane)
        }
    };
    if pval {
        j as u32
    } else {
        lane
    }
}

#[test]
fn warp_shuffles_and_votes() {
    let (_gpu, b) = device();
    // 1-D blocks of 3 warps and 2-D blocks (lanes follow the linear thread index).
    for (grid, block) in [(2u32, [96u32, 1, 1]), (3, [16, 4, 1]), (1, [8, 4, 2])] {
        let threads = (grid * block[0] * block[1] * block[2]) as usize;
        let vals: Vec<i32> = (0..threads).map(|i| ((i * 37 + 11) % 23) as i32).collect();
        let input = upload(&b, &vals);
        let out = output::<i32>(&b, 8 * threads);
        for width in [32u32, 16, 8, 4, 2, 1] {
            for delta in [0i32, 1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 32, 33, 40] {
                b.launch(
                    "emutest_shuffles",
                    shape([grid, 1, 1], block, 0),
                    &[
                        Arg::Ptr(input.ptr()),
                        Arg::Ptr(out.ptr()),
                        Arg::I32(delta),
                        Arg::I32(width as i32),
                    ],
                )
                .unwrap();
                let got = read::<i32>(&out);
                for t in 0..threads {
                    let lane = (t % 32) as u32;
                    let warp = &vals[t - lane as usize..t - lane as usize + 32];
                    let at = |m: Mode| warp[ptx_source(m, lane, delta as u32, width) as usize];
                    let ballot = (0..32).fold(0u32, |a, l| a | (((warp[l] & 1) as u32) << l));
                    let want = [
                        at(Mode::Bfly),
                        at(Mode::Down),
                        at(Mode::Up),
                        at(Mode::Idx),
                        ballot as i32,
                        warp.contains(&delta) as i32,
                        !warp.contains(&7) as i32,
                        warp.iter().sum(),
                    ];
                    assert_eq!(
                        got[8 * t..8 * t + 8],
                        want,
                        "block {block:?}, width {width}, delta {delta}, thread {t} \
                         (xor, down, up, idx, ballot, any, all, warp sum)"
                    );
                }
            }
        }
    }
}

#[test]
fn shuffles_of_other_types() {
    let (_gpu, b) = device();
    let out = output::<u32>(&b, 4 * 32);
    b.launch(
        "emutest_shuffle_types",
        LaunchConfig::linear(1, 32),
        &[Arg::Ptr(out.ptr())],
    )
    .unwrap();
    let got = read::<u32>(&out);
    for t in 0..32u32 {
        let down = if t + 5 < 32 { t + 5 } else { t };
        let up = t.saturating_sub(1);
        let want = [
            ((t ^ 3) as f32 + 0.25).to_bits(),
            0x8000_0000 | down,
            31 - t,
            up,
        ];
        assert_eq!(got[4 * t as usize..4 * t as usize + 4], want, "lane {t}");
    }
}

#[test]
fn half_warp_masks() {
    let (_gpu, b) = device();
    let out = output::<i32>(&b, 64);
    b.launch(
        "emutest_subwarp",
        LaunchConfig::linear(1, 64),
        &[Arg::Ptr(out.ptr())],
    )
    .unwrap();
    let got = read::<i32>(&out);
    for t in 0..64i32 {
        let lane = t % 32;
        let base = t - lane;
        let want = if lane < 16 {
            (t ^ 1) + 100 * (base + 14)
        } else {
            let v = if lane < 31 { t + 1 } else { t };
            v + 900
        };
        assert_eq!(got[t as usize], want, "thread {t}");
    }
}

#[test]
fn shuffle_from_an_exited_lane_reads_its_last_value() {
    let (_gpu, b) = device();
    let out = output::<i32>(&b, 64);
    b.launch(
        "emutest_exited_lane",
        LaunchConfig::linear(1, 64),
        &[Arg::Ptr(out.ptr())],
    )
    .unwrap();
    let got = read::<i32>(&out);
    for t in 0..64i32 {
        let want = match t % 32 {
            31 => -1, // never written: fresh device memory is all ones
            30 => t + 1,
            _ => (t + 1) * 10,
        };
        assert_eq!(got[t as usize], want, "thread {t}");
    }
}

#[test]
fn shared_memory_in_2d_blocks() {
    let (_gpu, b) = device();
    let (w, h) = (37usize, 21usize);
    let x: Vec<f32> = (0..w * h).map(|i| i as f32).collect();
    let input = upload(&b, &x);
    let out = output::<f32>(&b, w * h);
    b.launch(
        "emutest_transpose",
        shape(
            [w.div_ceil(16) as u32, h.div_ceil(16) as u32, 1],
            [16, 16, 1],
            0,
        ),
        &[
            Arg::Ptr(input.ptr()),
            Arg::Ptr(out.ptr()),
            Arg::I32(w as i32),
            Arg::I32(h as i32),
        ],
    )
    .unwrap();
    let got = read::<f32>(&out);
    for y in 0..w {
        for x_ in 0..h {
            assert_eq!(got[y * h + x_], x[x_ * w + y], "out[{y}][{x_}]");
        }
    }
}

#[test]
fn three_dimensional_grid() {
    let (_gpu, b) = device();
    let (grid, block) = ([3u32, 2, 4], [4u32, 2, 3]);
    let n = (grid.iter().product::<u32>() * block.iter().product::<u32>()) as usize;
    let out = output::<u32>(&b, 4 * n);
    b.launch(
        "emutest_grid3d",
        shape(grid, block, 0),
        &[Arg::Ptr(out.ptr())],
    )
    .unwrap();
    let got = read::<u32>(&out);
    let pack = |d: [u32; 3]| d[0] | d[1] << 8 | d[2] << 16;
    let mut i = 0;
    for bz in 0..grid[2] {
        for by in 0..grid[1] {
            for bx in 0..grid[0] {
                for tz in 0..block[2] {
                    for ty in 0..block[1] {
                        for tx in 0..block[0] {
                            let want = [
                                pack([bx, by, bz]),
                                pack([tx, ty, tz]),
                                pack(grid),
                                pack(block) | 32 << 24,
                            ];
                            assert_eq!(got[4 * i..4 * i + 4], want, "thread {i}");
                            i += 1;
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn dynamic_shared_memory_is_fresh_per_block() {
    let (_gpu, b) = device();
    let (blocks, threads) = (3usize, 64usize);
    let x: Vec<f32> = (0..blocks * threads).map(|i| i as f32 * 0.5).collect();
    let input = upload(&b, &x);
    let out = output::<f32>(&b, blocks * threads);
    let fresh = output::<u32>(&b, blocks * threads);
    for shared in [threads as u32 * 4, 48 * 1024] {
        b.launch(
            "emutest_dyn_shared",
            shape([blocks as u32, 1, 1], [threads as u32, 1, 1], shared),
            &[
                Arg::Ptr(input.ptr()),
                Arg::Ptr(out.ptr()),
                Arg::Ptr(fresh.ptr()),
            ],
        )
        .unwrap();
        assert!(read::<u32>(&fresh).iter().all(|&v| v == u32::MAX));
        let got = read::<f32>(&out);
        for blk in 0..blocks {
            for t in 0..threads {
                assert_eq!(got[blk * threads + t], x[blk * threads + threads - 1 - t]);
            }
        }
    }
}

#[test]
fn atomics() {
    let (_gpu, b) = device();
    let n = 1000usize;
    let vals: Vec<i32> = (0..n)
        .map(|i| (i % 17) as i32 - 3 + (i == 555) as i32 * 40)
        .collect();
    let input = upload(&b, &vals);
    let fsum = output::<f32>(&b, 1);
    let isum = output::<i32>(&b, 1);
    let count = output::<u32>(&b, 1);
    let imax = upload(&b, &[i32::MIN]);
    for buf in [&fsum, &isum, &count] {
        b.zero(buf.ptr(), buf.len()).unwrap();
    }
    b.launch(
        "emutest_atomics",
        LaunchConfig::linear(n.div_ceil(128) as u32, 128),
        &[
            Arg::Ptr(input.ptr()),
            Arg::I32(n as i32),
            Arg::Ptr(fsum.ptr()),
            Arg::Ptr(isum.ptr()),
            Arg::Ptr(imax.ptr()),
            Arg::Ptr(count.ptr()),
        ],
    )
    .unwrap();
    let total: i32 = vals.iter().sum();
    assert_eq!(read::<f32>(&fsum), [total as f32]);
    assert_eq!(read::<i32>(&isum), [total]);
    assert_eq!(read::<i32>(&imax), [*vals.iter().max().unwrap()]);
    assert_eq!(read::<u32>(&count), [n as u32]);
}

#[test]
fn syncthreads_count_and_or() {
    let (_gpu, b) = device();
    let out = output::<i32>(&b, 96);
    for (limit, want) in [(96, 4811), (0, 4800), (5, 4801)] {
        b.launch(
            "emutest_sync_count",
            LaunchConfig::linear(1, 96),
            &[Arg::Ptr(out.ptr()), Arg::I32(limit)],
        )
        .unwrap();
        assert!(
            read::<i32>(&out).iter().all(|&v| v == want),
            "limit {limit}"
        );
    }
}

#[test]
fn divergent_barriers_fail_the_launch() {
    let (gpu, b) = device();
    let out = output::<f32>(&b, 64);
    let msg = launch_error(
        &b,
        "emutest_diverge_exit",
        LaunchConfig::linear(2, 64),
        &[Arg::Ptr(out.ptr())],
    );
    assert!(
        msg.contains("divergent barrier in kernel emutest_diverge_exit, block (0,0,0)")
            && msg.contains("0 returned")
            && msg.contains("1-63 wait at __syncthreads"),
        "{msg}"
    );
    let msg = launch_error(
        &b,
        "emutest_diverge_mixed",
        LaunchConfig::linear(1, 64),
        &[Arg::Ptr(out.ptr())],
    );
    assert!(
        msg.contains("divergent barrier in kernel emutest_diverge_mixed")
            && msg.contains("0 wait at __syncwarp (mask 0xffffffff)")
            && msg.contains("1 wait at __syncthreads"),
        "{msg}"
    );
    let msg = launch_error(
        &b,
        "emutest_bad_mask",
        LaunchConfig::linear(1, 32),
        &[Arg::Ptr(out.ptr())],
    );
    assert!(
        msg.contains("thread (1,0,0)") && msg.contains("leaves it out"),
        "{msg}"
    );
    assert_eq!(gpu.launches(), 0);
    // The emulator is usable again.
    check_block_reduce(&b, 1024, 2, 3000, 1);
    check_block_reduce(&b, 96, 2, 300, 2);
    assert_eq!(gpu.launches(), 2);
}

#[test]
fn stack_overflow_is_reported() {
    let (_gpu, b) = device();
    let out = output::<i32>(&b, 32);
    let run = |bytes: i32| {
        b.launch(
            "emutest_stack",
            LaunchConfig::linear(2, 32),
            &[Arg::I32(bytes), Arg::Ptr(out.ptr())],
        )
    };
    run(32 * 1024).unwrap();
    // Into the canary zone at the bottom of the 64 KiB stacks, short of the guard page.
    match run(62 * 1024) {
        Err(Error::Kernel { msg, .. }) => {
            assert!(msg.contains("overflowed its fiber stack"), "{msg}")
        }
        other => panic!("expected a stack overflow error, got {other:?}"),
    }
    run(32 * 1024).unwrap();
}

#[test]
fn argument_checks() {
    let (_gpu, b) = device();
    let out = output::<f32>(&b, 5);
    let good = [
        Arg::Ptr(out.ptr()),
        Arg::I32(-3),
        Arg::U32(7),
        Arg::F32(2.5),
        Arg::I64(-1 << 40),
        Arg::U64(1 << 41),
    ];
    let cfg = LaunchConfig::linear(1, 32);
    b.launch("emutest_args", cfg, &good).unwrap();
    assert_eq!(
        read::<f32>(&out),
        [-3.0, 7.0, 2.5, -(2f32.powi(40)), 2f32.powi(41)]
    );
    // A device address as a 64-bit integer is accepted for a pointer parameter.
    let mut args = good;
    args[0] = Arg::U64(out.ptr().raw());
    b.launch("emutest_args", cfg, &args).unwrap();

    let msg = launch_error(&b, "emutest_args", cfg, &good[..5]);
    assert_eq!(msg, "kernel emutest_args takes 6 arguments, 5 given");
    let mut args = good;
    args[4] = Arg::I32(1);
    let msg = launch_error(&b, "emutest_args", cfg, &args);
    assert_eq!(
        msg,
        "kernel emutest_args argument 4: 4 bytes given, the parameter has 8"
    );
    let mut args = good;
    args[3] = Arg::I32(1);
    let msg = launch_error(&b, "emutest_args", cfg, &args);
    assert_eq!(
        msg,
        "kernel emutest_args argument 3: a signed integer given, the parameter is a float"
    );
    let mut args = good;
    args[1] = Arg::F32(1.0);
    let msg = launch_error(&b, "emutest_args", cfg, &args);
    assert!(msg.contains("argument 1: a float given"), "{msg}");
}

#[test]
fn math_helpers() {
    let (_gpu, b) = device();
    let out = output::<i32>(&b, 10);
    let fout = output::<f32>(&b, 8);
    b.launch(
        "emutest_math",
        LaunchConfig::linear(1, 1),
        &[Arg::Ptr(out.ptr()), Arg::Ptr(fout.ptr())],
    )
    .unwrap();
    assert_eq!(
        read::<i32>(&out),
        [2, 5, 8, 18, i32::MIN, 2, 4, 31, 4, 4 + 3 + 2 + 255 + 10]
    );
    assert_eq!(
        read::<f32>(&fout),
        [
            1.0,
            2.0,
            0.5,
            1.0,
            1.5,
            1.0,
            -2.0,
            0xff80_0000u32 as i32 as f32
        ]
    );
}

#[test]
fn launch_shape_checks() {
    let (_gpu, b) = device();
    let out = output::<f32>(&b, 64);
    let args = [Arg::Ptr(out.ptr())];
    for (cfg, want) in [
        (LaunchConfig::linear(1, 1025), "at most 1024 threads"),
        (shape([1, 1, 1], [1, 1, 65], 0), "at most 1024 threads"),
        (shape([1, 1, 1], [64, 32, 1], 0), "at most 1024 threads"),
        (LaunchConfig::linear(0, 32), "empty launch"),
        (shape([1, 70000, 1], [32, 1, 1], 0), "too large"),
        (
            shape([1, 1, 1], [32, 1, 1], 300 * 1024),
            "dynamic shared memory",
        ),
    ] {
        let msg = launch_error(&b, "emutest_diverge_exit", cfg, &args);
        assert!(msg.contains(want), "{cfg:?}: {msg}");
    }
    let msg = launch_error(&b, "no_such_kernel", LaunchConfig::linear(1, 32), &args);
    assert_eq!(msg, "no kernel named no_such_kernel");
}

#[test]
fn every_listed_kernel_can_be_found() {
    let names = emu::kernel_names();
    assert!(names.contains(&"emutest_block_reduce"));
    let (_gpu, b) = device();
    // Too many arguments for any kernel: each must answer with its own parameter count.
    let args = vec![Arg::I32(0); 40];
    for name in names {
        let msg = launch_error(&b, name, LaunchConfig::linear(1, 1), &args);
        assert!(
            msg.starts_with(&format!("kernel {name} takes ")),
            "{name}: {msg}"
        );
    }
}

#[test]
fn memory_budget() {
    let gpu = EmuGpu::new("EMU7", 1 << 20);
    let b: Arc<dyn GpuBackend> = gpu.clone();
    assert_eq!(b.memory().unwrap(), (1 << 20, 1 << 20));
    let first = Buffer::new(&b, 600 * 1024).unwrap();
    assert_eq!(b.memory().unwrap(), (1 << 20, 424 * 1024));
    match Buffer::new(&b, 600 * 1024) {
        Err(Error::Device { device, msg }) => {
            assert_eq!(device, "EMU7");
            assert!(
                msg.contains("out of memory")
                    && msg.contains("614400 bytes")
                    && msg.contains("434176 bytes"),
                "{msg}"
            );
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    drop(first);
    assert_eq!(b.memory().unwrap(), (1 << 20, 1 << 20));
    let second = Buffer::new(&b, 600 * 1024).unwrap();
    // Fresh memory reads as all ones.
    assert!(read::<u32>(&second).iter().all(|&v| v == u32::MAX));
}

#[test]
fn copies_outside_allocations_are_errors() {
    let (_gpu, b) = device();
    let buf = Buffer::new(&b, 64).unwrap();
    b.upload(buf.at(60), &[1, 2, 3, 4]).unwrap();
    let is_device_error = |r: moxie_gpu::Result<()>| match r {
        Err(Error::Device { device, msg }) => {
            assert_eq!(device, "EMU0");
            assert!(msg.contains("not inside a live allocation"), "{msg}");
        }
        other => panic!("expected a device error, got {other:?}"),
    };
    is_device_error(b.upload(buf.at(61), &[1, 2, 3, 4]));
    is_device_error(b.upload(DevPtr::from_raw(0x10), &[1]));
    is_device_error(b.download(DevPtr::from_raw(buf.ptr().raw() - 1), &mut [0u8; 4]));
    is_device_error(b.zero(buf.ptr(), 65));
    let gone = Buffer::new(&b, 16).unwrap();
    let addr = gone.ptr();
    drop(gone);
    is_device_error(b.upload(addr, &[0]));
}

#[test]
fn f16_conversions_match_the_half_crate() {
    let (_gpu, b) = device();
    // Every half to f32.
    let halves: Vec<u16> = (0..=u16::MAX).collect();
    let input = upload(&b, &halves);
    let out = output::<f32>(&b, halves.len());
    b.launch(
        "emutest_f16_to_f32",
        LaunchConfig::linear(256, 256),
        &[Arg::Ptr(input.ptr()), Arg::Ptr(out.ptr()), Arg::I32(65536)],
    )
    .unwrap();
    for (h, got) in halves.iter().zip(read::<f32>(&out)) {
        let want = half::f16::from_bits(*h).to_f32();
        if want.is_nan() {
            // Same sign and payload; half (like x86's vcvtph2ps) also sets the quiet bit.
            assert!(got.is_nan(), "{h:#06x}");
            assert_eq!(
                got.to_bits() | 0x40_0000,
                want.to_bits() | 0x40_0000,
                "{h:#06x}"
            );
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            let ggml = moxie_quant::f16::fp16_to_f32(*h);
            assert_eq!(got.to_bits(), ggml.to_bits(), "{h:#06x}");
        }
    }

    // Floats to half: every half's value, every midpoint between neighbours (ties) and the
    // floats next to it, subnormals, overflow, specials and random bit patterns.
    let mut floats = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc1_2345),
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        65504.0,
        65519.996,
        65520.0,
        1e6,
        2f32.powi(-24),
        2f32.powi(-25),
        f32::from_bits(2f32.powi(-25).to_bits() + 1),
        3.0 * 2f32.powi(-26),
        2f32.powi(-26),
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
    ];
    for h in 0..0x7c00u16 {
        let lo = half::f16::from_bits(h).to_f32();
        let hi = half::f16::from_bits(h + 1).to_f32();
        let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
        for f in [
            lo,
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ] {
            floats.push(f);
            floats.push(-f);
        }
    }
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..(1 << 18) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        floats.push(f32::from_bits(s as u32));
        // Mostly in the half range: exponents 2^-30..2^17.
        let bits = (s >> 32) as u32;
        floats.push(f32::from_bits(
            (bits & 0x807f_ffff) | ((97 + (bits >> 23) % 48) << 23),
        ));
    }
    let input = upload(&b, &floats);
    let out = output::<u16>(&b, floats.len());
    b.launch(
        "emutest_f32_to_f16",
        LaunchConfig::linear(floats.len().div_ceil(256) as u32, 256),
        &[
            Arg::Ptr(input.ptr()),
            Arg::Ptr(out.ptr()),
            Arg::I32(floats.len() as i32),
        ],
    )
    .unwrap();
    for (f, got) in floats.iter().zip(read::<u16>(&out)) {
        let want = half::f16::from_f32(*f);
        if f.is_nan() {
            // ggml's convention: a quiet NaN with the input's sign.
            assert!(want.is_nan());
            let sign = ((f.to_bits() >> 16) & 0x8000) as u16;
            assert_eq!(got, 0x7e00 | sign, "{f:e} ({:#010x})", f.to_bits());
        } else {
            assert_eq!(got, want.to_bits(), "{f:e} ({:#010x})", f.to_bits());
        }
        assert_eq!(
            got,
            moxie_quant::f16::f32_to_fp16(*f),
            "{f:e} ({:#010x})",
            f.to_bits()
        );
    }
}

#[test]
fn parallel_launches() {
    let shared = EmuGpu::new("EMU-shared", 1 << 28);
    std::thread::scope(|scope| {
        for i in 0..4usize {
            let shared: Arc<dyn GpuBackend> = shared.clone();
            scope.spawn(move || {
                let own: Arc<dyn GpuBackend> = EmuGpu::new(&format!("EMU{i}"), 1 << 28);
                for round in 0..6 {
                    for b in [&own, &shared] {
                        let threads = [1024, 96, 256][(i + round) % 3];
                        check_block_reduce(b, threads, 2, 700 + 50 * i + round, i * 10 + round);
                    }
                }
            });
        }
    });
}

#[test]
fn switch_rate() {
    let (gpu, b) = device();
    let out = output::<f32>(&b, 4 * 1024);
    for (blocks, threads, iters) in [(1u32, 1024u32, 200i32), (4, 256, 200), (16, 32, 400)] {
        let before = emu::switches();
        let start = Instant::now();
        b.launch(
            "emutest_spin",
            LaunchConfig::linear(blocks, threads),
            &[Arg::Ptr(out.ptr()), Arg::I32(iters)],
        )
        .unwrap();
        let secs = start.elapsed().as_secs_f64();
        let n = emu::switches() - before;
        println!(
            "emulator: {blocks} x {threads} threads, {iters} block sums: {n} fiber switches in \
             {:.1} ms = {:.1} M switches/s",
            secs * 1e3,
            n as f64 / secs / 1e6
        );
        assert!(n > 0);
    }
    // Threads that run to the end without a barrier: one switch each.
    let n = 1 << 20;
    let input = output::<u16>(&b, n);
    b.zero(input.ptr(), input.len()).unwrap();
    let out = output::<f32>(&b, n);
    let start = Instant::now();
    b.launch(
        "emutest_f16_to_f32",
        LaunchConfig::linear(n as u32 / 256, 256),
        &[
            Arg::Ptr(input.ptr()),
            Arg::Ptr(out.ptr()),
            Arg::I32(n as i32),
        ],
    )
    .unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "emulator: {n} threads without barriers in {:.1} ms = {:.1} M threads/s",
        secs * 1e3,
        n as f64 / secs / 1e6
    );
    assert_eq!(gpu.launches(), 4);
}
