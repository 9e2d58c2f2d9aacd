/* The recorder's observer: every op the dispatcher runs, written into the op log (gpulab.trace.ring) from a
   RecordFunction callback, the hook PyTorch's profiler and Execution Trace observer use.

   Why not a TorchDispatchMode: a Python dispatch mode costs ~5-10 us per op before it records anything, which
   slows a real GPU step by half (the host stops running ahead of the GPU), and while one is active dynamo does
   not compile: the program under gpulab would not be the user's. A global RecordFunction callback costs
   ~0.15 us, changes nothing the program runs, and sees compiled code too: the aten and custom ops Inductor's
   wrapper calls, and (with torch.autograd.profiler._is_profiler_enabled set, as the profiler sets it) each
   Triton kernel launch and compiled-graph call by name.

   The records are the dispatch mode's: seq, start and end time, name (`aten.mm.default`), call site (the
   innermost Python frame outside torch, read without the GIL: pyframes.c), argument summary (the text the
   Python path writes: positional schema arguments without trailing defaults), thread, depth and kind (an op
   that runs ops inside it becomes a composite record), raised; GPU completion markers as hotpath.c emits
   them (gpumark.h). The GIL is taken only on a cache miss (a new op, signature, site or thread: the texts are
   interned by the recorder's Python, which owns the string table) and to start GPU tracking or claim a new
   stream. Commit order as everywhere: the slot's seq is stored last, with release order. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef NDEBUG   /* torch's release headers: a debug build of this file would see other class layouts */
#error "build with -DNDEBUG (gpulab.trace.native.ensure_observer does)"
#endif
#include <ATen/record_function.h>
#include <ATen/core/function_schema.h>
#include <c10/core/ScalarType.h>

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumark.h"

extern "C" int gpulab_frames(void **codes, int *lastis, int max);
extern "C" int gpulab_frames_supported(void);

namespace {

constexpr int kMaxFrames = 64;
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
/* this thread's newest GPU marker: the record it was for, when (steady ns) and on which stream entry */
thread_local int64_t t_mark_seq = -1;
thread_local int64_t t_mark_ns = 0;
thread_local int16_t t_mark_stream = -1;
thread_local int64_t t_mark_value = -1;
/* a composite that ends within this of its last op's marker launched nothing after it: a kernel launch takes
   several microseconds of host time, so that marker also tells when the composite's GPU work completed */
constexpr int64_t kNoLaunchNs = 1500;

int64_t steady_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}   /* in the observer's own code: an op it causes is not the program's */

/* ------------------------------------------------------------------------------------------ texts */

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

const char *dtype_text(c10::ScalarType st) {
    switch (st) {
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::QInt8: return "qint8";
    case c10::ScalarType::QUInt8: return "quint8";
    case c10::ScalarType::QInt32: return "qint32";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case c10::ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case c10::ScalarType::UInt16: return "uint16";
    case c10::ScalarType::UInt32: return "uint32";
    case c10::ScalarType::UInt64: return "uint64";
    default: return nullptr;
    }
}

std::string lower_name(c10::ScalarType st) {
    const char *t = dtype_text(st);
    if (t)
        return t;
    std::string n = c10::toString(st);
    for (auto &c : n)
        c = (char)tolower((unsigned char)c);
    return n;
}

/* Python's repr of a float (the Python path writes repr(a)) */
std::string float_repr(double d) {
    char *p = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
    std::string r = p ? p : "nan";
    PyMem_Free(p);
    return r;
}

/* repr(a)[:32] with ';' and '|' replaced, as texts.other_text writes it */
std::string clip(std::string s) {
    if (s.size() > 32)
        s.resize(32);
    for (auto &c : s) {
        if (c == ';') c = ',';
        else if (c == '|') c = '/';
    }
    return s;
}

std::string tensor_text(const at::Tensor &t) {
    std::string s = "T|" + lower_name(t.scalar_type()) + "|";
    auto sizes = t.sym_sizes();
    for (size_t i = 0; i < sizes.size(); i++) {
        if (i) s += ",";
        auto v = sizes[i].maybe_as_int();
        s += v ? std::to_string(*v) : std::string("s");
    }
    s += "|";
    if (t.layout() == c10::kStrided) {
        auto strides = t.sym_strides();
        for (size_t i = 0; i < strides.size(); i++) {
            if (i) s += ",";
            auto v = strides[i].maybe_as_int();
            s += v ? std::to_string(*v) : std::string("s");
        }
    }
    s += "|" + t.device().str();
    return s;
}

std::string int_list_text(c10::ArrayRef<int64_t> v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(v[i]);
    }
    return s + "]";
}

std::string value_text(const c10::IValue &v, ArgShow show) {
    if (v.isNone()) return "None";
    if (v.isBool()) return v.toBool() ? "True" : "False";
    if (v.isInt()) {
        int64_t i = v.toInt();
        if (show == SHOW_DTYPE && i >= 0 && i < (int64_t)c10::ScalarType::NumOptions)
            return "torch." + lower_name((c10::ScalarType)i);
        if (show == SHOW_LAYOUT)
            return i == 0 ? "torch.strided" : i == 1 ? "torch.sparse_coo" : "torch.layout(" + std::to_string(i) + ")";
        if (show == SHOW_MEMFMT) {
            static const char *f[] = {"torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
                                      "torch.channels_last_3d"};
            return i >= 0 && i < 4 ? f[i] : std::to_string(i);
        }
        return std::to_string(i);
    }
    if (v.isSymInt()) {
        auto m = v.toSymInt().maybe_as_int();
        return m ? std::to_string(*m) : std::string("s");
    }
    if (v.isDouble()) return clip(float_repr(v.toDouble()));
    if (v.isString()) {
        std::string r = "'" + v.toStringRef() + "'";
        return clip(r);
    }
    if (v.isIntList()) return clip(int_list_text(v.toIntVector()));
    if (v.isDevice()) {
        auto d = v.toDevice();
        std::string r = "device(type='" + c10::DeviceTypeName(d.type(), true) + "'";
        if (d.has_index()) r += ", index=" + std::to_string(d.index());
        return clip(r + ")");
    }
    if (v.isScalar()) return clip(v.toScalar().isFloatingPoint() ? float_repr(v.toScalar().toDouble())
                                                                    : std::to_string(v.toScalar().toLong()));
    return clip("<" + std::string(v.tagKind()) + ">");
}

/* the dispatch mode's positional arguments: those before the keyword-only ones, trailing defaults dropped */
bool same_ints(c10::ArrayRef<c10::IValue> a, c10::ArrayRef<c10::IValue> b) {
    if (a.size() != b.size())
        return false;
    for (size_t i = 0; i < a.size(); i++)
        if (a[i].toInt() != b[i].toInt())
            return false;
    return true;
}

