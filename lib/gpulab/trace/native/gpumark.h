/* GPU completion markers, shared by the recorder's two native paths (hotpath.c: the dispatch mode's C calls;
   observer.cpp: the RecordFunction observer). Included by each, so every function is static; valid C and C++.

   Once the recorder chose a mechanism (gpulab.trace.gpu), `gpu_create` takes the driver's entry points and
   `gpu_mark` enqueues an op's completion marker on its stream after its work: a stream memory op writing the
   seq into the log's GPU page, or a CUDA event from the stream's own pool. Events are polled by a native
   thread (no GIL, no Python): per stream the newest event first, else a binary search for the last completed
   one (a stream completes in order), so a poll costs O(log pending) queries. gpu_mark and gpu_create need the
   GIL (they call the recorder's Python callbacks); the poller never takes it. */
#ifndef GPULAB_GPUMARK_H
#define GPULAB_GPUMARK_H
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#define MAX_GSTREAMS 128
#define CU_SUCCESS 0
#define CU_NOT_READY 600
#define CU_INVALID_CONTEXT 201
#define G_MEMOP 0
#define G_EVENTS 1
#define G_SKIPPED (-1)     /* no marker: the stream's event ring is full (the GPU is that far behind) */

typedef int (*cu_record_t)(void *ev, void *stream);
typedef int (*cu_query_t)(void *ev);
typedef int (*cu_write64_t)(void *stream, uint64_t addr, uint64_t value, unsigned flags);
typedef int (*cu_setctx_t)(void *ctx);
typedef int (*cu_popctx_t)(void **ctx);
typedef int (*cu_capmode_t)(int *mode);
#define CU_CAPTURE_MODE_RELAXED 2

typedef struct {
    uintptr_t handle;
    long dev;
    long index;                 /* entry in the log's GPU page */
    void *ctx;
    uint64_t target;            /* memop: device address of the entry's done word */
    void **events;              /* events: the stream's own pool, used round robin */
    int64_t *seqs;
    int64_t cap;
    int64_t head, tail;         /* head: written under the GIL; tail: by the poller (atomics) */
    int64_t last_mark;          /* the newest marker value enqueued (observer: strictly increasing per stream) */
} GStream;

