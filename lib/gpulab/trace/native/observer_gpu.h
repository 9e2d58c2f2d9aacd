/* GPU marks: after a CUDA op returns, a completion marker on its stream (gpumark.h), so that a hang's
   verdict names the GPU work that never completed rather than the sync the host waits in. Streams are found
   natively (libc10_cuda) where possible; never inside a CUDA graph capture.
   Part of observer.cpp's one translation unit (included there only, so its anonymous namespace is that
   file's): gpulab.trace.native hashes every observer_*.h into the build's cache key. */
#ifndef GPULAB_OBSERVER_GPU_H
#define GPULAB_OBSERVER_GPU_H
#include "observer_state.h"

namespace {

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

}  // namespace

#endif  /* GPULAB_OBSERVER_GPU_H */
