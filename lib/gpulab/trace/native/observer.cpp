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
   stream. Commit order as everywhere: the slot's seq is stored last, with release order.

   The parts, one concern each, compiled here as one translation unit (torch's headers parsed once):
   observer_state.h (the shared state and caches), observer_args.h (argument texts and keys),
   observer_cache.h (name and argument ids), observer_frames.h (call sites), observer_ring.h (writing
   records), observer_gpu.h (GPU marks), observer_callbacks.h (the RecordFunction callbacks); this file holds
   the Python type and the module's init. */
#include "observer_state.h"
#include "observer_args.h"
#include "observer_cache.h"
#include "observer_frames.h"
#include "observer_ring.h"
#include "observer_gpu.h"
#include "observer_callbacks.h"

#include <dlfcn.h>

namespace {

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

static at::CallbackHandle add_callback(State *s) {
    return at::addGlobalCallback(at::RecordFunctionCallback(on_enter, on_exit)
                                     .needsInputs(!(s->ablate & 64))
                                     .needsOutputs(g_by_outputs.load())
                                     .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
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
            g_handle.store(add_callback(s));
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

static PyObject *Observer_probe(Observer *self, PyObject *fn) {
    /* fn() runs ops that raise, none recorded: whether this callback sees an op raise (torch 2.11's CUDA
       wheels end the record with no exception in flight: mark_by_outputs then) */
    g_probe.store(0);
    t_probe = true;
    PyObject *r = PyObject_CallNoArgs(fn);
    t_probe = false;
    if (r == nullptr)
        return nullptr;
    Py_DECREF(r);
    int seen = g_probe.load();
    if (seen == 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(seen == 1);
}

static PyObject *Observer_mark_by_outputs(Observer *self, PyObject *unused) {
    /* where a raise is not seen as the op ends (torch 2.11's CUDA wheels end the record with no exception in
       flight): ask for every op's outputs, which an op that raised never gives; the callback is added again */
    g_by_outputs.store(true);
    State *s = self->s;
    if (s == nullptr || g_handle.load() == 0 || getpid() != g_handle_pid)
        Py_RETURN_NONE;
    try {
        at::removeCallback(g_handle.load());
        g_handle.store(add_callback(s));
        s->handle = g_handle.load();
    } catch (const std::exception &e) {
        PyErr_Format(PyExc_RuntimeError, "could not add the RecordFunction callback again: %s", e.what());
        return NULL;
    }
    Py_RETURN_NONE;
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
    {"mark_by_outputs", (PyCFunction)Observer_mark_by_outputs, METH_NOARGS,
     "mark an op raised when it ends without outputs (its outputs asked for)"},
    {"probe", (PyCFunction)Observer_probe, METH_O, "probe(fn) -> whether an op fn runs is seen to raise (None: no op ran)"},
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