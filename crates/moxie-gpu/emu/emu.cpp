// The CPU emulator of CUDA's execution model (see emu.h for the model) and its C interface:
// the scheduler, then the kernel files in the order kernel_source() in src/lib.rs concatenates
// them, then the emulator's own test kernels, then the launch table and mxemu_launch.
//
// Build flags (build.rs): -O2 -std=c++17 -fno-strict-aliasing -ffp-contract=off, so kernels
// compute with plain IEEE float operations in program order, reproducibly.

// System headers first: emu.h defines CUDA's names as macros and global functions.
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__ELF__) && !defined(MXEMU_UCONTEXT)
#define MXEMU_ASM_SWITCH 1
#else
#define MXEMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

#include "emu.h"

#if MXEMU_ASM_SWITCH
// void mxemu_switch_ctx(void** save_sp, void* to_sp): push the callee-saved registers (System V
// x86-64: rbp, rbx, r12-r15) and the SSE/x87 control words (MXCSR, x87 control word: also
// callee-saved) on the current stack, store the stack pointer in *save_sp, load to_sp, pop the
// same from there and return into that context.
extern "C" void mxemu_switch_ctx(void** save_sp, void* to_sp);
asm(R"(
    .pushsection .text
    .p2align 4
    .globl mxemu_switch_ctx
    .hidden mxemu_switch_ctx
    .type mxemu_switch_ctx, @function
mxemu_switch_ctx:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mxemu_switch_ctx, .-mxemu_switch_ctx
    .popsection
)");
#endif

namespace mxemu {

constexpr uint32_t kMaxThreads = 1024;     // threads per block
constexpr size_t kStackBytes = 64 * 1024;  // per fiber
// The lowest bytes of each stack hold a pattern checked after every launch: a fiber that
// reaches them has (nearly) overflowed. Below them is a guard page.
constexpr size_t kCanaryBytes = 4096;
constexpr size_t kCanaryStride = 256;  // check one word every this many bytes
constexpr uint64_t kCanary = 0x5ca1ab1ec0ffee42ull;
constexpr uint32_t kMaxSharedBytes = 227 * 1024;  // an H100's per-block maximum

struct Context {
#if !MXEMU_ASM_SWITCH
    ucontext_t uc;
#endif
};

struct Launch {
    const char* name;
    void (*thunk)(const void*);  // runs the kernel for the current fiber
    const void* call;            // its argument
    uint32_t nthreads;
    uint32_t nwarps;
    uint32_t live;           // threads of the block that have not returned
    uint32_t block_waiting;  // threads waiting at __syncthreads
    int sync_acc;            // __syncthreads_count being gathered
    int sync_result;         // and the last one released
    Fiber* fibers;
    Warp* warps;
    uint16_t* queue;  // runnable fibers, a ring of kMaxThreads
    uint32_t qhead, qlen;
    void* main_sp;  // the launching stack
    Context* main_ctx;
    bool failed;
    char error[1024];
};

static thread_local uint64_t t_switches;

// ---- fiber stacks ---------------------------------------------------------------------------

// Stacks of one OS thread, made as needed and kept for its later launches.
struct StackPool {
    std::vector<char*> maps;  // each: a guard page, then kStackBytes of stack
    size_t page = 0;

    ~StackPool() {
        for (char* m : maps) {
            munmap(m, page + kStackBytes);
        }
    }