size_t shown_args(const NameInfo *ni, c10::ArrayRef<const c10::IValue> in) {
    if (!ni->schema)
        return in.size();
    size_t n = std::min(ni->positional, in.size());
    while (n > 0) {
        const ArgInfo &a = ni->args[n - 1];
        if (!a.has_default)
            break;
        const c10::IValue &v = in[n - 1];
        bool same = false;
        if (a.def.isNone()) same = v.isNone();
        else if (a.def.isInt() && v.isInt()) same = a.def.toInt() == v.toInt();
        else if (a.def.isBool() && v.isBool()) same = a.def.toBool() == v.toBool();
        else if (a.def.isDouble() && v.isDouble()) same = a.def.toDouble() == v.toDouble();
        else if (a.def.isIntList() && v.isIntList()) same = same_ints(a.def.toListRef(), v.toListRef());
        else if (a.def.isString() && v.isString()) same = a.def.toStringRef() == v.toStringRef();
        if (!same)
            break;
        n--;
    }
    return n;
}

int32_t device_of(const at::Tensor &t, int32_t dev) {
    if (dev >= 0)
        return dev;
    if (t.device().is_cuda())
        return t.device().has_index() ? t.device().index() : 0;
    return -1;
}

/* texts.args_slow's text: per argument a tensor summary or a clipped repr, joined by ';' (1023 bytes at most) */
/* a Python number torch wrapped into a 0-dim CPU tensor: the dispatch mode is handed the number back */
bool wrapped_number(const at::Tensor &t) {
    return t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number() && t.device().is_cpu() && t.dim() == 0;
}

/* its value, read from memory (item() would dispatch an op from inside the observer): 1 int, 2 float, 0 other */
int number_of(const at::Tensor &t, int64_t *i, double *d) {
    const void *p = t.const_data_ptr();
    switch (t.scalar_type()) {
    case c10::ScalarType::Bool: *i = *(const bool *)p; return 1;
    case c10::ScalarType::Long: *i = *(const int64_t *)p; return 1;
    case c10::ScalarType::Int: *i = *(const int32_t *)p; return 1;
    case c10::ScalarType::Double: *d = *(const double *)p; return 2;
    case c10::ScalarType::Float: *d = *(const float *)p; return 2;
    default: return 0;
    }
}

std::string number_text(const at::Tensor &t) {
    int64_t i = 0;
    double d = 0;
    int k = number_of(t, &i, &d);
    if (k == 1) return t.scalar_type() == c10::ScalarType::Bool ? (i ? "True" : "False") : std::to_string(i);
    if (k == 2) return clip(float_repr(d));
    return clip("<" + lower_name(t.scalar_type()) + " number>");
}

std::string args_text(const NameInfo *ni, c10::ArrayRef<const c10::IValue> in, size_t n, int32_t *dev) {
    std::vector<std::string> parts;
    *dev = -2;
    for (size_t i = 0; i < n; i++) {
        const c10::IValue &v = in[i];
        ArgShow show = ni->schema && i < ni->args.size() ? ni->args[i].show : SHOW_PLAIN;
        if (v.isTensor() && wrapped_number(v.toTensor())) {
            parts.push_back(number_text(v.toTensor()));
        } else if (v.isTensor()) {
            const at::Tensor &t = v.toTensor();
            if (t.defined()) {
                parts.push_back(tensor_text(t));
                *dev = device_of(t, *dev);
            } else {
                parts.push_back("None");
            }
        } else if (v.isTensorList()) {
            auto l = v.toTensorList();
            if (l.size() == 0) {
                parts.push_back("[]");
                continue;
            }
            parts.push_back("L" + std::to_string(l.size()));
            for (size_t j = 0; j < l.size(); j++) {
                at::Tensor x = l.get(j);
                if (!x.defined())
                    continue;
                if (j < 4)
                    parts.push_back(tensor_text(x));
                *dev = device_of(x, *dev);
                if (j >= 4 && *dev >= 0)
                    break;
            }
        } else if (v.isList()) {
            auto l = v.toListRef();
            bool tensors = !l.empty() && l[0].isTensor();
            if (!tensors) {
                parts.push_back(value_text(v, show));
                continue;
            }
            parts.push_back("L" + std::to_string(l.size()));
            for (size_t j = 0; j < l.size(); j++) {
                if (!l[j].isTensor() || !l[j].toTensor().defined())
                    continue;
                if (j < 4)
                    parts.push_back(tensor_text(l[j].toTensor()));
                *dev = device_of(l[j].toTensor(), *dev);
            }
        } else {
            parts.push_back(value_text(v, show));
        }
    }
    std::string s;
    for (size_t i = 0; i < parts.size(); i++) {
        if (i) s += ";";
        s += parts[i];
    }
    if (s.size() > 1023)
        s.resize(1023);
    return s;
}

/* the signature key: everything args_text reads (a hit needs no text) */
bool append_key(KeyBuf &k, const c10::IValue &v) {
    auto put = [&k](const void *p, size_t n) { k.put(p, n); };
    auto tensor = [&](const at::Tensor &t) {
        if (!t.defined()) {
            k.push('n');
            return true;
        }
        if (wrapped_number(t)) {   /* keyed by its value, as the text shows it */
            int64_t i = 0;
            double d = 0;
            int kind = number_of(t, &i, &d);
            if (kind == 0)
                return false;
            k.push('w');
            k.push((char)t.scalar_type());
            if (kind == 1) put(&i, 8);
            else put(&d, 8);
            return true;
        }
        const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
        if (t.layout() == c10::kStrided && !impl->has_symbolic_sizes_strides() && t.dim() <= 12) {
            /* the common case in one append: plain sizes and strides, no SymInt to ask */
            char buf[8 + 2 * 12 * 8];
            c10::IntArrayRef sz = t.sizes(), st = t.strides();
            size_t nd = sz.size();
            buf[0] = 'P';   /* apart from the general form below */
            buf[1] = (char)t.scalar_type();
            buf[2] = (char)t.device().type();
            buf[3] = (char)t.device().index();
            buf[4] = (char)nd;
            memcpy(buf + 5, sz.data(), 8 * nd);
            memcpy(buf + 5 + 8 * nd, st.data(), 8 * nd);
            k.put(buf, 5 + 16 * nd);
            return true;
        }
        k.push('T');
        int8_t meta[4] = {(int8_t)t.scalar_type(), (int8_t)t.device().type(), (int8_t)t.device().index(),
                          (int8_t)t.layout()};
        put(meta, 4);
        auto sizes = t.sym_sizes();
        int16_t d = (int16_t)sizes.size();
        put(&d, 2);
        for (const auto &x : sizes) {
            auto m = x.maybe_as_int();
            if (!m) return false;
            int64_t val = *m;
            put(&val, 8);
        }
        if (t.layout() == c10::kStrided) {
            for (const auto &x : t.sym_strides()) {
                auto m = x.maybe_as_int();
                if (!m) return false;
                int64_t val = *m;
                put(&val, 8);
            }
        }
        return true;
    };
    if (v.isTensor()) return tensor(v.toTensor());
    if (v.isNone()) { k.push('N'); return true; }
    if (v.isInt()) { k.push('i'); int64_t x = v.toInt(); put(&x, 8); return true; }
    if (v.isBool()) { k.push(v.toBool() ? 'B' : 'b'); return true; }
    if (v.isDouble()) { k.push('d'); double x = v.toDouble(); put(&x, 8); return true; }
    if (v.isSymInt()) {
        auto m = v.toSymInt().maybe_as_int();
        if (!m) return false;
        k.push('i');
        int64_t x = *m;
        put(&x, 8);
        return true;
    }
    if (v.isString()) {
        const std::string &s = v.toStringRef();
        k.push('s');
        uint32_t n = (uint32_t)std::min<size_t>(s.size(), 40);
        put(&n, 4);
        put(s.data(), n);
        return true;
    }
    if (v.isIntList()) {   /* read in place (toIntVector would copy the list into a new vector) */
        auto l = v.toListRef();
        k.push('l');
        uint32_t n = (uint32_t)l.size();
        put(&n, 4);
        for (const auto &x : l) {
            int64_t val = x.toInt();
            put(&val, 8);
        }
        return true;
    }
    if (v.isTensorList()) {
        auto l = v.toTensorList();
        k.push('L');
        uint32_t n = (uint32_t)l.size();
        put(&n, 4);
        for (size_t j = 0; j < l.size(); j++)
            if (!tensor(l.get(j))) return false;
        return true;
    }
    if (v.isDevice()) {
        auto d = v.toDevice();
        int8_t m[3] = {'D', (int8_t)d.type(), (int8_t)d.index()};
        put(m, 3);
        return true;
    }
    if (v.isList()) {
        auto l = v.toListRef();
        k.push('[');
        uint32_t n = (uint32_t)l.size();
        put(&n, 4);
        for (const auto &x : l)
            if (!append_key(k, x)) return false;
        return true;
    }
    /* a generator, a process group, a capsule...: shown by its kind, which the tag says */
    k.push('o');
    k.push((char)v.tagKind().size());
    put(v.tagKind().data(), v.tagKind().size());
    return true;
}

