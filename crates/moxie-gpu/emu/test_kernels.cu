// Kernels that test the emulator itself (tests/emu.rs). Host-only: kernel_source() in
// src/lib.rs does not include this file, so NVRTC never sees it.

// Every thread writes the block's sum and max of its row of `n` values (one row per block).
extern "C" __global__ void emutest_block_reduce(const float* x, float* sums, float* maxs, int n) {
    __shared__ float scratch[32];
    const float* row = x + (size_t)blockIdx.x * n;
    float s = 0.0f;
    float m = MX_NEG_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        s += row[i];
        m = fmaxf(m, row[i]);
    }
    float ts = mx_block_sum(s, scratch);
    float tm = mx_block_max(m, scratch);
    size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    sums[o] = ts;
    maxs[o] = tm;
}

// Thread t (by linear index in a 1-D grid of 1-, 2- or 3-D blocks) writes 8 results to out[8t..].
extern "C" __global__ void emutest_shuffles(const int* in, int* out, int delta, int width) {
    unsigned t = blockIdx.x * blockDim.x * blockDim.y * blockDim.z +
                 threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int v = in[t];
    int* o = out + 8 * (size_t)t;
    o[0] = __shfl_xor_sync(0xffffffffu, v, delta, width);
    o[1] = __shfl_down_sync(0xffffffffu, v, (unsigned)delta, width);
    o[2] = __shfl_up_sync(0xffffffffu, v, (unsigned)delta, width);
    o[3] = __shfl_sync(0xffffffffu, v, delta, width);
    o[4] = (int)__ballot_sync(0xffffffffu, v & 1);
    o[5] = __any_sync(0xffffffffu, v == delta);
    o[6] = __all_sync(0xffffffffu, v != 7);
    o[7] = (int)mx_warp_sum((float)v);
}

// Shuffles of float, unsigned and 64-bit values: out[4t..] per thread.
extern "C" __global__ void emutest_shuffle_types(unsigned* out) {
    unsigned t = threadIdx.x;
    float f = (float)t + 0.25f;
    unsigned u = 0x80000000u | t;
    unsigned long long w = ((unsigned long long)t << 40) | 0xabcdefull;
    double d = (double)t * 0.5;
    out[4 * t + 0] = __float_as_uint(__shfl_xor_sync(0xffffffffu, f, 3));
    out[4 * t + 1] = __shfl_down_sync(0xffffffffu, u, 5);
    out[4 * t + 2] = (unsigned)(__shfl_sync(0xffffffffu, w, 31 - (int)t) >> 40);
    out[4 * t + 3] = (unsigned)(__shfl_up_sync(0xffffffffu, d, 1) * 2.0);
}

// Lanes 0-15 and 16-31 of each warp shuffle and sync under their own half-warp masks, in a
// different order, so the two groups' barriers interleave.
extern "C" __global__ void emutest_subwarp(int* out) {
    unsigned t = threadIdx.x;
    unsigned lane = t % 32;
    int v = (int)t;
    if (lane < 16) {
        v = __shfl_xor_sync(0x0000ffffu, v, 1);
        __syncwarp(0x0000ffffu);
        v += 100 * __shfl_sync(0x0000ffffu, v, 15);
    } else {
        __syncwarp(0xffff0000u);
        v = __shfl_down_sync(0xffff0000u, v, 1, 16);
        v += 100 * (int)__popc(__ballot_sync(0xffff0000u, v & 1));
    }
    __syncwarp();
    out[t] = v;
}

// Lane 31 of each warp returns after a first shuffle; the others shuffle again: lane 30 then
// reads what lane 31 passed to its last warp operation.
extern "C" __global__ void emutest_exited_lane(int* out) {
    unsigned lane = threadIdx.x % 32;
    int v = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 0);
    if (lane == 31) {
        return;
    }
    out[threadIdx.x] = __shfl_down_sync(0x7fffffffu, v * 10, 1);
}

#define EMUTEST_TILE 16
// Tiled transpose of an h x w matrix through shared memory: 16x16 blocks, 2-D grid.
extern "C" __global__ void emutest_transpose(const float* in, float* out, int w, int h) {
    __shared__ float tile[EMUTEST_TILE][EMUTEST_TILE + 1];
    unsigned x = blockIdx.x * EMUTEST_TILE + threadIdx.x;
    unsigned y = blockIdx.y * EMUTEST_TILE + threadIdx.y;
    if (x < (unsigned)w && y < (unsigned)h) {
        tile[threadIdx.y][threadIdx.x] = in[y * w + x];
    }
    __syncthreads();
    x = blockIdx.y * EMUTEST_TILE + threadIdx.x;
    y = blockIdx.x * EMUTEST_TILE + threadIdx.y;
    if (x < (unsigned)h && y < (unsigned)w) {
        out[y * h + x] = tile[threadIdx.x][threadIdx.y];
    }
}

// Every thread of a 3-D grid of 3-D blocks writes its coordinates.
extern "C" __global__ void emutest_grid3d(unsigned* out) {
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* o = out + 4 * ((size_t)b * blockDim.x * blockDim.y * blockDim.z + t);
    o[0] = blockIdx.x | blockIdx.y << 8 | blockIdx.z << 16;
    o[1] = threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16;
    o[2] = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
    o[3] = blockDim.x | blockDim.y << 8 | blockDim.z << 16 | (unsigned)warpSize << 24;
}

