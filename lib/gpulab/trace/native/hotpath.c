/* The recorder's hot path in C (optional; gpulab.trace.native builds it on first use).

   Why: in a TorchDispatchMode every Python operation runs with cold caches (the dispatcher ran between two
   ops), ~0.1-0.2 us each on a slow host, and the pure-Python hot path needs ~60 of them. Here one call
   writes and commits an op's slot, one call marks it returned. Only the Python C API is used (no torch
   headers): tensor metadata is read through the same attributes the Python path reads, and every miss
   (a new op, call site, thread or argument signature) is handed back to the Python callbacks, which own
   the string table and the caches this code reads (plain dicts shared with the Python path).

   Slot layout (gpulab.trace.ring._SLOT, little endian): seq q | t_start d | t_end d | name site args thread
   (u32 string ids) | stream h | depth b | kind b | flags B. The seq is written last with release order,
   so a reader in another process never accepts a half-written slot (also on weakly ordered CPUs).

   GPU progress (modes auto and gpu, gpulab.trace.gpu): once the recorder chose a mechanism, `gpu_start`
   hands over the driver's entry points and end() enqueues the op's completion marker on its stream before
   it marks the op returned: a stream memory op writing the seq into the log's GPU page, or a CUDA event
   from the stream's own pool. Events are polled by a native thread (no GIL, no Python): per stream the
   newest event first, else a binary search for the last completed one (a stream completes in order), so
   a poll costs O(log pending) queries and never competes with the program for the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpumark.h"

#if PY_VERSION_HEX < 0x030B0000
#error "the native hot path needs Python >= 3.11 (PyFrame_GetLasti)"
#endif

#define MAX_KEY 64
#define NAME_CACHE 512
#define SITE_CACHE 1024
#define F_RAISED 2

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    char *base;
    Py_ssize_t slots_off, cap, slot_size, off_started, off_completed;
    long long seq, done;
    int skip;
    PyObject *tensor_t, *param_t, *scalar_cls;
    PyObject *names, *threads, *codes, *cache, *depths;      /* dicts shared with the Python side */
    PyObject *on_name, *on_thread, *on_code, *on_site, *on_args, *on_miss;
    PyObject *nomark;                                         /* ops that enqueue no GPU work (a set), or NULL */
    PyObject *walk_f, *walk_u, *walk_d;                       /* owned, or NULL */
    unsigned long last_tid;
    long last_tid_sid;
    unsigned long gen;                                        /* bumped by forget(): cached ids went stale */
    PyObject *s_dtype, *s_shape, *s_stride, *s_device;
    PyObject *getframe, *skip_obj;                            /* sys._getframe, skip as an int */
    struct { void *func; long sid; int nomark; } name_cache[NAME_CACHE];  /* direct-mapped: op -> name id */
    struct { void *code; int lasti; long sid; } site_cache[SITE_CACHE];
    struct Gpu *gpu;                                          /* NULL until gpu_start */
} Hot;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void forget_walk(Hot *self) {
    self->gen++;
    Py_CLEAR(self->walk_f);
    Py_CLEAR(self->walk_u);
    Py_CLEAR(self->walk_d);
    self->last_tid = 0;
    self->last_tid_sid = -1;
    memset(self->name_cache, 0, sizeof(self->name_cache));
    memset(self->site_cache, 0, sizeof(self->site_cache));
}

/* value of dict[key], or cb(arg)'s result on a miss; a new reference (NULL on error) */
static PyObject *lookup_or_call(PyObject *dict, PyObject *key, PyObject *cb, PyObject *arg) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v != NULL) {
        Py_INCREF(v);
        return v;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(cb, arg);
}

static long id_of(PyObject *dict, PyObject *obj, PyObject *cb) {
    PyObject *key = PyLong_FromVoidPtr(obj);
    if (!key)
        return -1;
    PyObject *v = lookup_or_call(dict, key, cb, obj);
    Py_DECREF(key);
    if (!v)
        return -1;
    long r = PyLong_AsLong(v);
    Py_DECREF(v);
    return r;
}

