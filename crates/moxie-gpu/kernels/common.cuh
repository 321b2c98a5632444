// Prelude shared by every kernel file. The kernels compile twice: by NVRTC for the GPU
// (__CUDACC_RTC__ defined, no system headers), and by the host C++ compiler against
// emu/emu.h, the CPU emulator the tests run them on. So: only what both offer — no
// <cuda_fp16.h>, no INFINITY macro, no dynamic shared memory except through MX_DYN_SHARED.
#pragma once

#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define MX_DYN_SHARED(type, name) extern __shared__ type name[]
#endif

#define MX_WARP 32
#define MX_INF __int_as_float(0x7f800000)
#define MX_NEG_INF __int_as_float(0xff800000)

// IEEE half (bits) to float; exact for all values including subnormals, inf and nan.
__device__ __forceinline__ float mx_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t man = (uint32_t)h & 0x3ffu;
    if (exp == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0) {
        // Subnormal (or zero): man * 2^-24, exact in f32.
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// float to IEEE half bits, round to nearest even (what ggml's F16 stores do).
__device__ __forceinline__ uint16_t mx_f32_to_f16(float f) {
    uint32_t x = __float_as_uint(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        // inf or nan (keep nan quiet)
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    }
    if (ax >= 0x477ff000u) {
        // rounds to >= 65520: overflow to inf
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax < 0x38800000u) {
        // below the smallest normal half: subnormal or zero, rounded to nearest even
        if (ax < 0x33000000u) {
            return (uint16_t)sign;
        }
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        // value = m * 2^(e - 150); in units of the half subnormal step 2^-24: m >> (126 - e)
        uint32_t shift = 126u - e;
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) {
            r += 1u;
        }
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
        r += 1u;
    }
    return (uint16_t)(sign | r);
}

__device__ __forceinline__ float mx_bf16_to_f32(uint16_t h) {
    return __uint_as_float(((uint32_t)h) << 16);
}

// Sum over the 32 lanes of a warp; every lane gets the total.
__device__ __forceinline__ float mx_warp_sum(float v) {
    for (int m = MX_WARP / 2; m > 0; m >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, m, MX_WARP);
    }
    return v;
}

__device__ __forceinline__ float mx_warp_max(float v) {
    for (int m = MX_WARP / 2; m > 0; m >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m, MX_WARP));
    }
    return v;
}

// Sum over a whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// total. `scratch` is 32 floats of shared memory; the block must be converged.
__device__ __forceinline__ float mx_block_sum(float v, float* scratch) {
    int lane = threadIdx.x % MX_WARP;
    int warp = threadIdx.x / MX_WARP;
    int n_warps = blockDim.x / MX_WARP;
    v = mx_warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return mx_warp_sum(v);
}

__device__ __forceinline__ float mx_block_max(float v, float* scratch) {
    int lane = threadIdx.x % MX_WARP;
    int warp = threadIdx.x / MX_WARP;
    int n_warps = blockDim.x / MX_WARP;
    v = mx_warp_max(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : MX_NEG_INF;
    return mx_warp_max(v);
}
