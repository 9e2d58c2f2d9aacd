/* The observer's shared state: the log's layout and the caches (State), an op's open record (Ctx), the
   per-thread caches in front of the shared maps, and the GIL for the rare call into the recorder's Python.
   Why its own part: every other part reads it, and its layout is what the ring and the GPU marks agree on.
   Part of observer.cpp's one translation unit (included there only, so its anonymous namespace is that
   file's): gpulab.trace.native hashes every observer_*.h into the build's cache key. */
#ifndef GPULAB_OBSERVER_STATE_H
#define GPULAB_OBSERVER_STATE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef NDEBUG   /* torch's release headers: a debug build of this file would see other class layouts */
#error "build with -DNDEBUG (gpulab.trace.native.ensure_observer does)"
#endif
#include <ATen/record_function.h>
#include <ATen/core/function_schema.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumark.h"

namespace {

constexpr char F_RAISED = 2;
constexpr int kTrackPlain = 0, kTrackGpu = 1, kTrackWaitCuda = 4;

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v * 0x9E3779B97F4A7C15ull;
    h = (h << 31) | (h >> 33);
    return h * 0xFF51AFD7ED558CCDull;
}

/* a hash of n bytes, eight at a time (the per-op keys are 30-300 bytes) */
uint64_t hash_bytes(const char *p, size_t n, uint64_t h = 1469598103934665603ull) {
    size_t len = n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = mix(h, v);
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    return mix(h, v ^ ((uint64_t)len << 56));
}

/* how an argument is shown when its IValue alone does not say it (an int that is a dtype) */
enum ArgShow : int8_t { SHOW_PLAIN = 0, SHOW_DTYPE, SHOW_LAYOUT, SHOW_MEMFMT };

struct ArgInfo {
    ArgShow show = SHOW_PLAIN;
    bool has_default = false;
    c10::IValue def;
};

struct NameInfo {
    std::string key;          /* name \0 overload */
    uint32_t sid = 0;
    bool nomark = false;      /* a view or an allocation: no kernel, no GPU marker */
    bool view = false;        /* aliases an input without writing it: metadata only */
    bool skip = false;        /* the profiler's own bookkeeping ops: not recorded */
    bool elide = false;       /* inside an op, bookkeeping of that op: not recorded there (see name_info) */
    bool schema = false;      /* positional arguments known: the rest are dropped as the dispatch mode drops them */
    bool returns = false;     /* the schema returns something: no outputs at its end means that it raised */
    size_t positional = 0;
    std::vector<ArgInfo> args;
};

struct ArgsInfo {
    std::string key;
    uint32_t sid = 0;
    int32_t dev = -2;
};

struct SiteInfo {
    const void *code = nullptr;
    int lasti = 0;
    uint32_t sid = 0;
};

/* one open record of this thread: nested ops are one level deeper, and make it a composite */
struct Open {
    int64_t seq;
    char *slot;
};

struct Ctx : public at::ObserverContext {
    int64_t seq = 0;
    char *slot = nullptr;
    int32_t dev = -1;
    int exc = 0;
    bool nomark = false;
    bool probe = false;   /* Observer.probe's op: nothing written, only whether its raise was seen */
    bool by_outputs = false; /* raised if it ends with no outputs (g_by_outputs, an op that returns something) */
    Ctx *next_free = nullptr;
    /* from the thread's free list: RecordFunction frees each op's context, so it would be an allocation per op */
    static void *operator new(size_t n);
    static void operator delete(void *p);
};

thread_local Ctx *t_free_ctx = nullptr;
thread_local int t_free_count = 0;

void *Ctx::operator new(size_t n) {
    Ctx *c = t_free_ctx;
    if (c != nullptr && n == sizeof(Ctx)) {
        t_free_ctx = c->next_free;
        t_free_count--;
        return c;
    }
    return ::operator new(n);
}

void Ctx::operator delete(void *p) {
    if (t_free_count < 256) {   /* a context may end on another thread (async ops): that thread keeps it */
        Ctx *c = static_cast<Ctx *>(p);
        c->next_free = t_free_ctx;
        t_free_ctx = c;
        t_free_count++;
        return;
    }
    ::operator delete(p);
}

/* c10::Stream's layout: Device {DeviceType, DeviceIndex} then StreamId (returned in registers) */
struct RawStream {
    int8_t type;
    int8_t index;
    int64_t id;
};
typedef RawStream (*get_stream_t)(int8_t);
typedef void *(*stream_handle_t)(const RawStream *);
typedef int8_t (*current_device_t)();
typedef int (*is_capturing_t)(void *stream, int *status);