/* the op's name id; *nomark: it enqueues no GPU work (a view, an allocation), so it needs no GPU marker */
static long name_sid(Hot *self, PyObject *func, int *nomark) {
    size_t h = ((uintptr_t)func >> 4) % NAME_CACHE;
    if (self->name_cache[h].func == (void *)func) {
        *nomark = self->name_cache[h].nomark;
        return self->name_cache[h].sid;
    }
    long r = id_of(self->names, func, self->on_name);   /* on_name also files the op in `nomark` */
    if (r < 0)
        return r;
    int nm = self->nomark ? PySet_Contains(self->nomark, func) : 0;
    if (nm < 0)
        return -1;
    *nomark = nm;
    /* the op object is kept alive by the Python side (its id stays unique) */
    self->name_cache[h].func = (void *)func;
    self->name_cache[h].sid = r;
    self->name_cache[h].nomark = nm;
    return r;
}

static long thread_sid(Hot *self, unsigned long tid) {
    if (tid == self->last_tid && self->last_tid_sid >= 0)
        return self->last_tid_sid;
    PyObject *key = PyLong_FromUnsignedLong(tid);
    if (!key)
        return -1;
    PyObject *v = lookup_or_call(self->threads, key, self->on_thread, key);
    Py_DECREF(key);
    if (!v)
        return -1;
    long r = PyLong_AsLong(v);
    Py_DECREF(v);
    if (r >= 0) {
        self->last_tid = tid;
        self->last_tid_sid = r;
    }
    return r;
}

/* the call site's string id: innermost frame outside torch and the recorder (see recorder.code_kind) */
static long site_sid(Hot *self) {
    /* sys._getframe(skip) from __torch_dispatch__: only the caller's frame object is made (walking with
       PyFrame_GetBack would make one for each torch wrapper frame in between, on every op) */
    PyFrameObject *f = (PyFrameObject *)PyObject_CallOneArg(self->getframe, self->skip_obj);
    if (f == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
        return 0;  /* a native thread (autograd engine worker): no Python caller */
    }
    PyObject *u, *d;
    if ((PyObject *)f == self->walk_f) {
        u = self->walk_u;
        d = self->walk_d;
        Py_XINCREF(u);
        Py_XINCREF(d);
    } else {
        PyFrameObject *cur = f;
        Py_INCREF(cur);
        d = NULL;
        while (cur != NULL) {
            PyCodeObject *code = PyFrame_GetCode(cur);
            PyObject *key = PyLong_FromVoidPtr(code);
            PyObject *v = key ? lookup_or_call(self->codes, key, self->on_code, (PyObject *)code) : NULL;
            Py_XDECREF(key);
            Py_DECREF(code);
            if (!v) {
                Py_DECREF(cur);
                Py_DECREF(f);
                return -1;
            }
            if (v != Py_True) {
                d = v;
                break;
            }
            Py_DECREF(v);
            PyFrameObject *b = PyFrame_GetBack(cur);
            Py_DECREF(cur);
            cur = b;
        }
        u = (PyObject *)cur;  /* owned or NULL */
        PyObject *of = self->walk_f, *ou = self->walk_u, *od = self->walk_d;
        Py_INCREF(f);
        self->walk_f = (PyObject *)f;
        Py_XINCREF(u);
        self->walk_u = u;
        Py_XINCREF(d);
        self->walk_d = d;
        Py_XDECREF(of);
        Py_XDECREF(ou);
        Py_XDECREF(od);
    }
    Py_DECREF(f);
    if (u == NULL) {
        Py_XDECREF(d);
        return 0;
    }
    int li = PyFrame_GetLasti((PyFrameObject *)u);
    PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)u);
    size_t h = (((uintptr_t)code >> 4) ^ ((size_t)li * 2654435761u)) % SITE_CACHE;
    Py_DECREF(code);   /* the Python side keeps every user code object alive (its id stays unique) */
    if (self->site_cache[h].code == (void *)code && self->site_cache[h].lasti == li) {
        Py_DECREF(u);
        Py_DECREF(d);
        return self->site_cache[h].sid;
    }
    long r = -1;
    PyObject *lasti = PyLong_FromLong(li);
    if (lasti) {
        PyObject *v = PyDict_GetItemWithError(d, lasti);
        if (v) {
            r = PyLong_AsLong(v);
        } else if (!PyErr_Occurred()) {
            v = PyObject_CallFunctionObjArgs(self->on_site, u, d, lasti, NULL);
            if (v) {
                r = PyLong_AsLong(v);
                Py_DECREF(v);
            }
        }
        Py_DECREF(lasti);
    }
    if (r >= 0) {
        self->site_cache[h].code = (void *)code;
        self->site_cache[h].lasti = li;
        self->site_cache[h].sid = r;
    }
    Py_DECREF(u);
    Py_DECREF(d);
    return r;
}

