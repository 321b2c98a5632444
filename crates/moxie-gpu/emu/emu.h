// CPU emulator of the CUDA execution model: the subset of CUDA C the kernels in ../kernels use,
// for the host C++ compiler. emu.cpp includes this first, then the kernel files, so every
// kernel runs on a machine without a GPU.
//
// Model (see emu.cpp for the scheduler):
// - A launch runs its blocks one after another on the calling OS thread. Within a block every
//   thread is a fiber with its own 64 KiB stack; fibers run round-robin and switch only at
//   barriers (__syncthreads, __syncwarp, warp shuffles/votes) or when they return.
// - __shared__ is `static thread_local`: blocks of one launch run one after another on one OS
//   thread, so a function-local static is that block's shared memory, and launches on different
//   OS threads (parallel tests) are kept apart. Static shared memory is not reset between
//   blocks; dynamic shared memory (MX_DYN_SHARED) is filled with 0xFF before every block so a
//   kernel that reads it before writing shows up in tests. Every OS thread of a process that
//   links the emulator carries all static __shared__ arrays in its thread-local storage: keep
//   large tiles in dynamic shared memory.
// - Fiber stacks are 64 KiB, of which the lowest 4 KiB must stay unused (checked after every
//   launch; below them is a guard page): no large local arrays in kernels.
// - Warp operations exchange values through a per-warp slot array; a warp barrier releases when
//   every live lane in its mask waits at the same operation with the same mask. A shuffle whose
//   source lane has exited reads the value that lane passed to its last warp operation (0 if it
//   made none); a source lane outside the mask reads likewise (undefined on a GPU).
// - Fibers are cooperative, so atomics are plain read-modify-writes.
// - A barrier that can never release (threads at __syncthreads while another exited, or at
//   different barriers) fails the launch with a "divergent barrier" error instead of hanging.
// - Kernels run with C++ semantics on the host (IEEE floats in program order, no fused
//   multiply-adds unless written: build.rs passes -ffp-contract=off); math functions are the
//   host's libm (expf, tanhf, ...), which may differ from CUDA's in the last bits.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define MX_EMU 1

// ---- qualifiers ----------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// __restrict__ is a GCC/Clang keyword already.
#define __shared__ static thread_local
#define MX_DYN_SHARED(type, name) type* name = (type*)::mxemu::dyn_shared()

// ---- vector types ----------------------------------------------------------------------------
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) int2 {
    int x, y;
};
struct __attribute__((aligned(16))) int4 {
    int x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned int x, y;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};
struct __attribute__((aligned(4))) char4 {
    signed char x, y, z, w;
};
struct __attribute__((aligned(4))) uchar4 {
    unsigned char x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

static constexpr int warpSize = 32;

// ---- emulator state (implementation in emu.cpp) ----------------------------------------------
namespace mxemu {

enum : uint8_t { RUNNABLE = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3 };
enum : uint8_t { OP_SYNC = 0, OP_SHFL = 1, OP_BALLOT = 2 };

struct Context;  // saved machine context of a fiber (emu.cpp)

// One emulated GPU thread.
struct Fiber {
    void* sp;             // saved stack pointer (assembly switch)
    Context* ctx;         // saved context (ucontext fallback)
    uint3 tid;            // threadIdx
    uint32_t linear;      // x + y*bx + z*bx*by
    uint32_t lane, warp;  // linear % 32, linear / 32
    uint8_t state;        // RUNNABLE, WAIT_*, DONE
    uint8_t op;           // warp op waited at
    uint32_t mask;        // its mask
    uint32_t src;         // source lane of a shuffle
    uint64_t result;      // what the warp op returns
    char* stack_lo;       // lowest usable byte of the stack (above the guard page)
    char* stack_hi;       // one past the highest
};

struct Warp {
    uint32_t live;     // lanes that exist and have not returned
    uint32_t waiting;  // lanes waiting at a warp barrier
    uint64_t val[32];  // each lane's value at its last warp op
};

struct Launch;

// What a kernel reads about the block it runs in.
struct BlockInfo {
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
    unsigned char* dyn_shared;
};

static thread_local Fiber* t_fiber;    // running fiber (null on the launching stack)
static thread_local Launch* t_launch;  // launch in progress on this OS thread
static thread_local BlockInfo t_block;  // the block being run on this OS thread

inline const BlockInfo& block_info() { return t_block; }
inline const uint3& thread_idx() { return t_fiber->tid; }
inline void* dyn_shared() { return t_block.dyn_shared; }

void syncthreads();
int syncthreads_count(int pred);
uint32_t active_mask();
uint64_t warp_op(uint8_t op, uint32_t mask, uint64_t val, uint32_t src);
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline uint32_t lane() { return t_fiber->lane; }

template <typename T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "warp shuffles take values of at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}

template <typename T>
inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

inline uint32_t check_width(int width) {
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
        fail("shuffle width %d is not a power of 2 from 1 to 32", width);
    }
    return (uint32_t)width;
}

}  // namespace mxemu

#define threadIdx (::mxemu::thread_idx())
#define blockIdx (::mxemu::block_info().block_idx)
#define blockDim (::mxemu::block_info().block_dim)
#define gridDim (::mxemu::block_info().grid_dim)