NameInfo *name_info(State *s, const at::RecordFunction &fn) {
    const char *name = fn.name();
    int scope = (int)fn.scope();
    const char *over = fn.scope() == at::RecordScope::FUNCTION ? fn.overload_name() : "";
    uint64_t gen = s->gen.load(std::memory_order_relaxed);
    /* an operator's name and overload are the dispatcher's own strings: the same pointers every call, so the
       thread's cache is found by them without reading the text (then compared, as a user scope's name may be a
       temporary whose address another name reuses) */
    LocalName &ln = local().names[(((uintptr_t)name >> 3) ^ ((uintptr_t)over >> 2) ^ (uintptr_t)scope) % kLocal];
    if (ln.name == name && ln.over == over && ln.scope == scope && ln.gen == gen && ln.ni != nullptr &&
        strcmp(ln.ni->key.c_str(), name) == 0 && strcmp(ln.ni->key.c_str() + strlen(name) + 1, over) == 0)
        return ln.ni;
    size_t nl = strlen(name), ol = strlen(over);
    uint64_t h = hash_bytes(over, ol, hash_bytes(name, nl + 1)) ^ (uint64_t)fn.scope();
    auto same = [&](const NameInfo *ni) {
        return ni->key.size() == nl + 1 + ol && memcmp(ni->key.data(), name, nl) == 0 &&
               memcmp(ni->key.data() + nl + 1, over, ol) == 0;
    };
    {
        std::lock_guard<std::mutex> g(s->mu);
        auto it = s->names.find(h);
        if (it != s->names.end() && same(it->second)) {
            ln = LocalName{name, over, scope, gen, it->second};
            return it->second;
        }
    }
    NameInfo *ni = new NameInfo();
    ni->key.assign(name, nl + 1);
    ni->key.append(over, ol);
    std::string text = name;
    /* bookkeeping, not the program's work: the profiler's own ops, and the scope torch opens around a Python
       dispatch mode's call (the op it runs is recorded; so a mode's re-dispatch is seen as the same op) */
    ni->skip = strncmp(name, "profiler::", 10) == 0 || strcmp(name, "PythonDispatchMode") == 0 ||
               strcmp(name, "PythonTLSSnapshot") == 0;
    if (fn.scope() == at::RecordScope::FUNCTION && strstr(name, "::") != nullptr) {
        try {
            auto schema = fn.operator_schema();   /* a copy: only on a miss */
            if (schema) {   /* an operator (not a C++ scope named like one): `ns.op.overload`, as torch prints it */
                std::string n(name);
                n.replace(n.find("::"), 2, ".");
                text = n + "." + (ol ? std::string(over) : std::string("default"));
                ni->schema = true;
                bool view = false;
                for (const auto &a : schema->arguments()) {
                    ArgInfo ai;
                    auto t = a.real_type();   /* type() says int for a dtype; the real type says ScalarType */
                    if (t->kind() == c10::TypeKind::OptionalType)
                        t = t->castRaw<c10::OptionalType>()->getElementType();
                    if (t->kind() == c10::TypeKind::ScalarTypeType) ai.show = SHOW_DTYPE;
                    else if (t->kind() == c10::TypeKind::LayoutType) ai.show = SHOW_LAYOUT;
                    else if (t->kind() == c10::TypeKind::MemoryFormatType) ai.show = SHOW_MEMFMT;
                    if (a.default_value()) {
                        ai.has_default = true;
                        ai.def = *a.default_value();
                    }
                    if (!a.kwarg_only())
                        ni->positional++;
                    if (a.alias_info() && !a.alias_info()->isWrite())
                        view = true;
                    ni->args.push_back(std::move(ai));
                }
                ni->nomark = ni->view = view;
            }
        } catch (...) {
            ni->schema = false;
        }
    }
    /* a C++ scope named without a namespace inside an op ("detach" around autograd's detach): not an op, and
       what runs in it is recorded */
    if (fn.scope() == at::RecordScope::FUNCTION && !ni->schema && strstr(name, "::") == nullptr)
        ni->elide = true;
    Gil gil;
    if (!gil.ok)
        return ni;   /* interpreter going away: the record keeps id 0 */
    if (!ni->nomark && s->nogpu) {
        PyObject *b = PyBytes_FromStringAndSize(text.data(), (Py_ssize_t)text.size());
        int c = b ? PySequence_Contains(s->nogpu, b) : 0;
        Py_XDECREF(b);
        if (c > 0) ni->nomark = true;
        PyErr_Clear();
    }
    ni->sid = intern_text(s, text.substr(0, 255));
    {
        std::lock_guard<std::mutex> g(s->mu);
        auto it = s->names.find(h);
        if (it != s->names.end()) {
            delete ni;   /* another thread filed it meanwhile (never freed while a record may point at it) */
            return it->second;
        }
        s->names[h] = ni;
        s->misses++;
    }
    ln = LocalName{name, over, scope, gen, ni};
    return ni;
}