/* the argument summary's (string id, device) from the signature cache; 0 on success */
static int args_sig(Hot *self, PyObject *args, long *aid, long *dev) {
    PyObject *items[MAX_KEY];
    int n = 0, slow = 0;
    Py_ssize_t na = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; i < na && !slow; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        PyTypeObject *t = Py_TYPE(a);
        if ((PyObject *)t == self->tensor_t || (PyObject *)t == self->param_t) {
            if (n + 4 > MAX_KEY) { slow = 1; break; }
            PyObject *dt = PyObject_GetAttr(a, self->s_dtype);
            PyObject *sh = dt ? PyObject_GetAttr(a, self->s_shape) : NULL;
            PyObject *st = sh ? PyObject_CallMethodNoArgs(a, self->s_stride) : NULL;
            PyObject *dv = st ? PyObject_GetAttr(a, self->s_device) : NULL;
            if (!dv) {
                Py_XDECREF(dt); Py_XDECREF(sh); Py_XDECREF(st);
                PyErr_Clear();
                slow = 1;
                break;
            }
            items[n++] = dt; items[n++] = sh; items[n++] = st; items[n++] = dv;
        } else if (n + 2 > MAX_KEY) {
            slow = 1;
        } else {
            int sc = PySet_Contains(self->scalar_cls, (PyObject *)t);
            if (sc < 0) { PyErr_Clear(); slow = 1; break; }
            if (sc || (t == &PyFloat_Type && PyFloat_AS_DOUBLE(a) != 0.0)) {
                Py_INCREF(t); Py_INCREF(a);
                items[n++] = (PyObject *)t; items[n++] = a;
            } else if ((t == &PyList_Type || t == &PyTuple_Type) &&
                       (PySequence_Fast_GET_SIZE(a) == 0 || PyLong_CheckExact(PySequence_Fast_GET_ITEM(a, 0)))) {
                PyObject *tup = PySequence_Tuple(a);
                if (!tup) { PyErr_Clear(); slow = 1; break; }
                Py_INCREF(t);
                items[n++] = (PyObject *)t; items[n++] = tup;
            } else {
                slow = 1;
            }
        }
    }
    PyObject *v = NULL;
    if (!slow) {
        PyObject *key = PyTuple_New(n);
        if (!key) { for (int j = 0; j < n; j++) Py_DECREF(items[j]); return -1; }
        for (int j = 0; j < n; j++) PyTuple_SET_ITEM(key, j, items[j]);  /* steals */
        v = PyDict_GetItemWithError(self->cache, key);
        if (v) {
            Py_INCREF(v);
        } else if (PyErr_Occurred()) {   /* an unhashable item (a symbolic int): the per-arg path */
            PyErr_Clear();
            slow = 1;
        } else {
            v = PyObject_CallFunctionObjArgs(self->on_miss, args, key, NULL);
            if (!v) { Py_DECREF(key); return -1; }
        }
        Py_DECREF(key);
    } else {
        for (int j = 0; j < n; j++) Py_DECREF(items[j]);
    }
    if (slow) {
        v = PyObject_CallOneArg(self->on_args, args);
        if (!v) return -1;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
        Py_DECREF(v);
        PyErr_SetString(PyExc_TypeError, "argument signature callbacks must return (string id, device)");
        return -1;
    }
    *aid = PyLong_AsLong(PyTuple_GET_ITEM(v, 0));
    *dev = PyLong_AsLong(PyTuple_GET_ITEM(v, 1));
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

static inline char *slot_of(Hot *self, long long seq) {
    return self->base + self->slots_off + (seq % self->cap) * self->slot_size;
}