typedef struct Gpu {
    char *base;                 /* the log's mapping (the GPU page lies in it) */
    int kind, multi, stop, running, disabled;
    int full;                   /* the log's GPU page is full: new streams go untracked without asking again */
    Py_ssize_t mech_off;        /* the log header's mechanism text (-1: none), where the poller says it stopped */
    pid_t owner;                /* a forked child never joins its parent's poller */
    pthread_t poller;
    long poll_us, errors, max_errors;
    cu_record_t record; cu_query_t query; cu_write64_t write64;
    cu_setctx_t set_ctx, push_ctx; cu_popctx_t pop_ctx;
    cu_capmode_t capture_mode;  /* cuThreadExchangeStreamCaptureMode (0: the driver has none) */
    void *first_ctx;
    PyObject *raw_stream, *get_device, *capturing, *on_stream, *on_stop;
    Py_ssize_t page_off, stream_size;
    long n;                     /* entries published (release) */
    long last;                  /* index of the entry hit last (most ops run on one stream) */
    GStream s[MAX_GSTREAMS];
} Gpu;

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* how many of the ring's pending events [tail, head) completed: a prefix (in stream order) */
static int64_t ready_prefix(Gpu *g, GStream *e, int64_t tail, int64_t head, int *err) {
    int code = g->query(e->events[(head - 1) % e->cap]);
    if (code == CU_SUCCESS)
        return head;
    if (code != CU_NOT_READY) {
        *err = code;
        return tail;
    }
    int64_t lo = tail, hi = head - 1;   /* hi is known not ready */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (g->query(e->events[mid % e->cap]) == CU_SUCCESS)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* the poller cannot query events (no context, a context gone): stale GPU progress would name a false culprit,
   so tracking stops and the log's header says so (a plain memory write: the poller holds no GIL) */
static void poll_failed(Gpu *g, int code) {
    __atomic_store_n(&g->disabled, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g->stop, 1, __ATOMIC_RELEASE);
    if (g->mech_off >= 0) {
        char text[32] = {0};
        snprintf(text, sizeof(text), "stopped: query CUresult %d", code);
        memcpy(g->base + g->mech_off, text, sizeof(text));
    }
}

static void poll_once(Gpu *g) {
    long n = __atomic_load_n(&g->n, __ATOMIC_ACQUIRE);
    void *cur = g->first_ctx;
    for (long i = 0; i < n; i++) {
        GStream *e = &g->s[i];
        int64_t head = __atomic_load_n(&e->head, __ATOMIC_ACQUIRE), tail = e->tail;
        if (head == tail)
            continue;
        if (g->multi && e->ctx != cur && e->ctx) {
            g->set_ctx(e->ctx);
            cur = e->ctx;
        }
        int err = 0;
        int64_t upto = ready_prefix(g, e, tail, head, &err);
        if (err == CU_INVALID_CONTEXT) {   /* this thread lost its context: once more with the stream's */
            cur = e->ctx ? e->ctx : g->first_ctx;
            g->set_ctx(cur);
            err = 0;
            upto = ready_prefix(g, e, tail, head, &err);
        }
        if (err) {
            poll_failed(g, err);
            return;
        }
        if (upto > tail) {
            __atomic_store_n((int64_t *)(g->base + g->page_off + e->index * g->stream_size),
                             e->seqs[(upto - 1) % e->cap], __ATOMIC_RELEASE);
            __atomic_store_n(&e->tail, upto, __ATOMIC_RELEASE);
        }
    }
}

static void *poller_main(void *arg) {
    Gpu *g = (Gpu *)arg;
    /* A CUDA graph capture in the default global mode is invalidated by an event query from any other thread
       (cuEventQuery returns 900, the program's capture_end fails), unless that thread is in relaxed mode, as
       PyTorch's NCCL watchdog is for the same reason. The poller never queries an event recorded in a capture. */
    if (g->capture_mode) {
        int mode = CU_CAPTURE_MODE_RELAXED;
        g->capture_mode(&mode);
    }
    if (g->first_ctx)
        g->set_ctx(g->first_ctx);
    while (!__atomic_load_n(&g->stop, __ATOMIC_ACQUIRE)) {
        poll_once(g);
        sleep_us(g->poll_us);
    }
    poll_once(g);
    return NULL;
}

static void gpu_stop(Gpu *g) {
    if (g == NULL)
        return;
    g->disabled = 1;   /* no marker after this: the recorder destroys the events and unregisters the page next */
    if (!g->running)
        return;
    g->running = 0;
    __atomic_store_n(&g->stop, 1, __ATOMIC_RELEASE);
    if (g->owner == getpid()) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(g->poller, NULL);
        Py_END_ALLOW_THREADS
    }
}

static void gpu_free(Gpu *g) {
    if (g == NULL)
        return;
    gpu_stop(g);
    for (long i = 0; i < g->n; i++) {
        free(g->s[i].events);
        free(g->s[i].seqs);
    }
    Py_CLEAR(g->raw_stream); Py_CLEAR(g->get_device); Py_CLEAR(g->capturing);
    Py_CLEAR(g->on_stream); Py_CLEAR(g->on_stop);
    free(g);
}