/* under s->mu, after a new generation: the map starts empty. Its entries are freed one retirement later, not now:
   a thread's cache reads an entry only if it is of the current generation, and one that checked just before the
   generation moved finishes its read long before 16384 new misses retire the next one (a job that runs for days
   with a learning rate that changes every step keeps its memory) */
void retire_args(State *s) {
    for (ArgsInfo *a : s->args_retired)
        delete a;
    s->args_retired.clear();
    for (auto &kv : s->args)
        s->args_retired.push_back(kv.second);
    s->args.clear();
}

ArgsInfo args_info(State *s, const NameInfo *ni, const at::RecordFunction &fn) {
    ArgsInfo out;
    c10::ArrayRef<const c10::IValue> in = fn.inputs();
    size_t n = shown_args(ni, in);
    KeyBuf &k = t_key;
    k.n = 0;
    k.put(&ni, sizeof(ni));
    bool keyed = true;
    for (size_t i = 0; i < n && keyed; i++)
        keyed = append_key(k, in[i]);
    uint64_t h = hash_bytes(k.p, k.n);
    uint64_t gen = s->gen.load(std::memory_order_relaxed);
    LocalArgs &la = local().args[h % kLocal];
    if (keyed && la.h == h && la.gen == gen && la.ai != nullptr && k.same(la.ai->key)) {
        out.sid = la.ai->sid;
        out.dev = la.ai->dev;
        return out;
    }
    if (keyed) {
        std::lock_guard<std::mutex> g(s->mu);
        auto it = s->args.find(h);
        if (it != s->args.end() && k.same(it->second->key)) {
            out.sid = it->second->sid;
            out.dev = it->second->dev;
            la = LocalArgs{h, gen, it->second};
            return out;
        }
    }
    int32_t dev = -2;
    Gil gil;
    if (!gil.ok)
        return out;
    std::string text = args_text(ni, in, n, &dev);
    out.sid = intern_text(s, text);
    out.dev = dev;
    if (!s->device_set.load(std::memory_order_relaxed) && s->off_device >= 0) {
        /* the device the program computes on: a CPU tensor says cpu until an accelerator's tensor is seen (a
           CUDA program's first ops are often on the CPU: a seed, indices, a batch before .to()) */
        for (size_t i = 0; i < n; i++) {
            if (in[i].isTensor() && in[i].toTensor().defined()) {
                c10::DeviceType t = in[i].toTensor().device().type();
                if (t == c10::DeviceType::Meta)
                    continue;
                std::string d = c10::DeviceTypeName(t, true);
                char buf[32] = {0};
                memcpy(buf, d.data(), std::min<size_t>(d.size(), 31));
                memcpy(s->base + s->off_device, buf, 32);
                if (t != c10::DeviceType::CPU) {
                    s->device_set.store(true);
                    break;
                }
            }
        }
    }
    if (keyed) {
        std::lock_guard<std::mutex> g(s->mu);
        if (s->args.size() >= (1u << 14)) {   /* scalars that change every step (lr) must not fill it for good */
            s->gen.store(g_gen.fetch_add(1));
            retire_args(s);
        }
        auto *a = new ArgsInfo(out);
        a->key.assign(k.p, k.n);
        s->args[h] = a;
        la = LocalArgs{h, s->gen.load(std::memory_order_relaxed), a};
        s->misses++;
    }
    return out;
}

/* innermost frame outside torch and the recorder (the recorder's code_kind decides), as a string id */
uint32_t site_sid(State *s) {
    if (!s->frames)
        return 0;
    void *codes[kMaxFrames];
    int lastis[kMaxFrames];
    int n = gpulab_frames(codes, lastis, kMaxFrames);   /* innermost first; a user's frame is usually within 8 */
    if (n <= 0)
        return 0;
    int user = -1;
    int unknown = -1;
    uint64_t gen = s->gen.load(std::memory_order_relaxed);
    Local &L = local();
    int i0 = 0;
    for (; i0 < n; i0++) {   /* the thread's cache of code kinds first (no lock) */
        LocalCode &lc = L.codes[((uintptr_t)codes[i0] >> 4) % kLocal];
        if (lc.code != codes[i0] || lc.kind < 0)
            break;
        if (lc.kind) {
            user = i0;
            break;
        }
    }
    if (user < 0) {
        std::lock_guard<std::mutex> g(s->mu);
        for (int i = i0; i < n; i++) {
            auto it = s->codes.find(codes[i]);
            if (it == s->codes.end()) {
                unknown = i;
                break;
            }
            L.codes[((uintptr_t)codes[i] >> 4) % kLocal] = LocalCode{codes[i], it->second};
            if (it->second) {
                user = i;
                break;
            }
        }
    }
    if (user >= 0) {
        uint64_t h = (uint64_t)(uintptr_t)codes[user] * 31 + (uint64_t)lastis[user];
        LocalSite &ls = L.sites[h % kLocal];
        if (ls.code == codes[user] && ls.lasti == lastis[user] && ls.gen == gen)
            return ls.sid;
        std::lock_guard<std::mutex> g(s->mu);
        auto it = s->sites.find(h);
        if (it != s->sites.end() && it->second.code == codes[user] && it->second.lasti == lastis[user]) {
            ls = LocalSite{codes[user], lastis[user], gen, it->second.sid};
            return it->second.sid;
        }
    }
    Gil gil;
    if (!gil.ok)
        return 0;
    /* classify the codes not seen yet, from `unknown` on (Python keeps each classified code alive) */
    if (user < 0 && unknown >= 0) {
        for (int i = unknown; i < n; i++) {
            int8_t kind;
            {
                std::lock_guard<std::mutex> g(s->mu);
                auto it = s->codes.find(codes[i]);
                kind = it == s->codes.end() ? -1 : it->second;
            }
            if (kind < 0) {
                PyObject *r = PyObject_CallOneArg(s->on_code, (PyObject *)codes[i]);
                if (r == nullptr) {
                    PyErr_Clear();
                    return 0;
                }
                kind = r == Py_True ? 0 : 1;   /* True: internal (the recorder's code_kind) */
                Py_DECREF(r);
                std::lock_guard<std::mutex> g(s->mu);
                s->codes[codes[i]] = kind;
            }
            if (kind == 1) {
                user = i;
                break;
            }
        }
    }
    if (user < 0)
        return 0;
    int line = PyCode_Addr2Line((PyCodeObject *)codes[user], lastis[user]);
    PyObject *r = PyObject_CallFunction(s->on_site, "Oi", (PyObject *)codes[user], line);
    long sid = r ? PyLong_AsLong(r) : 0;
    Py_XDECREF(r);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    std::lock_guard<std::mutex> g(s->mu);
    uint64_t h = (uint64_t)(uintptr_t)codes[user] * 31 + (uint64_t)lastis[user];
    s->sites[h] = SiteInfo{codes[user], lastis[user], (uint32_t)sid};
    s->misses++;
    return (uint32_t)sid;
}

