/* Writing a record into the op log (gpulab.trace.ring's slot layout): seq stored last with release order,
   so that a reader in another process never sees a half-written record, even after SIGKILL.
   Part of observer.cpp's one translation unit (included there only, so its anonymous namespace is that
   file's): gpulab.trace.native hashes every observer_*.h into the build's cache key. */
#ifndef GPULAB_OBSERVER_RING_H
#define GPULAB_OBSERVER_RING_H
#include "observer_state.h"

namespace {

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

}  // namespace

#endif  /* GPULAB_OBSERVER_RING_H */