    bool grow(size_t n) {
        if (page == 0) {
            page = (size_t)sysconf(_SC_PAGESIZE);
        }
        while (maps.size() < n) {
            void* m = mmap(nullptr, page + kStackBytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (m == MAP_FAILED) {
                return false;
            }
            if (mprotect(m, page, PROT_NONE) != 0) {
                munmap(m, page + kStackBytes);
                return false;
            }
            char* lo = (char*)m + page;
            fill_canary(lo);
            maps.push_back((char*)m);
        }
        return true;
    }

    char* lo(size_t i) const { return maps[i] + page; }

    static void fill_canary(char* lo) {
        for (size_t o = 0; o < kCanaryBytes; o += 8) {
            memcpy(lo + o, &kCanary, 8);
        }
    }

    // Whether stack `i` kept its canary; refills it if not.
    bool canary_ok(size_t i) const {
        char* l = lo(i);
        bool ok = true;
        for (size_t o = 0; o < kCanaryBytes; o += kCanaryStride) {
            uint64_t w;
            memcpy(&w, l + o, 8);
            ok &= w == kCanary;
        }
        uint64_t top;
        memcpy(&top, l + kCanaryBytes - 8, 8);
        ok &= top == kCanary;
        if (!ok) {
            fill_canary(l);
        }
        return ok;
    }
};

// Everything a launch needs, kept per OS thread and reused.
struct Workspace {
    std::vector<Fiber> fibers;
    std::vector<Context> contexts;
    std::vector<Warp> warps;
    std::vector<uint16_t> queue;
    Context main_ctx;
    unsigned char* shared = nullptr;
    size_t shared_cap = 0;
    StackPool stacks;

    Workspace()
        : fibers(kMaxThreads), contexts(kMaxThreads), warps(kMaxThreads / 32), queue(kMaxThreads) {}
    ~Workspace() { free(shared); }

    unsigned char* shared_of(size_t bytes) {
        bytes = std::max<size_t>(bytes, 256);
        if (bytes > shared_cap) {
            free(shared);
            shared = (unsigned char*)aligned_alloc(256, (bytes + 255) & ~(size_t)255);
            shared_cap = shared ? bytes : 0;
        }
        return shared;
    }
};

static thread_local Workspace* t_ws;

// ---- switching --------------------------------------------------------------------------------

// Switch from `from` (null: the launching stack) to `to` (null: the launching stack).
static inline void switch_to(Launch* L, Fiber* from, Fiber* to) {
    t_fiber = to;
    t_switches++;
#if MXEMU_ASM_SWITCH
    mxemu_switch_ctx(from ? &from->sp : &L->main_sp, to ? to->sp : L->main_sp);
#else
    swapcontext(from ? &from->ctx->uc : &L->main_ctx->uc, to ? &to->ctx->uc : &L->main_ctx->uc);
#endif
    // Another fiber ran in between: nothing cached from memory is valid.
    asm volatile("" ::: "memory");
}

static inline void push(Launch* L, uint32_t i) {
    L->queue[(L->qhead + L->qlen) & (kMaxThreads - 1)] = (uint16_t)i;
    L->qlen++;
}

static inline Fiber* pop(Launch* L) {
    if (L->qlen == 0) {
        return nullptr;
    }
    uint32_t i = L->queue[L->qhead];
    L->qhead = (L->qhead + 1) & (kMaxThreads - 1);
    L->qlen--;
    return &L->fibers[i];
}

// The running fiber waits: run the next runnable one, or go back to the launching stack when
// there is none (every live thread waits: the launch checks for a divergent barrier).
static inline void wait(Launch* L, Fiber* f) { switch_to(L, f, pop(L)); }

void fail(const char* fmt, ...) {
    Launch* L = t_launch;
    Fiber* f = t_fiber;
    if (L == nullptr || f == nullptr) {
        fprintf(stderr, "mxemu: a device function failed outside a kernel\n");
        abort();
    }
    int n = snprintf(L->error, sizeof L->error, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u): ",
                     L->name, t_block.block_idx.x, t_block.block_idx.y, t_block.block_idx.z,
                     f->tid.x, f->tid.y, f->tid.z);
    if (n > 0 && (size_t)n < sizeof L->error) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(L->error + n, sizeof L->error - n, fmt, ap);
        va_end(ap);
    }
    L->failed = true;
    switch_to(L, f, nullptr);  // never resumed
    abort();
}

// ---- block barrier --------------------------------------------------------------------------