static PyObject *Hot_begin(Hot *self, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "begin(func, args: tuple)");
        return NULL;
    }
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "the hot path was released");
        return NULL;
    }
    long long seq = self->seq++;
    unsigned long tid = PyThread_get_thread_ident();
    long tsid, nsid, ssid, aid = 0, dev = -2;
    int nomark = 0;
    for (int tries = 0; tries < 3; tries++) {   /* again if the string table wrapped meanwhile */
        unsigned long gen = self->gen;
        tsid = thread_sid(self, tid);
        nsid = tsid < 0 ? -1 : name_sid(self, argv[0], &nomark);
        ssid = nsid < 0 ? -1 : site_sid(self);
        if (ssid < 0 || args_sig(self, argv[1], &aid, &dev) < 0)
            return NULL;
        if (gen == self->gen)
            break;
    }
    if (nomark)
        dev = -1;   /* no marker: its event would only repeat the previous op's (the stream completes in order) */
    long depth = 0;
    if (PyDict_GET_SIZE(self->depths)) {
        PyObject *key = PyLong_FromUnsignedLong(tid);
        PyObject *v = key ? PyDict_GetItemWithError(self->depths, key) : NULL;
        Py_XDECREF(key);
        if (v)
            depth = PyLong_AsLong(v);
        if (PyErr_Occurred())
            return NULL;
    }
    char *s = slot_of(self, seq);
    __atomic_store_n((int64_t *)s, (int64_t)-1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);           /* -1 is seen before any other field changes */
    double t0 = now(), zero = 0.0;
    uint32_t ids[4] = {(uint32_t)nsid, (uint32_t)ssid, (uint32_t)aid, (uint32_t)tsid};
    int16_t stream = -1;
    int8_t small[2] = {(int8_t)depth, 0};
    uint8_t flags = 0;
    memcpy(s + 8, &t0, 8);
    memcpy(s + 16, &zero, 8);
    memcpy(s + 24, ids, 16);
    memcpy(s + 40, &stream, 2);
    memcpy(s + 42, small, 2);
    memcpy(s + 44, &flags, 1);
    __atomic_store_n((int64_t *)s, (int64_t)seq, __ATOMIC_RELEASE);   /* commit */
    __atomic_store_n((int64_t *)(self->base + self->off_started), (int64_t)(seq + 1), __ATOMIC_RELEASE);
    return PyLong_FromLongLong((seq << 8) | (long long)((dev + 2) & 0xFF));
}

static int finish(Hot *self, PyObject *arg, int raised) {
    long long r = PyLong_AsLongLong(arg);
    if (r == -1 && PyErr_Occurred())
        return -1;
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "the hot path was released");
        return -1;
    }
    char *s = slot_of(self, r >> 8);
    if (!raised && self->gpu && !__atomic_load_n(&self->gpu->disabled, __ATOMIC_RELAXED))
        gpu_mark(self->gpu, r >> 8, (long)(r & 0xFF) - 2, s, 0);
    double t1 = now();
    if (raised)
        s[44] = (char)(s[44] | F_RAISED);
    memcpy(s + 16, &t1, 8);
    __atomic_store_n((int64_t *)(self->base + self->off_completed), (int64_t)(++self->done), __ATOMIC_RELEASE);
    return 0;
}

