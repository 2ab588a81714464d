/* What the parts of the launch module share: the driver's and DLPack's C types, the packed-word
 * reader, and the functions and state one part defines for the others. Each part is compiled on
 * its own and linked into one _launch.abi3.so; only PyInit__launch is exported (-fvisibility=hidden). */
#pragma once
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include "_protocol.h" /* the codes shared with the loader: written by tkc from _protocol.py */
#include <stdint.h>
#include <string.h>

/* CUresult cuLaunchKernel(CUfunction, gridDim x y z, blockDim x y z, sharedMemBytes, CUstream,
 *                         void **kernelParams, void **extra); CUkernel handles are accepted too. */
typedef int (*launch_kernel_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                void *, void **, void **);
/* CUresult cuCtxGetDevice(CUdevice *) */
typedef int (*ctx_get_device_fn)(int *);

/* cuLaunchKernelEx's CUlaunchAttribute and CUlaunchConfig (cuda.h, CUDA 12+): only the
 * cooperative attribute is set here; clusters stay on _compiled.py's ctypes path. */
typedef struct {
    int id;
    char pad[4];
    uint32_t value[16];
} launch_attribute;
typedef struct {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
    void *stream;
    launch_attribute *attrs;
    unsigned num_attrs;
} launch_config;
/* CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **kernelParams, void **extra) */
typedef int (*launch_kernel_ex_fn)(const launch_config *, void *, void **, void **);
#define CU_LAUNCH_ATTRIBUTE_COOPERATIVE 2

extern launch_kernel_fn cu_launch_kernel;
extern ctx_get_device_fn cu_ctx_get_device;
extern launch_kernel_ex_fn cu_launch_kernel_ex;

/* Returned instead of a CUresult when the calling thread's current context belongs to another
 * device than the tensors: the loader (_runtime.Function) then makes the tensors' device current and retries. */
#define WRONG_DEVICE (-1)
#define MAX_ARGS 64

/* DLPack's C ABI (dlpack.h, the unversioned DLManagedTensor that torch._C._to_dlpack returns
 * in a capsule named "dltensor"); only the fields read here matter, their layout is fixed. */
typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* torch always fills them; NULL would mean row-major */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *);
} DLManagedTensor;

extern PyObject *to_dlpack; /* torch._C._to_dlpack, set by set_dlpack() */

/* DLPack's C exchange API (dlpack.h 1.2 and later), only the entries used here; the header's
 * layout is fixed across DLPack 1.x, and set_exchange() refuses another major version. */
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;
typedef struct {
    DLPackVersion version;
    void *prev_api;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    /* Fills a caller-owned DLTensor whose shape and strides point into the tensor: valid until
     * control returns to Python, which is all check(), run() and dispatch() need. 0, or -1 with
     * a Python error set. */
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    /* The framework's current stream on a device (torch.cuda.current_stream's). 0 or -1. */
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} DLPackExchangeAPI;

extern PyObject *exchange_type;            /* the type the API was read from (torch.Tensor), or NULL */
extern const DLPackExchangeAPI *exchange; /* set by set_exchange(); NULL: _to_dlpack only */
extern PyObject *stream_getter;           /* torch._C._cuda_getCurrentRawStream, set by set_stream() */
extern PyObject *allocator;               /* torch.empty, set by set_allocator() */

#define MAX_TENSORS 32
#define MAX_SIZES 32
#define MAX_STACK 16

/* Reads words from the packed contract; every read is bounds-checked, so a malformed contract
 * makes check() decline instead of reading past the buffer. */
typedef struct {
    const int64_t *word;
    Py_ssize_t left;
} Reader;

/* One tensor read for check(), run() or dispatch(): a DLTensor filled in place by the exchange
 * API (capsule NULL), or one owned by the _to_dlpack capsule (dropped by release()). */
typedef struct {
    DLTensor view;
    PyObject *capsule;
} Exported;

/* The kernel arguments (_launch_kernel.c). */
int pack_integer(char kind, int64_t v, uint64_t *slot);
int pack(char kind, PyObject *value, uint64_t *slot, void **param, Py_ssize_t index);
int launch_on(int device, void *kernel, const unsigned grid[3], const unsigned block[3], unsigned shared,
              void *stream, void **params, int cooperative);

/* The packed words and the tensors (_launch_check.c); next() inline: it reads every word. */
static inline int next(Reader *r, int64_t *out) {
    if (r->left <= 0) return -1;
    *out = *r->word++;
    r->left--;
    return 0;
}

int eval(Reader *r, const int64_t *sizes, int64_t n_sizes, int64_t *out);
int matches(const int64_t *words, Py_ssize_t n_words, DLTensor *const *tensors, Py_ssize_t n_tensors,
            int64_t *sizes, int64_t *n_sizes_out);
Py_ssize_t export_tensors(PyObject *const *objects, const Py_ssize_t *positions, Py_ssize_t n, Exported *exports,
                          DLTensor **tensors);
void release(Exported *exports, Py_ssize_t held);
static inline uintptr_t address_of(const DLTensor *t) { return (uintptr_t)t->data + (uintptr_t)t->byte_offset; }

/* The planned launch (_launch_run.c). */
int run_arguments(PyObject *contract_bytes, PyObject *plan_bytes, PyObject *handles, PyObject *const *arguments,
                  Py_ssize_t n_arguments, DLTensor *const *known, Reader *rules);

/* The module's functions, one part each; _launch.c puts them in its method table. */
PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *launch_cooperative(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *check(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dlpack_dtype(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dispatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dispatch_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