static int block_wait(int pred) {
    Launch* L = t_launch;
    Fiber* f = t_fiber;
    L->sync_acc += pred != 0;
    // Every thread of the block must arrive; one that returned never will (divergent).
    if (++L->block_waiting == L->nthreads) {
        L->block_waiting = 0;
        L->sync_result = L->sync_acc;
        L->sync_acc = 0;
        for (uint32_t i = 0; i < L->nthreads; i++) {
            if (&L->fibers[i] != f) {
                L->fibers[i].state = RUNNABLE;
                push(L, i);
            }
        }
        return L->sync_result;
    }
    f->state = WAIT_BLOCK;
    wait(L, f);
    // Valid until this fiber arrives at the next barrier.
    return L->sync_result;
}

void syncthreads() { block_wait(0); }
int syncthreads_count(int pred) { return block_wait(pred); }

// ---- warp barriers ----------------------------------------------------------------------------

// Release the lanes of warp `w` waiting at `op` with `mask` if every live lane of the mask
// waits there; `self` (the caller, if it is one of them) is not queued, it goes on running.
static bool try_release(Launch* L, uint32_t w, uint32_t mask, uint8_t op, Fiber* self) {
    Warp* W = &L->warps[w];
    uint32_t group = mask & W->live;
    if ((W->waiting & group) != group) {
        return false;
    }
    Fiber* lanes = &L->fibers[w * 32];
    uint32_t ballot = 0;
    for (uint32_t m = group; m; m &= m - 1) {
        uint32_t l = (uint32_t)__builtin_ctz(m);
        if (lanes[l].op != op || lanes[l].mask != mask) {
            return false;  // a lane waits at another warp barrier; it may come later
        }
        ballot |= (W->val[l] != 0 ? 1u : 0u) << l;
    }
    for (uint32_t m = group; m; m &= m - 1) {
        Fiber* g = &lanes[__builtin_ctz(m)];
        switch (op) {
            case OP_SHFL:
                g->result = W->val[g->src];
                break;
            case OP_BALLOT:
                g->result = ballot | ((uint64_t)group << 32);
                break;
            default:
                g->result = 0;
        }
        g->state = RUNNABLE;
        if (g != self) {
            push(L, (uint32_t)(g - L->fibers));
        }
    }
    W->waiting &= ~group;
    return true;
}

uint64_t warp_op(uint8_t op, uint32_t mask, uint64_t val, uint32_t src) {
    Launch* L = t_launch;
    Fiber* f = t_fiber;
    uint32_t bit = 1u << f->lane;
    if ((mask & bit) == 0) {
        fail("lane %u calls a warp operation with mask 0x%08x, which leaves it out", f->lane, mask);
    }
    Warp* W = &L->warps[f->warp];
    W->val[f->lane] = val;
    f->op = op;
    f->mask = mask;
    f->src = src;
    f->state = WAIT_WARP;
    W->waiting |= bit;
    if (!try_release(L, f->warp, mask, op, f)) {
        wait(L, f);
    }
    return f->result;
}

uint32_t active_mask() {
    Launch* L = t_launch;
    return L->warps[t_fiber->warp].live;
}

// ---- fibers -------------------------------------------------------------------------------------

[[noreturn]] static void fiber_exit() {
    Launch* L = t_launch;
    Fiber* f = t_fiber;
    f->state = DONE;
    L->live--;
    Warp* W = &L->warps[f->warp];
    W->live &= ~(1u << f->lane);
    // Lanes waiting at a warp barrier may have been waiting only for this one.
    for (uint32_t pending = W->waiting; pending; pending &= W->waiting) {
        Fiber* g = &L->fibers[f->warp * 32 + (uint32_t)__builtin_ctz(pending)];
        pending &= ~(1u << g->lane);
        try_release(L, f->warp, g->mask, g->op, nullptr);
    }
    switch_to(L, f, pop(L));  // never resumed
    abort();
}