/* tracking stopped (a failing CUDA or torch call, too many refused markers): the recorder says why in the log */
static void gpu_disable(Gpu *g, PyObject *why) {
    g->disabled = 1;
    if (why == NULL) {   /* a Python error is pending: its text is the reason */
        PyObject *t = NULL, *v = NULL, *tb = NULL;
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
        why = t && v ? PyUnicode_FromFormat("%s: %S", ((PyTypeObject *)t)->tp_name, v)
                     : PyUnicode_FromString("error");
        Py_XDECREF(t); Py_XDECREF(v); Py_XDECREF(tb);
    }
    if (why == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *r = PyObject_CallOneArg(g->on_stop, why);
    Py_DECREF(why);
    Py_XDECREF(r);
    PyErr_Clear();
}

/* the tracked stream (device, handle) if it has an entry already (no Python: callable without the GIL) */
static GStream *gpu_find_stream(Gpu *g, uintptr_t handle, long dev) {
    long n = __atomic_load_n(&g->n, __ATOMIC_ACQUIRE);
    GStream *e = &g->s[g->last];
    if (n && e->handle == handle && e->dev == dev)
        return e;
    for (long i = 0; i < n; i++) {
        if (g->s[i].handle == handle && g->s[i].dev == dev) {
            g->last = i;
            return &g->s[i];
        }
    }
    return NULL;
}

static GStream *gpu_stream(Gpu *g, uintptr_t handle, long dev) {
    GStream *e = gpu_find_stream(g, handle, dev);
    if (e != NULL)
        return e;
    if (g->full || g->n >= MAX_GSTREAMS)
        return NULL;
    /* a new stream: the recorder claims its page entry and (events) makes its pool */
    PyObject *r = PyObject_CallFunction(g->on_stream, "lK", dev, (unsigned long long)handle);
    if (r == NULL) {
        gpu_disable(g, NULL);
        return NULL;
    }
    if (r == Py_None) {  /* the page is full: this stream's ops are not tracked */
        Py_DECREF(r);
        g->full = 1;
        return NULL;
    }
    e = &g->s[g->n];
    memset(e, 0, sizeof(*e));
    PyObject *events = NULL;
    unsigned long long ctx = 0, target = 0;
    if (!PyArg_ParseTuple(r, "lKKO", &e->index, &ctx, &target, &events)) {
        Py_DECREF(r);
        gpu_disable(g, NULL);
        return NULL;
    }
    e->handle = handle;
    e->dev = dev;
    e->ctx = (void *)(uintptr_t)ctx;
    e->target = target;
    if (g->kind == G_EVENTS) {
        PyObject *seq = PySequence_Fast(events, "on_stream: events must be a sequence");
        Py_ssize_t k = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
        if (seq == NULL || k < 2) {
            Py_XDECREF(seq);
            Py_DECREF(r);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "on_stream: an event pool needs at least 2 events");
            gpu_disable(g, NULL);
            return NULL;
        }
        e->events = (void **)calloc((size_t)k, sizeof(void *));
        e->seqs = (int64_t *)calloc((size_t)k, sizeof(int64_t));
        if (!e->events || !e->seqs) {
            free(e->events); free(e->seqs);
            Py_DECREF(seq); Py_DECREF(r);
            PyErr_NoMemory();
            gpu_disable(g, NULL);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < k; j++)
            e->events[j] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(seq, j));
        e->cap = k;
        Py_DECREF(seq);
    }
    Py_DECREF(r);
    if (PyErr_Occurred()) {
        free(e->events); free(e->seqs);
        gpu_disable(g, NULL);
        return NULL;
    }
    if (e->ctx && g->first_ctx && e->ctx != g->first_ctx)
        g->multi = 1;   /* from now on every marker is emitted with its device's context pushed */
    g->last = g->n;
    __atomic_store_n(&g->n, g->n + 1, __ATOMIC_RELEASE);
    return e;
}

static int gpu_emit1(Gpu *g, GStream *e, uintptr_t handle, long long seq) {
    if (g->kind == G_MEMOP)
        return g->write64((void *)handle, e->target, (uint64_t)seq, 0);
    int64_t head = e->head;
    if (head - __atomic_load_n(&e->tail, __ATOMIC_ACQUIRE) >= e->cap)
        return G_SKIPPED;
    int code = g->record(e->events[head % e->cap], (void *)handle);
    if (code == CU_SUCCESS) {
        e->seqs[head % e->cap] = seq;
        __atomic_store_n(&e->head, head + 1, __ATOMIC_RELEASE);
    }
    return code;
}

/* The value a marker carries. The dispatch mode's C path emits markers in seq order, so the op's seq serves. The
   observer's records nest: a composite's seq comes before its ops' but its marker after theirs, so it gives each
   marker a value above every earlier one on the stream (at least the op's seq) and writes it into the slot
   (offset 48, flag F_MARK): a record is done when the stream's done value reaches its own marker's. */
