/* The calling thread's Python frames, read without the GIL (for observer.cpp).

   Why without the GIL: the observer runs inside every op, and most ops are entered after the binding released
   the GIL; taking it back for each op's call site would make the program wait for any other Python thread that
   holds it (up to the 5 ms switch interval per op). A thread's own frame stack only changes when that thread
   runs bytecode, which it cannot do while it is inside the op, and each frame holds a strong reference to its
   code object, so the walk reads stable memory. This is what py-spy does from outside; the layouts are
   CPython's internal ones (Py_BUILD_CORE), checked per version at compile time. */
#define Py_BUILD_CORE 1
#include <Python.h>
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#include <internal/pycore_frame.h>
#define GPULAB_FRAMES_SUPPORTED 1
#else
#define GPULAB_FRAMES_SUPPORTED 0
#endif

/* 1 if this Python can be walked without the GIL */
int gpulab_frames_supported(void) {
    return GPULAB_FRAMES_SUPPORTED;
}

/* Fill codes[i] (borrowed PyCodeObject*) and lastis[i] (the byte offset PyCode_Addr2Line takes) for up to
   max frames of the calling thread, innermost first; -> how many (0: no Python frames or not supported). */
int gpulab_frames(void **codes, int *lastis, int max) {
#if GPULAB_FRAMES_SUPPORTED
    PyThreadState *ts = PyGILState_GetThisThreadState();
    if (ts == NULL)
        return 0;
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
#else
    if (ts->cframe == NULL)
        return 0;
    _PyInterpreterFrame *f = ts->cframe->current_frame;
#endif
    int n = 0;
    while (f != NULL && n < max) {
#if PY_VERSION_HEX >= 0x030C0000
        if (f->owner == FRAME_OWNED_BY_CSTACK) {   /* a shim frame of the interpreter, no code of its own */
            f = f->previous;
            continue;
        }
#endif
        if (!_PyFrame_IsIncomplete(f)) {
#if PY_VERSION_HEX >= 0x030D0000
            PyObject *code = f->f_executable;
            if (code == NULL || !PyCode_Check(code)) {
                f = f->previous;
                continue;
            }
#else
            PyObject *code = (PyObject *)f->f_code;
#endif
            codes[n] = code;
            lastis[n] = _PyInterpreterFrame_LASTI(f) * (int)sizeof(_Py_CODEUNIT);
            n++;
        }
        f = f->previous;
    }
    return n;
#else
    (void)codes; (void)lastis; (void)max;
    return 0;
#endif
}
