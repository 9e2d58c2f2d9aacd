/* The RecordFunction callbacks: on_enter writes an op's record (name, arguments, call site, thread) and
   on_exit closes it (and marks its GPU work); ops that are not the program's (the profiler's bookkeeping,
   a view inside an op, fake tensors while torch.compile traces, the observer's own) are left out.
   Part of observer.cpp's one translation unit (included there only, so its anonymous namespace is that
   file's): gpulab.trace.native hashes every observer_*.h into the build's cache key. */
#ifndef GPULAB_OBSERVER_CALLBACKS_H
#define GPULAB_OBSERVER_CALLBACKS_H
#include "observer_state.h"
#include "observer_cache.h"
#include "observer_frames.h"
#include "observer_ring.h"
#include "observer_gpu.h"

namespace {

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
    c->by_outputs = ni->returns && g_by_outputs.load(std::memory_order_relaxed);
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
    if (t_probe) {
        auto c = std::make_unique<Ctx>();
        c->probe = true;
        c->exc = std::uncaught_exceptions();
        if (g_by_outputs.load()) {
            auto schema = fn.operator_schema();
            c->by_outputs = schema && !schema->returns().empty();
        }
        return c;
    }
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
    /* unwinding through the op; or, where the record ends with no exception in flight (torch 2.11's CUDA wheels),
       an op that returns something ended without outputs */
    bool raised = std::uncaught_exceptions() > c->exc || (c->by_outputs && fn.outputs().empty());
    if (c->probe) {
        if (getenv("GPULAB_OBSERVER_DEBUG"))   /* the probe's op only: what this build lets a callback see */
            fprintf(stderr, "gpulab observer probe: %s ended with %d uncaught exception(s) (%d when it began), "
                    "%d output(s) (%s)\n", fn.name(), std::uncaught_exceptions(), c->exc, (int)fn.outputs().size(),
                    c->by_outputs ? "read" : "not asked for");
        g_probe.store(raised ? 1 : 2);
        s->inflight.fetch_sub(1, std::memory_order_relaxed);
        return;
    }
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

}  // namespace

#endif  /* GPULAB_OBSERVER_CALLBACKS_H */