#define F_MARK 8
#define OFF_MARK 48

static long long next_mark(GStream *e, long long seq) {
    int64_t last = __atomic_load_n(&e->last_mark, __ATOMIC_RELAXED), want;
    do {
        want = last + 1 > seq ? last + 1 : seq;
    } while (!__atomic_compare_exchange_n(&e->last_mark, &last, want, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return want;
}

/* the op `seq` ran on stream `handle` of device `dev` and its entry `e`: its marker after its work (never a
   sync); -> 1 if a marker was enqueued. `marks`: give the marker its own increasing value (the observer).
   No Python unless tracking must stop (needs the GIL then). */
static int gpu_emit(Gpu *g, GStream *e, uintptr_t handle, long long seq, char *slot, int marks) {
    if (marks) {
        seq = next_mark(e, seq);
        memcpy(slot + OFF_MARK, &seq, 8);
    }
    void *popped;
    if (g->multi && e->ctx)
        g->push_ctx(e->ctx);
    int code = gpu_emit1(g, e, handle, seq);
    if (code == CU_INVALID_CONTEXT && e->ctx) {   /* a thread without a current context: once, the device's */
        g->set_ctx(e->ctx);
        code = gpu_emit1(g, e, handle, seq);
    }
    if (g->multi && e->ctx)
        g->pop_ctx(&popped);
    if (code == CU_SUCCESS) {
        int16_t idx = (int16_t)e->index;
        __atomic_store_n((int64_t *)(g->base + g->page_off + e->index * g->stream_size + 8), (int64_t)seq,
                         __ATOMIC_RELEASE);
        memcpy(slot + 40, &idx, 2);
        if (marks)
            slot[44] = (char)(slot[44] | F_MARK);
        return 1;
    }
    if (code != G_SKIPPED && ++g->errors >= g->max_errors) {
        gpu_disable(g, PyUnicode_FromFormat("CUresult %d", code));
    }
    return 0;
}

/* the op `seq` returned: its marker, after its work, on the current stream of its device (never a sync).
   Asks torch (Python: the GIL is held) for the stream; the observer resolves it natively when it can. */
static void gpu_mark(Gpu *g, long long seq, long dev, char *slot, int marks) {
    if (dev == -1)
        return;   /* CPU tensors only */
    PyObject *c = PyObject_CallNoArgs(g->capturing);
    if (c == NULL) {
        gpu_disable(g, NULL);
        return;
    }
    int capturing = PyObject_IsTrue(c);
    Py_DECREF(c);
    if (capturing < 0) {
        gpu_disable(g, NULL);
        return;
    }
    if (capturing)
        return;   /* inside a CUDA graph capture: a marker would become part of the graph */
    if (dev < 0) {   /* no tensor argument (a factory): the current device */
        PyObject *d = PyObject_CallNoArgs(g->get_device);
        dev = d ? PyLong_AsLong(d) : -1;
        Py_XDECREF(d);
        if (PyErr_Occurred()) {
            gpu_disable(g, NULL);
            return;
        }
    }
    PyObject *dv = PyLong_FromLong(dev);
    PyObject *h = dv ? PyObject_CallOneArg(g->raw_stream, dv) : NULL;
    Py_XDECREF(dv);
    uintptr_t handle = h ? (uintptr_t)PyLong_AsUnsignedLongLongMask(h) : 0;
    Py_XDECREF(h);
    if (h == NULL || PyErr_Occurred()) {
        gpu_disable(g, NULL);
        return;
    }
    GStream *e = gpu_stream(g, handle, dev);
    if (e == NULL || __atomic_load_n(&g->disabled, __ATOMIC_RELAXED))
        return;
    gpu_emit(g, e, handle, seq, slot, marks);
}

/* gpu_start's arguments (see Hot.gpu_start's docstring) -> a started Gpu over `base` of `len` bytes, or NULL
   with a Python error set */
static Gpu *gpu_create(PyObject *args, PyObject *kw, char *base, Py_ssize_t len) {
    static const char *kwlist[] = {"kind", "functions", "raw_stream", "get_device", "capturing", "on_stream",
                                   "on_stop", "page_off", "stream_size", "first_ctx", "poll_us", "max_errors",
                                   "mechanism_off", "capture_mode", NULL};
    int kind;
    unsigned long long f_emit, f_query, f_set, f_push, f_pop, first_ctx;
    PyObject *raw_stream, *get_device, *capturing, *on_stream, *on_stop;
    Py_ssize_t page_off, stream_size;
    long poll_us = 2000, max_errors = 100;
    Py_ssize_t mech_off = -1;
    unsigned long long f_capmode = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i(KKKKK)OOOOOnnK|llnK", (char **)kwlist, &kind, &f_emit, &f_query,
                                     &f_set, &f_push, &f_pop, &raw_stream, &get_device, &capturing, &on_stream,
                                     &on_stop, &page_off, &stream_size, &first_ctx, &poll_us, &max_errors,
                                     &mech_off, &f_capmode))
        return NULL;
    if ((kind != G_MEMOP && kind != G_EVENTS) || !f_emit || !f_set || !f_push || !f_pop ||
        (kind == G_EVENTS && !f_query) || poll_us < 1 ||
        page_off + MAX_GSTREAMS * stream_size > len || mech_off + 32 > len) {
        PyErr_SetString(PyExc_ValueError, "gpu_start: bad kind, missing driver entry point or page outside the log");
        return NULL;
    }
    Gpu *g = (Gpu *)calloc(1, sizeof(Gpu));
    if (g == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    g->base = base;
    g->kind = kind;
    if (kind == G_MEMOP)
        g->write64 = (cu_write64_t)(uintptr_t)f_emit;
    else
        g->record = (cu_record_t)(uintptr_t)f_emit;
    g->query = (cu_query_t)(uintptr_t)f_query;
    g->set_ctx = (cu_setctx_t)(uintptr_t)f_set;
    g->push_ctx = (cu_setctx_t)(uintptr_t)f_push;
    g->pop_ctx = (cu_popctx_t)(uintptr_t)f_pop;
    g->capture_mode = (cu_capmode_t)(uintptr_t)f_capmode;
    g->first_ctx = (void *)(uintptr_t)first_ctx;
    g->page_off = page_off;
    g->stream_size = stream_size;
    g->poll_us = poll_us;
    g->max_errors = max_errors;
    g->mech_off = mech_off;
    Py_INCREF(raw_stream); g->raw_stream = raw_stream;
    Py_INCREF(get_device); g->get_device = get_device;
    Py_INCREF(capturing); g->capturing = capturing;
    Py_INCREF(on_stream); g->on_stream = on_stream;
    Py_INCREF(on_stop); g->on_stop = on_stop;
    if (kind == G_EVENTS) {
        g->owner = getpid();
        if (pthread_create(&g->poller, NULL, poller_main, g) != 0) {
            gpu_free(g);
            PyErr_SetString(PyExc_OSError, "gpu_start: could not start the event poller thread");
            return NULL;
        }
        g->running = 1;
    }
    return g;
}

/* events not yet seen complete, over all streams (the memop path keeps none: the page says it) */
static long long gpu_pending(Gpu *g) {
    long long pending = 0;
    if (g != NULL)
        for (long i = 0; i < __atomic_load_n(&g->n, __ATOMIC_ACQUIRE); i++)
            pending += __atomic_load_n(&g->s[i].head, __ATOMIC_ACQUIRE) - __atomic_load_n(&g->s[i].tail, __ATOMIC_ACQUIRE);
    return pending;
}

static PyObject *gpu_state(Gpu *g) {
    if (g == NULL)
        Py_RETURN_NONE;
    return Py_BuildValue("{s:i,s:i,s:i,s:l,s:l,s:i}", "kind", g->kind, "running", g->running, "disabled",
                         g->disabled, "errors", g->errors, "streams", g->n, "multi", g->multi);
}
#endif