uint32_t thread_sid(State *s) {
    uint64_t gen = s->gen.load(std::memory_order_relaxed);
    if (t_thread_gen == gen)
        return t_thread_sid;
    Gil gil;
    if (!gil.ok)
        return 0;
    PyObject *tid = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    PyObject *r = tid ? PyObject_CallOneArg(s->on_thread, tid) : nullptr;
    Py_XDECREF(tid);
    long v = r ? PyLong_AsLong(r) : 0;
    Py_XDECREF(r);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    t_thread_sid = (uint32_t)v;
    t_thread_gen = gen;
    return t_thread_sid;
}

/* ------------------------------------------------------------------------------------------ records */

inline char *slot_of(State *s, int64_t seq) {
    return s->base + s->slots_off + (seq % s->cap) * s->slot_size;
}

void raise_started(State *s, int64_t seq) {
    int64_t *p = (int64_t *)(s->base + s->off_started);
    int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < seq + 1 && !__atomic_compare_exchange_n(p, &cur, seq + 1, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
    }
}

/* write and commit one record; the thread's open records make it deeper and the innermost one composite */
char *write_slot(State *s, int64_t seq, uint32_t nsid, uint32_t ssid, uint32_t asid, uint32_t tsid, int8_t kind) {
    char *sl = slot_of(s, seq);
    int8_t depth = (int8_t)std::min<size_t>(t_open.size(), 127);
    if (!t_open.empty()) {
        char *parent = t_open.back().slot;
        if (parent[43] == 0)
            parent[43] = 1;   /* it runs ops inside it: a composite record */
    }
    __atomic_store_n((int64_t *)sl, (int64_t)-1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    double t0 = now_s(), zero = 0.0;
    uint32_t ids[4] = {nsid, ssid, asid, tsid};
    int16_t stream = -1;
    int8_t small[2] = {depth, kind};
    uint8_t flags = 0;
    memcpy(sl + 8, &t0, 8);
    memcpy(sl + 16, &zero, 8);
    memcpy(sl + 24, ids, 16);
    memcpy(sl + 40, &stream, 2);
    memcpy(sl + 42, small, 2);
    memcpy(sl + 44, &flags, 1);
    __atomic_store_n((int64_t *)sl, (int64_t)seq, __ATOMIC_RELEASE);   /* commit */
    raise_started(s, seq);
    t_open.push_back(Open{seq, sl});
    return sl;
}

void close_slot(State *s, int64_t seq, char *sl, bool raised) {
    for (size_t i = t_open.size(); i-- > 0;) {   /* usually the innermost; a user scope may end out of order */
        if (t_open[i].seq == seq) {
            t_open.erase(t_open.begin() + (long)i);
            break;
        }
    }
    double t1 = now_s();
    if (raised)
        sl[44] = (char)(sl[44] | F_RAISED);
    memcpy(sl + 16, &t1, 8);
    __atomic_fetch_add((int64_t *)(s->base + s->off_completed), (int64_t)1, __ATOMIC_RELEASE);
}

bool stream_native(State *s, int32_t dev, uintptr_t *handle, int *capturing) {
    if (!s->get_stream || !s->stream_handle || !s->is_capturing)
        return false;
    if (dev < 0) {
        if (!s->current_device)
            return false;
        dev = s->current_device();
    }
    RawStream rs = s->get_stream((int8_t)dev);
    *handle = (uintptr_t)s->stream_handle(&rs);
    int status = 0;
    *capturing = !(s->ablate & 8) && s->is_capturing((void *)*handle, &status) == 0 && status != 0;
    return true;
}

/* the first record with CUDA work: the recorder picks the GPU mechanism (it calls gpu_start, or not);
   -> the tracking state after (one thread asks, the others go on untracked meanwhile) */
int start_tracking(State *s) {
    int expect = kTrackWaitCuda;
    if (!s->track.compare_exchange_strong(expect, kTrackPlain))
        return expect;
    Gil gil;
    if (gil.ok) {
        PyObject *r = PyObject_CallNoArgs(s->on_cuda);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    return s->track.load(std::memory_order_relaxed);
}

/* the marker of record `seq` (slot `sl`) on stream entry `e`; remembered as the thread's newest (kNoLaunchNs) */
void emit_marker(State *s, Gpu *g, GStream *e, uintptr_t handle, int64_t seq, char *sl) {
    if (!gpu_emit(g, e, handle, seq, sl, 1))   /* errors that stop tracking call Python: rare */
        return;
    s->markers.fetch_add(1, std::memory_order_relaxed);
    t_mark_seq = seq;
    t_mark_ns = steady_ns();
    t_mark_stream = (int16_t)e->index;
    memcpy(&t_mark_value, sl + OFF_MARK, 8);
}

/* the op returned on the GPU side of things: start tracking at the first CUDA op, then mark its stream */
void gpu_after(State *s, Ctx *c) {
    int track = s->track.load(std::memory_order_relaxed);
    if (track == kTrackWaitCuda) {
        if (c->dev < 0)
            return;
        track = start_tracking(s);
    }
    Gpu *g = s->gpu;
    if (track != kTrackGpu || g == nullptr || c->nomark || c->dev == -1 || (s->ablate & 4) ||
        __atomic_load_n(&g->disabled, __ATOMIC_RELAXED))
        return;
    if (c->slot[43] == 1 && t_mark_seq > c->seq && steady_ns() - t_mark_ns < kNoLaunchNs) {
        memcpy(c->slot + OFF_MARK, &t_mark_value, 8);   /* its last op's marker covers it (see kNoLaunchNs) */
        memcpy(c->slot + 40, &t_mark_stream, 2);
        c->slot[44] = (char)(c->slot[44] | F_MARK);
        return;
    }
    uintptr_t handle = 0;
    int capturing = 0;
    int32_t dev = c->dev;
    if (stream_native(s, dev, &handle, &capturing)) {
        if (capturing)
            return;   /* inside a CUDA graph capture: a marker would become part of the graph */
        if (dev < 0)
            dev = s->current_device();
        GStream *e = gpu_find_stream(g, handle, dev);
        if (e == nullptr) {
            Gil gil;
            if (!gil.ok)
                return;
            e = gpu_stream(g, handle, dev);
            if (e == nullptr || __atomic_load_n(&g->disabled, __ATOMIC_RELAXED))
                return;
        }
        if (!(s->ablate & 16))
            emit_marker(s, g, e, handle, c->seq, c->slot);
        return;
    }
    s->markers.fetch_add(1, std::memory_order_relaxed);
    s->python_marks.fetch_add(1, std::memory_order_relaxed);
    Gil gil;
    if (gil.ok)
        gpu_mark(g, c->seq, dev, c->slot, 1);
}

int32_t first_device(c10::ArrayRef<const c10::IValue> in) {
    for (const auto &v : in)
        if (v.isTensor() && v.toTensor().defined())
            return v.toTensor().device().is_cuda() ? v.toTensor().device().index() : -1;
    return -2;
}

/* an op on meta tensors: torch.compile tracing with fake tensors (their storage is meta), not program work */
bool on_meta(c10::ArrayRef<const c10::IValue> in) {
    for (const auto &v : in) {
        if (v.isTensor()) {
            const at::Tensor &t = v.toTensor();
            if (t.defined())
                return t.is_meta();
        }
    }
    return false;
}

std::unique_ptr<at::ObserverContext> enter(State *s, const at::RecordFunction &fn) {
    NameInfo *ni = nullptr;
    ArgsInfo ai;
    uint32_t nsid = 0, ssid = 0, tsid = 0;
    for (int tries = 0; tries < 3; tries++) {   /* again if the string table wrapped meanwhile (ids went stale) */
        uint64_t gen = s->gen.load(std::memory_order_acquire);
        ni = name_info(s, fn);
        if (ni->skip || ((ni->view || ni->elide) && !t_open.empty()) || on_meta(fn.inputs()))
            return nullptr;   /* a view inside an op (transpose's as_strided) is metadata of the op around it */
        nsid = ni->sid;
        if (!(s->ablate & 2))
            ai = args_info(s, ni, fn);
        else
            ai.dev = first_device(fn.inputs());
        if (!t_open.empty()) {
            const char *outer = t_open.back().slot;
            if (*(uint32_t *)(outer + 24) == nsid && *(uint32_t *)(outer + 32) == ai.sid)
                return nullptr;   /* a Python dispatch mode (a fix's, a planted fault's) running the same op again */
            ssid = *(uint32_t *)(outer + 28);   /* nested: the outer record's call site */
        } else if (!(s->ablate & 1)) {
            ssid = site_sid(s);
        }
        tsid = thread_sid(s);
        if (s->gen.load(std::memory_order_acquire) == gen)
            break;
    }
    auto c = std::make_unique<Ctx>();
    c->seq = s->seq.fetch_add(1, std::memory_order_relaxed);
    c->dev = ai.dev;
    c->nomark = ni->nomark;
    c->exc = std::uncaught_exceptions();
    c->slot = write_slot(s, c->seq, nsid, ssid, ai.sid, tsid, 0);
    return c;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction &fn) {
    State *s = g_state.load(std::memory_order_acquire);
    if (s == nullptr || !s->active.load(std::memory_order_relaxed) || s->base == nullptr || t_inside ||
        (s->ablate & 32))
        return nullptr;
    s->inflight.fetch_add(1, std::memory_order_relaxed);
    struct Inside {
        Inside() { t_inside = true; }
        ~Inside() { t_inside = false; }
    };
    try {
        Inside guard;
        auto c = enter(s, fn);
        if (c)
            return c;
    } catch (const std::exception &e) {   /* a tensor whose metadata cannot be read: unrecorded, never broken */
        if (getenv("GPULAB_OBSERVER_DEBUG"))
            fprintf(stderr, "gpulab observer: %s: %s\n", fn.name(), e.what());
    } catch (...) {
    }
    s->inflight.fetch_sub(1, std::memory_order_relaxed);
    return nullptr;
}

void on_exit(const at::RecordFunction &fn, at::ObserverContext *ctx) {
    (void)fn;
    State *s = g_state.load(std::memory_order_acquire);
    Ctx *c = static_cast<Ctx *>(ctx);
    if (c == nullptr || s == nullptr)
        return;
    bool raised = std::uncaught_exceptions() > c->exc;
    if (!raised && s->base != nullptr && s->track.load(std::memory_order_relaxed) != kTrackPlain)
        gpu_after(s, c);
    if (s->base != nullptr)
        close_slot(s, c->seq, c->slot, raised);
    s->inflight.fetch_sub(1, std::memory_order_relaxed);
}

/* in a forked child (a DataLoader worker): its copy of the log's mapping is the parent's, so nothing more
   is written (gpulab.trace.recorder also tells the Python side); no getpid() per op */
void after_fork_child() {
    State *s = g_state.load(std::memory_order_acquire);
    if (s != nullptr) {
        s->active.store(false);
        s->owner = -1;
    }
    g_state.store(nullptr);   /* the child may record into a log of its own (gpulab.trace.follow) */
    t_open.clear();
}

void *sym(void *lib, const char *name) {
    void *p = dlsym(lib ? lib : RTLD_DEFAULT, name);
    return p;
}

}  // namespace

/* ------------------------------------------------------------------------------------------ Python type */

typedef struct {
    PyObject_HEAD
    State *s;             /* never freed: an op in flight on another thread may still end after release */
    Py_buffer view;
    int has_view;
} Observer;

static int Observer_init(Observer *self, PyObject *args, PyObject *kw) {
    static const char *kwlist[] = {"buffer", "slots_off", "capacity", "slot_size", "off_started", "off_completed",
                                   "off_device", "intern", "on_thread", "on_code", "on_site", "on_cuda", "nogpu",
                                   "track", NULL};
    PyObject *buf, *intern, *on_thread, *on_code, *on_site, *on_cuda, *nogpu;
    Py_ssize_t slots_off, cap, slot_size, off_started, off_completed, off_device;
    int track = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnnnnnnOOOOOO|i", (char **)kwlist, &buf, &slots_off, &cap,
                                     &slot_size, &off_started, &off_completed, &off_device, &intern, &on_thread,
                                     &on_code, &on_site, &on_cuda, &nogpu, &track))
        return -1;
    if (self->s != nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "Observer already initialized");
        return -1;
    }
    if (cap < 1 || slot_size < 48) {
        PyErr_SetString(PyExc_ValueError, "capacity must be >= 1 and slot_size >= 48");
        return -1;
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    if (slots_off + cap * slot_size > self->view.len || off_started + 8 > self->view.len ||
        off_completed + 8 > self->view.len || off_device + 32 > self->view.len) {
        PyErr_SetString(PyExc_ValueError, "the buffer is smaller than the ring's layout");
        return -1;
    }
    State *s = new State();
    s->base = (char *)self->view.buf;
    s->len = self->view.len;
    s->slots_off = slots_off;
    s->cap = cap;
    s->slot_size = slot_size;
    s->off_started = off_started;
    s->off_completed = off_completed;
    s->off_device = off_device;
    s->seq.store(*(int64_t *)(s->base + off_started));
    s->gen.store(g_gen.fetch_add(1));
    s->track.store(track);
    s->owner = getpid();
    s->frames = gpulab_frames_supported() != 0;
    const char *ab = getenv("GPULAB_TRACE_ABLATE");
    s->ablate = ab ? atoi(ab) : 0;
    PyObject *o[] = {intern, on_thread, on_code, on_site, on_cuda, nogpu};
    PyObject **dst[] = {&s->intern, &s->on_thread, &s->on_code, &s->on_site, &s->on_cuda, &s->nogpu};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(o[i]);
        *dst[i] = o[i];
    }
    void *c10cuda = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    if (c10cuda != nullptr) {
        s->get_stream = (get_stream_t)sym(c10cuda, "_ZN3c104cuda20getCurrentCUDAStreamEa");
        s->stream_handle = (stream_handle_t)sym(c10cuda, "_ZNK3c104cuda10CUDAStream6streamEv");
        s->current_device = (current_device_t)sym(c10cuda, "_ZN3c104cuda14current_deviceEv");
    }
    self->s = s;
    return 0;
}