static void fiber_main() {
    Launch* L = t_launch;
    L->thunk(L->call);
    fiber_exit();
}

// Make `f` start at fiber_main when switched to.
static void init_context(Launch* L, Fiber* f, uint64_t control_words) {
#if MXEMU_ASM_SWITCH
    (void)L;
    uint64_t* top = (uint64_t*)((uintptr_t)f->stack_hi & ~(uintptr_t)15);
    top[-1] = 0;                                      // fiber_main's return address (never used)
    top[-2] = (uint64_t)(uintptr_t)&fiber_main;       // where mxemu_switch_ctx returns to
    for (int i = 3; i <= 8; i++) {                    // rbp, rbx, r12-r15
        top[-i] = 0;
    }
    top[-9] = control_words;                          // mxcsr, x87 control word
    f->sp = &top[-9];
#else
    (void)L;
    (void)control_words;
    getcontext(&f->ctx->uc);
    f->ctx->uc.uc_stack.ss_sp = f->stack_lo;
    f->ctx->uc.uc_stack.ss_size = (size_t)(f->stack_hi - f->stack_lo);
    f->ctx->uc.uc_link = nullptr;
    makecontext(&f->ctx->uc, (void (*)())fiber_main, 0);
#endif
}

static uint64_t control_words() {
#if MXEMU_ASM_SWITCH
    uint32_t mxcsr;
    uint16_t fcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fcw));
    return (uint64_t)mxcsr | ((uint64_t)fcw << 32);
#else
    return 0;
#endif
}

// ---- a launch -----------------------------------------------------------------------------------

static std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

static const char* describe(const Fiber& f) {
    switch (f.state) {
        case WAIT_BLOCK:
            return "wait at __syncthreads";
        case WAIT_WARP:
            return f.op == OP_SYNC ? "wait at __syncwarp" : f.op == OP_SHFL ? "wait at a warp shuffle" : "wait at a warp vote";
        case DONE:
            return "returned";
        default:
            return "runnable";
    }
}

// The error for a block whose live threads all wait and none can go on.
static std::string divergence(const Launch& L) {
    std::string s = format("divergent barrier in kernel %s, block (%u,%u,%u): ", L.name, t_block.block_idx.x,
                           t_block.block_idx.y, t_block.block_idx.z);
    s += L.nthreads > t_block.block_dim.x ? "threads (by linear index) " : "threads ";
    uint32_t i = 0;
    bool first = true;
    while (i < L.nthreads) {
        const Fiber& f = L.fibers[i];
        uint32_t j = i + 1;
        while (j < L.nthreads && L.fibers[j].state == f.state &&
               (f.state != WAIT_WARP || (L.fibers[j].op == f.op && L.fibers[j].mask == f.mask))) {
            j++;
        }
        if (!first) {
            s += "; ";
        }
        first = false;
        s += j - i == 1 ? format("%u ", i) : format("%u-%u ", i, j - 1);
        s += describe(f);
        if (f.state == WAIT_WARP) {
            s += format(" (mask 0x%08x)", f.mask);
        }
        if (s.size() > 900) {
            s += "; ...";
            break;
        }
        i = j;
    }
    bool exited = false;
    for (uint32_t k = 0; k < L.nthreads; k++) {
        exited |= L.fibers[k].state == DONE;
    }
    if (L.block_waiting > 0 && exited) {
        s += " (__syncthreads needs every thread of the block; one that returned never arrives)";
    }
    return s;
}

struct Request {
    const uint32_t* grid;
    const uint32_t* block;
    uint32_t shared_bytes;
    void* const* args;
    const size_t* arg_sizes;
    const uint8_t* arg_kinds;
    uint32_t n_args;
};