// ---- barriers, shuffles, votes -------------------------------------------------------------
inline void __syncthreads() { ::mxemu::syncthreads(); }
inline int __syncthreads_count(int pred) { return ::mxemu::syncthreads_count(pred); }
inline int __syncthreads_and(int pred) {
    return ::mxemu::syncthreads_count(pred) == (int)(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int pred) { return ::mxemu::syncthreads_count(pred) != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::mxemu::warp_op(::mxemu::OP_SYNC, mask, 0, 0); }
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() { ::mxemu::fail("__trap() called"); }

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
    uint32_t w = ::mxemu::check_width(width);
    uint32_t lane = ::mxemu::lane();
    uint32_t src = (lane & ~(w - 1)) + ((uint32_t)srcLane & (w - 1));
    return ::mxemu::from_bits<T>(::mxemu::warp_op(::mxemu::OP_SHFL, mask, ::mxemu::to_bits(var), src));
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
    uint32_t w = ::mxemu::check_width(width);
    uint32_t lane = ::mxemu::lane();
    uint32_t src = lane ^ ((uint32_t)laneMask & 31u);
    // Lanes may read earlier groups of `width` lanes, not later ones (they get their own value).
    if ((src & ~(w - 1)) > (lane & ~(w - 1))) {
        src = lane;
    }
    return ::mxemu::from_bits<T>(::mxemu::warp_op(::mxemu::OP_SHFL, mask, ::mxemu::to_bits(var), src));
}

template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
    uint32_t w = ::mxemu::check_width(width);
    uint32_t lane = ::mxemu::lane();
    delta &= 31u;  // the hardware uses the offset's low 5 bits (PTX shfl.sync)
    uint32_t src = (lane & (w - 1)) + delta < w ? lane + delta : lane;
    return ::mxemu::from_bits<T>(::mxemu::warp_op(::mxemu::OP_SHFL, mask, ::mxemu::to_bits(var), src));
}

template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
    uint32_t w = ::mxemu::check_width(width);
    uint32_t lane = ::mxemu::lane();
    delta &= 31u;
    uint32_t src = (lane & (w - 1)) >= delta ? lane - delta : lane;
    return ::mxemu::from_bits<T>(::mxemu::warp_op(::mxemu::OP_SHFL, mask, ::mxemu::to_bits(var), src));
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (uint32_t)::mxemu::warp_op(::mxemu::OP_BALLOT, mask, pred != 0, 0);
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
    // The ballot op returns the participating lanes in the high half.
    uint64_t r = ::mxemu::warp_op(::mxemu::OP_BALLOT, mask, pred != 0, 0);
    return (uint32_t)r == (uint32_t)(r >> 32);
}
// The lanes of the warp that have not returned (the emulator keeps no other divergence state).
inline unsigned __activemask() { return ::mxemu::active_mask(); }

// ---- atomics (fibers are cooperative: a plain read-modify-write is atomic) -------------------
// The value converts to the pointee's type, as with CUDA's overloads.
namespace mxemu {
template <typename T>
struct same {
    typedef T type;
};
}  // namespace mxemu
#define MXEMU_VAL(T) typename ::mxemu::same<T>::type
template <typename T>
inline T atomicAdd(T* p, MXEMU_VAL(T) v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
inline T atomicSub(T* p, MXEMU_VAL(T) v) {
    T old = *p;
    *p = old - v;
    return old;
}
template <typename T>
inline T atomicMax(T* p, MXEMU_VAL(T) v) {
    T old = *p;
    *p = old > v ? old : v;
    return old;
}
template <typename T>
inline T atomicMin(T* p, MXEMU_VAL(T) v) {
    T old = *p;
    *p = old < v ? old : v;
    return old;
}
template <typename T>
inline T atomicExch(T* p, MXEMU_VAL(T) v) {
    T old = *p;
    *p = v;
    return old;
}
template <typename T>
inline T atomicCAS(T* p, MXEMU_VAL(T) compare, MXEMU_VAL(T) v) {
    T old = *p;
    if (old == compare) {
        *p = v;
    }
    return old;
}
inline unsigned atomicInc(unsigned* p, unsigned limit) {
    unsigned old = *p;
    *p = old >= limit ? 0 : old + 1;
    return old;
}

// ---- math -------------------------------------------------------------------------------------
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }

inline float __int_as_float(int x) { return ::mxemu::from_bits<float>((uint32_t)x); }
inline int __float_as_int(float x) { return (int)(uint32_t)::mxemu::to_bits(x); }
inline float __uint_as_float(unsigned x) { return ::mxemu::from_bits<float>(x); }
inline unsigned __float_as_uint(float x) { return (uint32_t)::mxemu::to_bits(x); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline float __int2float_rn(int x) { return (float)x; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
// Four-way byte dot products with a 32-bit accumulator.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) {
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    }
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) {
        c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    }
    return c;
}
// Per-byte signed saturating subtraction.
inline int __vsubss4(int a, int b) {
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        int d = (int)(int8_t)(a >> (8 * i)) - (int)(int8_t)(b >> (8 * i));
        d = d < -128 ? -128 : (d > 127 ? 127 : d);
        r |= ((uint32_t)d & 0xffu) << (8 * i);
    }
    return (int)r;
}

// CUDA's min/max overloads: integers in their common type, floats ignoring a NaN (fminf/fmaxf).
template <typename A, typename B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if constexpr (std::is_same<C, float>::value) {
        return fminf(a, b);
    } else if constexpr (std::is_floating_point<C>::value) {
        return fmin((C)a, (C)b);
    } else {
        return (C)a < (C)b ? (C)a : (C)b;
    }
}
template <typename A, typename B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if constexpr (std::is_same<C, float>::value) {
        return fmaxf(a, b);
    } else if constexpr (std::is_floating_point<C>::value) {
        return fmax((C)a, (C)b);
    } else {
        return (C)a > (C)b ? (C)a : (C)b;
    }
}

template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