static PyObject *Hot_end(Hot *self, PyObject *arg) {
    if (finish(self, arg, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Hot_fail(Hot *self, PyObject *arg) {
    if (finish(self, arg, 1) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Hot_next_seq(Hot *self, PyObject *unused) {
    return PyLong_FromLongLong(self->seq++);
}

static PyObject *Hot_next_done(Hot *self, PyObject *unused) {
    return PyLong_FromLongLong(++self->done);
}

static PyObject *Hot_gpu_start(Hot *self, PyObject *args, PyObject *kw) {
    if (self->gpu != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "GPU tracking already started");
        return NULL;
    }
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "the hot path was released");
        return NULL;
    }
    self->gpu = gpu_create(args, kw, self->base, self->view.len);
    if (self->gpu == NULL)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Hot_gpu_stop(Hot *self, PyObject *unused) {
    gpu_stop(self->gpu);
    Py_RETURN_NONE;
}

static PyObject *Hot_gpu_pending(Hot *self, PyObject *unused) {
    return PyLong_FromLongLong(gpu_pending(self->gpu));
}

static PyObject *Hot_gpu_state(Hot *self, PyObject *unused) {
    return gpu_state(self->gpu);
}

static PyObject *Hot_forget(Hot *self, PyObject *unused) {
    forget_walk(self);
    Py_RETURN_NONE;
}

static PyObject *Hot_set_skip(Hot *self, PyObject *arg) {
    /* the frames between __torch_dispatch__ and the op's caller changed (torch._dynamo was imported and the
       mode's method wrapped): sys._getframe(skip) must reach past them again */
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    PyObject *o = PyLong_FromLong(n);
    if (!o)
        return NULL;
    PyObject *old = self->skip_obj;
    self->skip_obj = o;
    Py_XDECREF(old);
    self->skip = (int)n;
    Py_RETURN_NONE;
}

static PyObject *Hot_release(Hot *self, PyObject *unused) {
    forget_walk(self);
    gpu_stop(self->gpu);   /* the poller writes into the buffer: stopped before it is released */
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
        self->base = NULL;
    }
    Py_RETURN_NONE;
}

static int Hot_traverse(Hot *self, visitproc visit, void *arg) {
    Py_VISIT(self->tensor_t); Py_VISIT(self->param_t); Py_VISIT(self->scalar_cls);
    Py_VISIT(self->names); Py_VISIT(self->threads); Py_VISIT(self->codes); Py_VISIT(self->cache);
    Py_VISIT(self->depths); Py_VISIT(self->on_name); Py_VISIT(self->on_thread); Py_VISIT(self->on_code);
    Py_VISIT(self->on_site); Py_VISIT(self->on_args); Py_VISIT(self->on_miss); Py_VISIT(self->nomark);
    Py_VISIT(self->walk_f); Py_VISIT(self->walk_u); Py_VISIT(self->walk_d);
    if (self->gpu) {
        Py_VISIT(self->gpu->raw_stream); Py_VISIT(self->gpu->get_device); Py_VISIT(self->gpu->capturing);
        Py_VISIT(self->gpu->on_stream); Py_VISIT(self->gpu->on_stop);
    }
    return 0;
}

static int Hot_clear(Hot *self) {
    forget_walk(self);
    gpu_free(self->gpu);
    self->gpu = NULL;
    Py_CLEAR(self->tensor_t); Py_CLEAR(self->param_t); Py_CLEAR(self->scalar_cls);
    Py_CLEAR(self->names); Py_CLEAR(self->threads); Py_CLEAR(self->codes); Py_CLEAR(self->cache);
    Py_CLEAR(self->depths); Py_CLEAR(self->on_name); Py_CLEAR(self->on_thread); Py_CLEAR(self->on_code);
    Py_CLEAR(self->on_site); Py_CLEAR(self->on_args); Py_CLEAR(self->on_miss); Py_CLEAR(self->nomark);
    Py_CLEAR(self->s_dtype); Py_CLEAR(self->s_shape); Py_CLEAR(self->s_stride); Py_CLEAR(self->s_device);
    Py_CLEAR(self->getframe); Py_CLEAR(self->skip_obj);
    return 0;
}

static void Hot_dealloc(Hot *self) {
    PyObject_GC_UnTrack(self);
    gpu_free(self->gpu);
    self->gpu = NULL;
    Hot_clear(self);
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Hot_init(Hot *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "slots_off", "capacity", "slot_size", "off_started", "off_completed",
                             "skip", "tensor_type", "parameter_type", "scalar_types", "names", "threads",
                             "codes", "cache", "depths", "on_name", "on_thread", "on_code", "on_site",
                             "on_args", "on_miss", "nomark", NULL};
    PyObject *buf, *o[14], *nomark = NULL;   /* borrowed until all parsed: a failed parse leaves nothing half-owned */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnnnnniOOOOOOOOOOOOOO|O", kwlist, &buf, &self->slots_off,
                                     &self->cap, &self->slot_size, &self->off_started, &self->off_completed,
                                     &self->skip, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                                     &o[9], &o[10], &o[11], &o[12], &o[13], &nomark))
        return -1;
    if (nomark != NULL && nomark != Py_None && !PyAnySet_Check(nomark)) {
        PyErr_SetString(PyExc_TypeError, "nomark must be a set");
        return -1;
    }
    Py_XSETREF(self->nomark, nomark == Py_None ? NULL : Py_XNewRef(nomark));
    PyObject **owned[] = {&self->tensor_t, &self->param_t, &self->scalar_cls, &self->names, &self->threads,
                          &self->codes, &self->cache, &self->depths, &self->on_name, &self->on_thread,
                          &self->on_code, &self->on_site, &self->on_args, &self->on_miss};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) {
        Py_INCREF(o[i]);
        Py_XSETREF(*owned[i], o[i]);
    }
    if (self->cap < 1 || self->slot_size < 48) {
        PyErr_SetString(PyExc_ValueError, "capacity must be >= 1 and slot_size >= 48");
        return -1;
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    self->base = (char *)self->view.buf;
    if (self->slots_off + self->cap * self->slot_size > self->view.len ||
        self->off_started + 8 > self->view.len || self->off_completed + 8 > self->view.len) {
        PyErr_SetString(PyExc_ValueError, "the buffer is smaller than the ring's layout");
        return -1;
    }
    self->last_tid_sid = -1;
    self->getframe = PySys_GetObject("_getframe");   /* borrowed */
    if (!self->getframe) {
        PyErr_SetString(PyExc_RuntimeError, "sys._getframe is missing");
        return -1;
    }
    Py_INCREF(self->getframe);
    self->skip_obj = PyLong_FromLong(self->skip);
    self->s_dtype = PyUnicode_InternFromString("dtype");
    self->s_shape = PyUnicode_InternFromString("shape");
    self->s_stride = PyUnicode_InternFromString("stride");
    self->s_device = PyUnicode_InternFromString("device");
    return self->s_device ? 0 : -1;
}