static bool check_config(const char* name, const Request& r, std::string& err) {
    const uint32_t* g = r.grid;
    const uint32_t* b = r.block;
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2]) {
        err = format("kernel %s: empty launch: grid (%u,%u,%u), block (%u,%u,%u)", name, g[0], g[1], g[2], b[0], b[1],
                     b[2]);
        return false;
    }
    uint64_t n = (uint64_t)b[0] * b[1] * b[2];
    if (n > kMaxThreads || b[0] > 1024 || b[1] > 1024 || b[2] > 64) {
        err = format("kernel %s: block (%u,%u,%u) of %llu threads: at most 1024 threads (x, y <= 1024, z <= 64)", name,
                     b[0], b[1], b[2], (unsigned long long)n);
        return false;
    }
    if (g[0] > 0x7fffffffu || g[1] > 65535 || g[2] > 65535) {
        err = format("kernel %s: grid (%u,%u,%u) too large (x < 2^31, y, z <= 65535)", name, g[0], g[1], g[2]);
        return false;
    }
    if (r.shared_bytes > kMaxSharedBytes) {
        err = format("kernel %s: %u bytes of dynamic shared memory, at most %u", name, r.shared_bytes,
                     kMaxSharedBytes);
        return false;
    }
    return true;
}

static int run(const char* name, const Request& r, void (*thunk)(const void*), const void* call, std::string& err) {
    if (!check_config(name, r, err)) {
        return 1;
    }
    if (t_launch != nullptr) {
        err = format("kernel %s launched from inside kernel %s", name, t_launch->name);
        return 1;
    }
    if (t_ws == nullptr) {
        // Freed when the OS thread exits.
        static thread_local Workspace ws;
        t_ws = &ws;
    }
    Workspace& ws = *t_ws;
    const uint32_t bx = r.block[0], by = r.block[1], bz = r.block[2];
    const uint32_t n = bx * by * bz;
    if (!ws.stacks.grow(n)) {
        err = format("kernel %s: cannot map %u fiber stacks", name, n);
        return 1;
    }
    unsigned char* shared = ws.shared_of(r.shared_bytes);
    if (shared == nullptr) {
        err = format("kernel %s: cannot allocate %u bytes of shared memory", name, r.shared_bytes);
        return 1;
    }

    Launch L;
    L.name = name;
    L.thunk = thunk;
    L.call = call;
    L.nthreads = n;
    L.nwarps = (n + 31) / 32;
    L.fibers = ws.fibers.data();
    L.warps = ws.warps.data();
    L.queue = ws.queue.data();
    L.main_sp = nullptr;
    L.main_ctx = &ws.main_ctx;
    L.failed = false;
    L.error[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        Fiber& f = L.fibers[i];
        f.tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
        f.linear = i;
        f.lane = i % 32;
        f.warp = i / 32;
        f.ctx = &ws.contexts[i];
        f.stack_lo = ws.stacks.lo(i);
        f.stack_hi = f.stack_lo + kStackBytes;
    }
    const uint64_t cw = control_words();

    t_launch = &L;
    t_block.block_dim = dim3(bx, by, bz);
    t_block.grid_dim = dim3(r.grid[0], r.grid[1], r.grid[2]);
    t_block.dyn_shared = shared;
    std::string divergent;
    for (uint32_t gz = 0; gz < r.grid[2] && !L.failed; gz++) {
        for (uint32_t gy = 0; gy < r.grid[1] && !L.failed; gy++) {
            for (uint32_t gx = 0; gx < r.grid[0] && !L.failed; gx++) {
                t_block.block_idx = uint3{gx, gy, gz};
                memset(shared, 0xff, r.shared_bytes);
                L.live = n;
                L.block_waiting = 0;
                L.sync_acc = 0;
                L.sync_result = 0;
                L.qhead = 0;
                L.qlen = 0;
                for (uint32_t w = 0; w < L.nwarps; w++) {
                    uint32_t lanes = std::min<uint32_t>(32, n - w * 32);
                    L.warps[w].live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
                    L.warps[w].waiting = 0;
                    memset(L.warps[w].val, 0, sizeof L.warps[w].val);
                }
                for (uint32_t i = 0; i < n; i++) {
                    Fiber& f = L.fibers[i];
                    f.state = RUNNABLE;
                    f.result = 0;
                    init_context(&L, &f, cw);
                    if (i > 0) {
                        push(&L, i);
                    }
                }
                switch_to(&L, nullptr, &L.fibers[0]);
                // Back here when the queue ran dry: every thread returned, or the rest wait.
                if (!L.failed && L.live > 0) {
                    divergent = divergence(L);
                    L.failed = true;
                }
            }
        }
    }
    t_launch = nullptr;
    t_fiber = nullptr;
    t_block.dyn_shared = nullptr;

    std::string overflow;
    for (uint32_t i = 0; i < n; i++) {
        if (!ws.stacks.canary_ok(i) && overflow.empty()) {
            overflow = format(
                "kernel %s: thread %u (by linear index) overflowed its fiber stack (%zu KiB, of which "
                "the lowest %zu KiB must stay unused)",
                name, i, kStackBytes / 1024, kCanaryBytes / 1024);
        }
    }
    if (!overflow.empty()) {
        err = overflow;
        return 1;
    }
    if (L.failed) {
        err = divergent.empty() ? std::string(L.error) : divergent;
        return 1;
    }
    return 0;
}