static PyObject *Observer_install(Observer *self, PyObject *unused) {
    State *s = self->s;
    if (s == nullptr || !self->has_view) {
        PyErr_SetString(PyExc_ValueError, "the observer was released");
        return NULL;
    }
    State *expect = nullptr;
    if (!g_state.compare_exchange_strong(expect, s) && expect != s) {
        PyErr_SetString(PyExc_RuntimeError, "another gpulab observer is installed in this process");
        return NULL;
    }
    if (g_handle.load() == 0) {
        try {
            g_handle.store(at::addGlobalCallback(
                at::RecordFunctionCallback(on_enter, on_exit)
                    .needsInputs(!(s->ablate & 64))
                    .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE})));
            g_handle_pid = getpid();
        } catch (const std::exception &e) {
            g_state.store(nullptr);
            PyErr_Format(PyExc_RuntimeError, "could not add the RecordFunction callback: %s", e.what());
            return NULL;
        }
    }
    s->handle = g_handle.load();
    s->active.store(true);
    Py_RETURN_NONE;
}

static PyObject *Observer_remove(Observer *self, PyObject *unused) {
    State *s = self->s;
    if (s == nullptr)
        Py_RETURN_NONE;
    s->active.store(false);
    State *expect = s;
    g_state.compare_exchange_strong(expect, nullptr);
    /* the callback goes when no observer records here: removed in the process that added it (a child that
       inherited it leaves it, inactive: the parent's registry copy is not the child's to change) */
    if (s->handle != 0 && g_state.load() == nullptr && getpid() == g_handle_pid) {
        try {
            at::removeCallback(g_handle.load());
        } catch (...) {
        }
        g_handle.store(0);
    }
    s->handle = 0;
    Py_RETURN_NONE;
}