struct State {
    char *base = nullptr;
    Py_ssize_t len = 0, slots_off = 0, cap = 1, slot_size = 64, off_started = 0, off_completed = 0,
               off_device = -1;
    std::atomic<int64_t> seq{0};
    std::atomic<bool> active{false};
    std::atomic<int> inflight{0};
    std::atomic<uint64_t> gen{1};
    std::atomic<int> track{kTrackPlain};
    std::atomic<bool> device_set{false};
    int ablate = 0;   /* diagnostics (GPULAB_TRACE_ABLATE): 1 no call sites, 2 no argument summaries, 4 no GPU markers,
                         8 no capture check, 16 markers' stream found but none enqueued, 32 return at once
                         (PyTorch's own floor), 64 no inputs asked of RecordFunction */
    std::atomic<int64_t> markers{0}, python_marks{0};   /* markers enqueued; of them through Python */
    pid_t owner = 0;
    bool frames = false;
    Gpu *gpu = nullptr;
    /* native stream lookup (libc10_cuda), or null: then the GIL and torch's Python functions */
    get_stream_t get_stream = nullptr;
    stream_handle_t stream_handle = nullptr;
    current_device_t current_device = nullptr;
    is_capturing_t is_capturing = nullptr;
    PyObject *intern = nullptr, *on_thread = nullptr, *on_code = nullptr, *on_site = nullptr,
             *on_cuda = nullptr, *nogpu = nullptr;
    at::CallbackHandle handle = 0;
    std::mutex mu;   /* the caches below */
    std::unordered_map<uint64_t, NameInfo *> names;
    std::unordered_map<uint64_t, ArgsInfo *> args;
    std::vector<ArgsInfo *> args_retired;   /* the entries of the generation before: freed at the next retirement */
    std::unordered_map<const void *, int8_t> codes;   /* 1 user code, 0 internal (kept alive by Python) */
    std::unordered_map<uint64_t, SiteInfo> sites;
    uint64_t misses = 0;
};

std::atomic<State *> g_state{nullptr};
thread_local bool t_probe = false;   /* set around Observer.probe's call */
std::atomic<bool> g_by_outputs{false};   /* Observer.mark_by_outputs: the callback asks for each op's outputs */
std::atomic<int> g_probe{0};         /* the probe's op: 0 not seen, 1 seen to raise, 2 ended without a raise seen */
/* the one RecordFunction callback of this process (a forked child inherits it registered: it is reused there,
   so that the child's own observer never records each op twice) */
std::atomic<at::CallbackHandle> g_handle{0};
pid_t g_handle_pid = 0;
/* generations are unique across observers: a thread's cached ids (thread_sid) never outlive their log */
std::atomic<uint64_t> g_gen{1};

/* per thread, in front of the shared maps (a hit takes no lock): direct-mapped, checked by key and generation */
constexpr size_t kLocal = 512;
struct LocalName { const char *name = nullptr, *over = nullptr; int scope = -1; uint64_t gen = 0; NameInfo *ni = nullptr; };
struct LocalArgs { uint64_t h = 0, gen = 0; ArgsInfo *ai = nullptr; };
struct LocalCode { const void *code = nullptr; int8_t kind = -1; };
struct LocalSite { const void *code = nullptr; int lasti = 0; uint64_t gen = 0; uint32_t sid = 0; };
struct Local {
    LocalName names[kLocal];
    LocalArgs args[kLocal];
    LocalCode codes[kLocal];
    LocalSite sites[kLocal];
};
thread_local std::unique_ptr<Local> t_local;   /* a few tens of KB per thread, freed when the thread ends */

Local &local() {
    if (!t_local)
        t_local.reset(new Local());
    return *t_local;
}

thread_local std::vector<Open> t_open;
thread_local uint32_t t_thread_sid = 0;
thread_local uint64_t t_thread_gen = 0;
/* the key of an op's arguments, built per record: a plain buffer (std::string's appends cost more than the copy) */
struct KeyBuf {
    char *p = nullptr;
    size_t n = 0, cap = 0;
    ~KeyBuf() { free(p); }
    void grow(size_t need) {
        size_t c = std::max(cap * 2, need + 256);
        char *q = (char *)realloc(p, c);
        if (q == nullptr) throw std::bad_alloc();
        p = q;
        cap = c;
    }
    inline void put(const void *src, size_t k) {
        if (n + k > cap) grow(n + k);
        memcpy(p + n, src, k);
        n += k;
    }
    inline void push(char c) {
        if (n + 1 > cap) grow(n + 1);
        p[n++] = c;
    }
    bool same(const std::string &other) const { return other.size() == n && memcmp(other.data(), p, n) == 0; }
};
thread_local KeyBuf t_key;
thread_local bool t_inside = false;


struct Gil {
    PyGILState_STATE st;
    bool ok;
    Gil() : ok(Py_IsInitialized() &&
#if PY_VERSION_HEX >= 0x030D0000
               !Py_IsFinalizing()
#else
               !_Py_IsFinalizing()
#endif
      ) {
        if (ok)
            st = PyGILState_Ensure();
    }
    ~Gil() {
        if (ok)
            PyGILState_Release(st);
    }
};

/* the recorder's intern(text) -> string id; GIL held */
uint32_t intern_text(State *s, const std::string &text) {
    PyObject *b = PyBytes_FromStringAndSize(text.data(), (Py_ssize_t)text.size());
    PyObject *r = b ? PyObject_CallOneArg(s->intern, b) : nullptr;
    Py_XDECREF(b);
    long v = r ? PyLong_AsLong(r) : 0;
    Py_XDECREF(r);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        v = 0;
    }
    return (uint32_t)v;
}

}  // namespace

#endif  /* GPULAB_OBSERVER_STATE_H */