// ---- typed launches ---------------------------------------------------------------------------

// Argument kinds (mxemu_launch's arg_kinds): what the caller says it passes.
enum : uint8_t { KIND_ANY = 0, KIND_PTR = 1, KIND_INT = 2, KIND_UINT = 3, KIND_FLOAT = 4 };

template <typename T>
constexpr uint8_t kind_of() {
    return std::is_pointer<T>::value           ? KIND_PTR
           : std::is_floating_point<T>::value  ? KIND_FLOAT
           : std::is_integral<T>::value        ? (std::is_signed<T>::value ? KIND_INT : KIND_UINT)
                                               : KIND_ANY;
}

static const char* kind_name(uint8_t k) {
    switch (k) {
        case KIND_PTR:
            return "pointer";
        case KIND_INT:
            return "signed integer";
        case KIND_UINT:
            return "unsigned integer";
        case KIND_FLOAT:
            return "float";
        default:
            return "value";
    }
}

template <typename... P>
struct Call {
    void (*fn)(P...);
    std::tuple<P...> args;

    static void thunk(const void* self) {
        const Call* c = static_cast<const Call*>(self);
        std::apply(c->fn, c->args);
    }
};

template <typename T>
static T load(const void* p) {
    T v;
    memcpy(&v, p, sizeof(T));
    return v;
}

template <typename... P, size_t... I>
static std::tuple<P...> load_all(void* const* args, std::index_sequence<I...>) {
    return std::tuple<P...>(load<P>(args[I])...);
}

template <typename... P>
static int launch(const char* name, void (*fn)(P...), const Request& r, std::string& err) {
    static_assert((std::is_trivially_copyable<P>::value && ...), "kernel parameters are copied as bytes");
    constexpr size_t n = sizeof...(P);
    constexpr size_t sizes[n + 1] = {sizeof(P)..., 0};
    constexpr uint8_t kinds[n + 1] = {kind_of<P>()..., KIND_ANY};
    if (r.n_args != n) {
        err = format("kernel %s takes %zu arguments, %u given", name, n, r.n_args);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (r.arg_sizes[i] != sizes[i]) {
            err = format("kernel %s argument %zu: %zu bytes given, the parameter has %zu", name, i, r.arg_sizes[i],
                         sizes[i]);
            return 1;
        }
        // Pointers and integers of one size may stand for each other (addresses); floats may not.
        uint8_t given = r.arg_kinds ? r.arg_kinds[i] : (uint8_t)KIND_ANY;
        if (given != KIND_ANY && kinds[i] != KIND_ANY && (given == KIND_FLOAT) != (kinds[i] == KIND_FLOAT)) {
            err = format("kernel %s argument %zu: a %s given, the parameter is a %s", name, i, kind_name(given),
                         kind_name(kinds[i]));
            return 1;
        }
    }
    Call<P...> call{fn, load_all<P...>(r.args, std::index_sequence_for<P...>{})};
    return run(name, r, &Call<P...>::thunk, &call, err);
}

}  // namespace mxemu