// Reverses each block's slice through dynamic shared memory (blockDim.x floats); `fresh` gets
// what each thread read there before anything was written.
extern "C" __global__ void emutest_dyn_shared(const float* in, float* out, unsigned* fresh) {
    MX_DYN_SHARED(float, buf);
    unsigned n = blockDim.x;
    size_t i = (size_t)blockIdx.x * n + threadIdx.x;
    fresh[i] = ((const unsigned*)buf)[threadIdx.x];
    __syncthreads();
    buf[threadIdx.x] = in[i];
    __syncthreads();
    out[i] = buf[n - 1 - threadIdx.x];
}

extern "C" __global__ void emutest_atomics(const int* vals, int n, float* fsum, int* isum, int* imax,
                                           unsigned* count) {
    __shared__ int block_sum;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x == 0) {
        block_sum = 0;
    }
    __syncthreads();
    if (i < n) {
        atomicAdd(fsum, vals[i]);  // converted to float, as CUDA's overload does
        atomicAdd(&block_sum, vals[i]);
        atomicMax(imax, vals[i]);
        atomicAdd(count, 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(isum, block_sum);
    }
}

// out[t] = how many threads of the block have an odd index, and the and/or of "index < limit".
extern "C" __global__ void emutest_sync_count(int* out, int limit) {
    int c = __syncthreads_count(threadIdx.x & 1);
    int a = __syncthreads_and((int)threadIdx.x < limit);
    int o = __syncthreads_or((int)threadIdx.x < limit);
    out[threadIdx.x] = c * 100 + a * 10 + o;
}

// Thread 0 returns while the others wait at __syncthreads: undefined on a GPU, an error here.
extern "C" __global__ void emutest_diverge_exit(float* out) {
    if (threadIdx.x == 0) {
        return;
    }
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Odd threads at __syncthreads, even ones at __syncwarp: neither can release.
extern "C" __global__ void emutest_diverge_mixed(float* out) {
    if (threadIdx.x & 1) {
        __syncthreads();
    } else {
        __syncwarp();
    }
    out[threadIdx.x] = 1.0f;
}

// A lane shuffling under a mask that leaves it out.
extern "C" __global__ void emutest_bad_mask(float* out) {
    out[threadIdx.x] = __shfl_xor_sync(0x1u, 1.0f, 1);
}

// Uses `bytes` of stack and writes their sum (to keep them).
extern "C" __global__ void emutest_stack(int bytes, int* out) {
    volatile unsigned char* p = (volatile unsigned char*)__builtin_alloca((size_t)bytes);
    for (int i = 0; i < bytes; i++) {
        p[i] = (unsigned char)i;
    }
    int s = 0;
    for (int i = 0; i < bytes; i += 64) {
        s += p[i];
    }
    out[threadIdx.x] = s;
}

extern "C" __global__ void emutest_f16_to_f32(const uint16_t* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = mx_f16_to_f32(in[i]);
    }
}

extern "C" __global__ void emutest_f32_to_f16(const float* in, uint16_t* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = mx_f32_to_f16(in[i]);
    }
}

// `iters` rounds of a block sum (warp shuffles and __syncthreads): a switch-rate benchmark.
extern "C" __global__ void emutest_spin(float* out, int iters) {
    __shared__ float scratch[32];
    float v = (float)threadIdx.x;
    for (int i = 0; i < iters; i++) {
        v = mx_block_sum(v, scratch) * 0.0009765625f;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

// One parameter of each kind, for the argument checks.
extern "C" __global__ void emutest_args(float* out, int i, unsigned u, float f, long long l, unsigned long long ul) {
    if (threadIdx.x == 0) {
        out[0] = (float)i;
        out[1] = (float)u;
        out[2] = f;
        out[3] = (float)l;
        out[4] = (float)ul;
    }
}

// The integer and float helpers of emu.h, each once.
extern "C" __global__ void emutest_math(int* out, float* fout) {
    out[0] = (int)min(-1, 2u);  // in unsigned, as CUDA's min(int, unsigned int)
    out[1] = max(-3, 5);
    out[2] = __popc(0xf0f0u);
    out[3] = __dp4a(0x01020304, (int)0xff010101u, 10);
    out[4] = (int)__brev(1u);
    out[5] = __float2int_rn(2.5f);
    out[6] = __float2int_rn(3.5f);
    out[7] = __clz(1);
    out[8] = __ffs(8);
    out[9] = (int)__dp4a(0x01020304u, 0xff010101u, 10u);
    fout[0] = fmaxf(MX_INF - MX_INF, 1.0f);
    fout[1] = max(2.0f, MX_INF - MX_INF);
    fout[2] = rsqrtf(4.0f);
    fout[3] = __saturatef(1.5f);
    fout[4] = min(1.5f, 2);
    fout[5] = __int_as_float(0x3f800000);
    fout[6] = __uint_as_float(__float_as_uint(-2.0f));
    fout[7] = (float)__float_as_int(MX_NEG_INF);
}