static PyObject *Observer_begin(Observer *self, PyObject *args) {
    /* a record written from Python (a torch.distributed call around what it dispatches): -> seq */
    unsigned int nsid, ssid, asid;
    int kind = 1;
    if (!PyArg_ParseTuple(args, "III|i", &nsid, &ssid, &asid, &kind))
        return NULL;
    State *s = self->s;
    if (s == nullptr || !self->has_view) {
        PyErr_SetString(PyExc_ValueError, "the observer was released");
        return NULL;
    }
    uint32_t tsid = thread_sid(s);
    int64_t seq = s->seq.fetch_add(1, std::memory_order_relaxed);
    write_slot(s, seq, nsid, ssid, asid, tsid, (int8_t)kind);
    return PyLong_FromLongLong(seq);
}

static PyObject *Observer_end(Observer *self, PyObject *args) {
    long long seq;
    int raised = 0;
    if (!PyArg_ParseTuple(args, "L|p", &seq, &raised))
        return NULL;
    State *s = self->s;
    if (s == nullptr || !self->has_view) {
        PyErr_SetString(PyExc_ValueError, "the observer was released");
        return NULL;
    }
    close_slot(s, seq, slot_of(s, seq), raised != 0);
    Py_RETURN_NONE;
}

static PyObject *Observer_kernel_begin(Observer *self, PyObject *const *argv, Py_ssize_t nargs) {
    /* a kernel launched outside the dispatcher (Inductor's Triton launches): begin(name_sid) -> seq, with the
       call site read here; GIL held */
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "kernel_begin(name_sid)");
        return NULL;
    }
    State *s = self->s;
    if (s == nullptr || !self->has_view || !s->active.load(std::memory_order_relaxed)) {
        return PyLong_FromLong(-1);
    }
    unsigned long nsid = PyLong_AsUnsignedLong(argv[0]);
    if (PyErr_Occurred())
        return NULL;
    uint32_t ssid = t_open.empty() ? site_sid(s) : *(uint32_t *)(t_open.back().slot + 28);
    uint32_t tsid = thread_sid(s);
    int64_t seq = s->seq.fetch_add(1, std::memory_order_relaxed);
    write_slot(s, seq, (uint32_t)nsid, ssid, 0, tsid, 0);
    return PyLong_FromLongLong(seq);
}

static PyObject *Observer_kernel_end(Observer *self, PyObject *const *argv, Py_ssize_t nargs) {
    /* kernel_end(seq, stream_handle, device, raised): its GPU marker on that stream, then the record ends */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "kernel_end(seq, stream_handle, device, raised)");
        return NULL;
    }
    long long seq = PyLong_AsLongLong(argv[0]);
    unsigned long long handle = PyLong_AsUnsignedLongLongMask(argv[1]);
    long dev = PyLong_AsLong(argv[2]);
    int raised = PyObject_IsTrue(argv[3]);
    if (PyErr_Occurred())
        return NULL;
    State *s = self->s;
    if (seq < 0 || s == nullptr || !self->has_view)
        Py_RETURN_NONE;
    char *sl = slot_of(s, seq);
    if (!raised && dev >= 0) {
        if (s->track.load() == kTrackWaitCuda)
            start_tracking(s);
        Gpu *g = s->gpu;
        int status = 0;
        bool capturing = s->is_capturing && s->is_capturing((void *)(uintptr_t)handle, &status) == 0 && status != 0;
        if (s->track.load() == kTrackGpu && g != nullptr && !capturing && !(s->ablate & 4) &&
            !__atomic_load_n(&g->disabled, __ATOMIC_RELAXED)) {
            GStream *e = gpu_stream(g, (uintptr_t)handle, dev);
            if (e != nullptr && !__atomic_load_n(&g->disabled, __ATOMIC_RELAXED))
                emit_marker(s, g, e, (uintptr_t)handle, seq, sl);
        }
    }
    close_slot(s, seq, sl, raised != 0);
    Py_RETURN_NONE;
}

static PyObject *Observer_set_capturing(Observer *self, PyObject *arg) {
    /* the driver's cuStreamIsCapturing (its address), for the native stream path */
    unsigned long long p = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    if (self->s) self->s->is_capturing = (is_capturing_t)(uintptr_t)p;
    Py_RETURN_NONE;
}