static PyMethodDef Hot_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))Hot_begin, METH_FASTCALL,
     "begin(func, args) -> seq << 8 | (device + 2): write and commit the op's slot"},
    {"end", (PyCFunction)Hot_end, METH_O, "end(token): the op returned"},
    {"fail", (PyCFunction)Hot_fail, METH_O, "fail(token): the op raised"},
    {"next_seq", (PyCFunction)Hot_next_seq, METH_NOARGS, "reserve a seq (composite records)"},
    {"next_done", (PyCFunction)Hot_next_done, METH_NOARGS, "count one completed record"},
    {"forget", (PyCFunction)Hot_forget, METH_NOARGS, "drop the cached frames and thread id"},
    {"set_skip", (PyCFunction)Hot_set_skip, METH_O, "set_skip(n): the caller is sys._getframe(n) from now on"},
    {"gpu_start", (PyCFunction)(void (*)(void))Hot_gpu_start, METH_VARARGS | METH_KEYWORDS,
     "gpu_start(kind, (emit, query, set_ctx, push_ctx, pop_ctx), raw_stream, get_device, capturing, on_stream, "
     "on_stop, page_off, stream_size, first_ctx, poll_us=2000, max_errors=100, mechanism_off=-1, capture_mode=0): "
     "end() marks GPU completion"},
    {"gpu_stop", (PyCFunction)Hot_gpu_stop, METH_NOARGS, "stop the event poller (after a last poll)"},
    {"gpu_pending", (PyCFunction)Hot_gpu_pending, METH_NOARGS, "events not yet seen complete"},
    {"gpu_state", (PyCFunction)Hot_gpu_state, METH_NOARGS, "GPU tracking's state as a dict (None: not started)"},
    {"release", (PyCFunction)Hot_release, METH_NOARGS, "release the buffer (the mmap can then close)"},
    {NULL}
};

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpulab_hotpath.Hot",
    .tp_basicsize = sizeof(Hot),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Hot_init,
    .tp_dealloc = (destructor)Hot_dealloc,
    .tp_traverse = (traverseproc)Hot_traverse,
    .tp_clear = (inquiry)Hot_clear,
    .tp_methods = Hot_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpulab_hotpath", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_gpulab_hotpath(void) {
    if (PyType_Ready(&HotType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&HotType);
    if (PyModule_AddObject(m, "Hot", (PyObject *)&HotType) < 0) {
        Py_DECREF(&HotType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
