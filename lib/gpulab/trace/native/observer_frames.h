/* Call sites: the innermost Python frame outside torch and the recorder, read without the GIL (pyframes.c),
   and the thread's name, each as a string id. Why without the GIL: most ops are entered after the binding
   released it, and taking it back per op would make the program wait for any other thread that holds it.
   Part of observer.cpp's one translation unit (included there only, so its anonymous namespace is that
   file's): gpulab.trace.native hashes every observer_*.h into the build's cache key. */
#ifndef GPULAB_OBSERVER_FRAMES_H
#define GPULAB_OBSERVER_FRAMES_H
#include "observer_state.h"

/* pyframes.c: C, built with Py_BUILD_CORE for CPython's internal frame layouts */
extern "C" int gpulab_frames(void **codes, int *lastis, int max);
extern "C" int gpulab_frames_supported(void);

namespace {

constexpr int kMaxFrames = 64;

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

}  // namespace

#endif  /* GPULAB_OBSERVER_FRAMES_H */