static PyObject *Observer_forget(Observer *self, PyObject *unused) {
    /* the string table wrapped: every cached id may be stale */
    State *s = self->s;
    if (s == nullptr)
        Py_RETURN_NONE;
    std::lock_guard<std::mutex> g(s->mu);
    s->gen.store(g_gen.fetch_add(1));
    s->names.clear();   /* the entries are kept (never freed): an op being entered or a thread's cache may hold one */
    retire_args(s);
    s->sites.clear();
    Py_RETURN_NONE;
}

static PyObject *Observer_gpu_start(Observer *self, PyObject *args, PyObject *kw) {
    State *s = self->s;
    if (s == nullptr || !self->has_view) {
        PyErr_SetString(PyExc_ValueError, "the observer was released");
        return NULL;
    }
    if (s->gpu != nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "GPU tracking already started");
        return NULL;
    }
    Gpu *g = gpu_create(args, kw, s->base, s->len);
    if (g == nullptr)
        return NULL;
    s->gpu = g;
    s->track.store(kTrackGpu);
    Py_RETURN_NONE;
}

static PyObject *Observer_gpu_stop(Observer *self, PyObject *unused) {
    if (self->s && self->s->gpu) {
        self->s->track.store(kTrackPlain);
        gpu_stop(self->s->gpu);   /* it lets the GIL go while it joins the poller */
    }
    Py_RETURN_NONE;
}

static PyObject *Observer_gpu_pending(Observer *self, PyObject *unused) {
    return PyLong_FromLongLong(self->s ? gpu_pending(self->s->gpu) : 0);
}

static PyObject *Observer_gpu_state(Observer *self, PyObject *unused) {
    return gpu_state(self->s ? self->s->gpu : nullptr);
}

static PyObject *Observer_release(Observer *self, PyObject *unused) {
    /* stop recording and let the mapping close, unless an op on another thread is still inside a record */
    State *s = self->s;
    if (s == nullptr)
        Py_RETURN_NONE;
    Observer_remove(self, nullptr);
    if (s->gpu) {
        s->track.store(kTrackPlain);
        gpu_stop(s->gpu);
    }
    if (s->inflight.load() > 0)
        Py_RETURN_FALSE;
    s->base = nullptr;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_RETURN_TRUE;
}

static PyObject *Observer_leave(Observer *self, PyObject *unused) {
    /* in a forked child: never write into the parent's log (the callback stays registered, inactive) */
    if (self->s) {
        self->s->active.store(false);
        self->s->owner = -1;
    }
    Py_RETURN_NONE;
}

static PyObject *Observer_stats(Observer *self, PyObject *unused) {
    State *s = self->s;
    if (s == nullptr)
        Py_RETURN_NONE;
    std::lock_guard<std::mutex> g(s->mu);
    return Py_BuildValue("{s:L,s:K,s:n,s:n,s:n,s:n,s:i,s:i,s:i,s:i,s:L,s:L}", "seq", (long long)s->seq.load(),
                         "misses", (unsigned long long)s->misses, "names", (Py_ssize_t)s->names.size(), "signatures",
                         (Py_ssize_t)s->args.size(), "signatures_retired", (Py_ssize_t)s->args_retired.size(), "sites", (Py_ssize_t)s->sites.size(), "frames", (int)s->frames,
                         "native_streams", (int)(s->get_stream && s->stream_handle), "capture_check",
                         (int)(s->is_capturing != nullptr), "inflight", s->inflight.load(), "markers",
                         (long long)s->markers.load(), "python_marks", (long long)s->python_marks.load());
}

static void Observer_dealloc(Observer *self) {
    if (self->s) {
        Observer_remove(self, nullptr);
        self->s->active.store(false);
        if (self->s->inflight.load() == 0) {
            self->s->base = nullptr;
            if (self->has_view) {
                PyBuffer_Release(&self->view);
                self->has_view = 0;
            }
        }
    }
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Observer_methods[] = {
    {"install", (PyCFunction)Observer_install, METH_NOARGS, "start recording every op (a global RecordFunction callback)"},
    {"remove", (PyCFunction)Observer_remove, METH_NOARGS, "stop recording"},
    {"begin", (PyCFunction)Observer_begin, METH_VARARGS, "begin(name_sid, site_sid, args_sid, kind=1) -> seq"},
    {"end", (PyCFunction)Observer_end, METH_VARARGS, "end(seq, raised=False)"},
    {"kernel_begin", (PyCFunction)(void (*)(void))Observer_kernel_begin, METH_FASTCALL,
     "kernel_begin(name_sid) -> seq: a kernel launched outside the dispatcher, as a record"},
    {"kernel_end", (PyCFunction)(void (*)(void))Observer_kernel_end, METH_FASTCALL,
     "kernel_end(seq, stream_handle, device, raised): its GPU marker, then the record ends"},
    {"set_capturing", (PyCFunction)Observer_set_capturing, METH_O, "cuStreamIsCapturing's address"},
    {"forget", (PyCFunction)Observer_forget, METH_NOARGS, "the string table wrapped: drop cached ids"},
    {"gpu_start", (PyCFunction)(void (*)(void))Observer_gpu_start, METH_VARARGS | METH_KEYWORDS,
     "as gpulab_hotpath.Hot.gpu_start: each CUDA op's end enqueues its completion marker"},
    {"gpu_stop", (PyCFunction)Observer_gpu_stop, METH_NOARGS, "stop GPU markers (and the event poller)"},
    {"gpu_pending", (PyCFunction)Observer_gpu_pending, METH_NOARGS, "events not yet seen complete"},
    {"gpu_state", (PyCFunction)Observer_gpu_state, METH_NOARGS, "GPU tracking's state (None: not started)"},
    {"release", (PyCFunction)Observer_release, METH_NOARGS, "stop and release the buffer -> False if an op is still in a record"},
    {"leave", (PyCFunction)Observer_leave, METH_NOARGS, "in a forked child: record nothing more"},
    {"stats", (PyCFunction)Observer_stats, METH_NOARGS, "counters and cache sizes"},
    {NULL}
};

static PyTypeObject ObserverType = {PyVarObject_HEAD_INIT(NULL, 0)};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpulab_observer", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_gpulab_observer(void) {
    ObserverType.tp_name = "gpulab_observer.Observer";
    ObserverType.tp_basicsize = sizeof(Observer);
    ObserverType.tp_flags = Py_TPFLAGS_DEFAULT;
    ObserverType.tp_new = PyType_GenericNew;
    ObserverType.tp_init = (initproc)Observer_init;
    ObserverType.tp_dealloc = (destructor)Observer_dealloc;
    ObserverType.tp_methods = Observer_methods;
    if (PyType_Ready(&ObserverType) < 0)
        return NULL;
    pthread_atfork(nullptr, nullptr, after_fork_child);
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&ObserverType);
    if (PyModule_AddObject(m, "Observer", (PyObject *)&ObserverType) < 0) {
        Py_DECREF(&ObserverType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
