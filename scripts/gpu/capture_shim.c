/* Logs every CUDA stream capture a process starts or ends, and every failing
 * cudaDeviceSynchronize, with the calling thread and library: for finding which thread
 * captures a stream when ONNX Runtime's IoBinding fails with "operation not permitted when
 * stream is capturing" (scripts/gpu/gpu_kv_cache.sh, step race). LD_PRELOAD it; it forwards
 * each call to the CUDA runtime loaded after it. Only calls that go through the dynamic
 * runtime are seen (a library with the runtime linked in statically is not).
 * Build: cc -shared -fPIC -O1 -o capture_shim.so scripts/gpu/capture_shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* cudaErrorUnknown, when no CUDA runtime is loaded yet. */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void report(const char *what, void *caller, long arg, int rc) {
  Dl_info info;
  const char *lib = "?", *sym = "?";
  if (dladdr(caller, &info)) {
    if (info.dli_fname) lib = info.dli_fname;
    if (info.dli_sname) sym = info.dli_sname;
  }
  fprintf(stderr, "capture_shim %.6f tid %ld %s(%ld) = %d from %s (%s)\n", now(),
          (long)syscall(SYS_gettid), what, arg, rc, lib, sym);
}

/* The runtime is usually loaded locally by ONNX Runtime's CUDA provider, out of RTLD_NEXT's
 * reach: then it is looked up by its soname among the loaded libraries. */
static void *next(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f) {
    void *h = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen("libcudart.so.12", RTLD_LAZY | RTLD_NOLOAD);
    if (h) f = dlsym(h, name);
  }
  return f;
}

int cudaStreamBeginCapture(void *stream, int mode) {
  int (*real)(void *, int) = next("cudaStreamBeginCapture");
  if (!real) return 999;
  int rc = real(stream, mode);
  report("cudaStreamBeginCapture", __builtin_return_address(0), mode, rc);
  return rc;
}

int cudaStreamEndCapture(void *stream, void **graph) {
  int (*real)(void *, void **) = next("cudaStreamEndCapture");
  if (!real) return 999;
  int rc = real(stream, graph);
  report("cudaStreamEndCapture", __builtin_return_address(0), 0, rc);
  return rc;
}

int cudaDeviceSynchronize(void) {
  int (*real)(void) = next("cudaDeviceSynchronize");
  if (!real) return 999;
  int rc = real();
  if (rc != 0) report("cudaDeviceSynchronize", __builtin_return_address(0), 0, rc);
  return rc;
}
