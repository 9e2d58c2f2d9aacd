/* The ids an op's record needs (its name, its argument summary): looked up in the thread's cache first, then
   in the shared maps under the lock, and only on a miss interned by the recorder's Python (under the GIL).
   Why: a hit is every op's path and takes no lock; a miss costs microseconds, once per name or signature.
   Part of observer.cpp's one translation unit (included there only, so its anonymous namespace is that
   file's): gpulab.trace.native hashes every observer_*.h into the build's cache key. */
#ifndef GPULAB_OBSERVER_CACHE_H
#define GPULAB_OBSERVER_CACHE_H
#include "observer_state.h"
#include "observer_args.h"

namespace {

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
                ni->returns = !schema->returns().empty();
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

}  // namespace

#endif  /* GPULAB_OBSERVER_CACHE_H */