// ---- the kernels ------------------------------------------------------------------------------

#include "../kernels/common.cuh"
#include "../kernels/iq_grids.cuh"
#include "../kernels/iqk_values.cuh"
#include "../kernels/quant.cuh"
#include "../kernels/matmul.cu"
#include "../kernels/matmul_q8.cu"
#include "../kernels/ops.cu"
#include "test_kernels.cu"

// ---- launch table and C interface ---------------------------------------------------------------

namespace mxemu {

struct Entry {
    const char* name;
    int (*launch)(const Request&, std::string&);
};

#undef K
#define K(kernel) {#kernel, [](const Request& r, std::string& e) { return launch(#kernel, &::kernel, r, e); }},
static const Entry k_kernels[] = {
#include "../kernels/list.h"
#include "test_list.h"
};
#undef K

constexpr uint32_t kNumKernels = sizeof k_kernels / sizeof k_kernels[0];

static const Entry* find(const char* name) {
    // Sorted by name once (thread-safe static initialization).
    static const std::vector<const Entry*> sorted = [] {
        std::vector<const Entry*> v;
        for (const Entry& e : k_kernels) {
            v.push_back(&e);
        }
        std::sort(v.begin(), v.end(), [](const Entry* a, const Entry* b) { return strcmp(a->name, b->name) < 0; });
        return v;
    }();
    auto it = std::lower_bound(sorted.begin(), sorted.end(), name,
                               [](const Entry* e, const char* n) { return strcmp(e->name, n) < 0; });
    return it != sorted.end() && strcmp((*it)->name, name) == 0 ? *it : nullptr;
}

}  // namespace mxemu

extern "C" {

// Run kernel `name` over `grid` blocks of `block` threads with `shared_bytes` of dynamic shared
// memory. args[i] points at the i-th argument's bytes (as cuLaunchKernel's kernelParams),
// arg_sizes[i] is its size and arg_kinds[i] (optional, may be null) its kind: 0 unknown,
// 1 pointer, 2 signed integer, 3 unsigned integer, 4 float. Returns 0, or nonzero with a message
// in err (NUL-terminated, truncated to err_len). Runs on the calling thread; calls on different
// threads run in parallel.
int mxemu_launch(const char* name, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes,
                 void* const* args, const size_t* arg_sizes, const uint8_t* arg_kinds, uint32_t n_args, char* err,
                 size_t err_len) noexcept {
    std::string e;
    int rc = 1;
    try {
        const mxemu::Entry* k = mxemu::find(name);
        if (k == nullptr) {
            e = mxemu::format("no kernel named %s", name);
        } else {
            mxemu::Request r{grid, block, shared_bytes, args, arg_sizes, arg_kinds, n_args};
            rc = k->launch(r, e);
        }
    } catch (const std::bad_alloc&) {
        e = "out of host memory";
        rc = 1;
    }
    if (rc != 0 && err != nullptr && err_len > 0) {
        snprintf(err, err_len, "%s", e.c_str());
    }
    return rc;
}

// Fiber switches made so far by launches on the calling OS thread.
uint64_t mxemu_switches(void) noexcept { return mxemu::t_switches; }

// The kernels in the launch table.
uint32_t mxemu_kernel_count(void) noexcept { return mxemu::kNumKernels; }
const char* mxemu_kernel_name(uint32_t i) noexcept {
    return i < mxemu::kNumKernels ? mxemu::k_kernels[i].name : nullptr;
}

}  // extern "C"
