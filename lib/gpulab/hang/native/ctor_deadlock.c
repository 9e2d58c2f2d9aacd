/* A shared library whose static initializer deadlocks: the constructor runs inside dlopen
 * (_dl_init -> call_init), locks a non-recursive mutex and then locks it again. Loading it hangs the
 * loading thread forever, exactly like a real extension whose initializer waits on a lock it holds.
 * Built on the fly by gpulab.faults.build_library() with the system C compiler. */
#include <pthread.h>

static pthread_mutex_t gpulab_init_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void gpulab_ctor_deadlock(void) {
    pthread_mutex_lock(&gpulab_init_lock);
    pthread_mutex_lock(&gpulab_init_lock); /* never returns */
}

int gpulab_ctor_loaded(void) { return 1; }
