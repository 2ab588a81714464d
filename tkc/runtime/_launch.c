/* The launch fast path of the generated loader: one C call from Python to cuLaunchKernel.
 *
 * Compiled by tkc into every package it can (_launch.abi3.so, CPython's stable ABI, so one
 * build serves Python 3.10 and later) and shipped next to this source. _runtime.py calls
 * launch() for every plain kernel launch and falls back to an equivalent ctypes path when
 * the module is missing. Through ctypes a launch costs a foreign call with 11 converted
 * arguments plus a struct.pack_into of the kernel's arguments; here it is one METH_FASTCALL
 * call that writes the arguments into a stack buffer.
 *
 * The module links against nothing but Python: _runtime.py loads libcuda.so.1 and hands
 * over the addresses of the two driver entry points (bind()), so neither CUDA headers nor
 * a CUDA toolkit are needed to build it, and no second copy of the driver is opened.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* CUresult cuLaunchKernel(CUfunction, gridDim x y z, blockDim x y z, sharedMemBytes, CUstream,
 *                         void **kernelParams, void **extra); CUkernel handles are accepted too. */
typedef int (*launch_kernel_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                void *, void **, void **);
/* CUresult cuCtxGetDevice(CUdevice *) */
typedef int (*ctx_get_device_fn)(int *);

static launch_kernel_fn cu_launch_kernel;
static ctx_get_device_fn cu_ctx_get_device;

/* Returned instead of a CUresult when the calling thread's current context belongs to another
 * device than the tensors: _runtime.py then makes the tensors' device current and retries. */
#define WRONG_DEVICE (-1)
#define MAX_ARGS 64

static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "bind(cuLaunchKernel address, cuCtxGetDevice address)");
        return NULL;
    }
    void *launch = PyLong_AsVoidPtr(args[0]);
    void *get_device = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred()) return NULL;
    cu_launch_kernel = (launch_kernel_fn)launch;
    cu_ctx_get_device = (ctx_get_device_fn)get_device;
    Py_RETURN_NONE;
}

/* Reads three unsigned ints from a tuple (the grid or the block). */
static int dims(PyObject *tuple, const char *what, unsigned out[3]) {
    if (!PyTuple_Check(tuple) || PyTuple_Size(tuple) != 3) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of 3 ints", what);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GetItem(tuple, i));
        if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
        if (v > 0xFFFFFFFFul) {
            PyErr_Format(PyExc_OverflowError, "%s dimension %d = %lu does not fit 32 bits", what, i, v);
            return -1;
        }
        out[i] = (unsigned)v;
    }
    return 0;
}

/* Writes one argument into its 8-byte slot; the format letters are struct's. */
static int pack(char kind, PyObject *value, uint64_t *slot, void **param, Py_ssize_t index) {
    *param = slot;
    switch (kind) {
    case 'Q': { /* a device pointer or a uint64 */
        unsigned long long v = PyLong_AsUnsignedLongLong(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *slot = v;
        return 0;
    }
    case 'q': {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred()) return -1;
        memcpy(slot, &v, 8);
        return 0;
    }
    case 'i': case 'I': {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (kind == 'i' ? (v < INT32_MIN || v > INT32_MAX) : (v < 0 || v > UINT32_MAX)) {
            PyErr_Format(PyExc_OverflowError, "kernel argument %zd = %lld does not fit its %s parameter", index,
                         v, kind == 'i' ? "int32" : "uint32");
            return -1;
        }
        uint32_t bits = (uint32_t)v;
        memcpy(slot, &bits, 4);
        return 0;
    }
    case 'f': case 'd': {
        double v = PyFloat_AsDouble(value);
        if (v == -1.0 && PyErr_Occurred()) return -1;
        if (kind == 'f') {
            float f = (float)v;
            memcpy(slot, &f, 4);
        } else {
            memcpy(slot, &v, 8);
        }
        return 0;
    }
    case 'T': { /* a CUtensorMap: the parameter is the address of its aligned 128-byte descriptor */
        void *address = PyLong_AsVoidPtr(value);
        if (address == NULL && PyErr_Occurred()) return -1;
        *param = address;
        return 0;
    }
    default:
        PyErr_Format(PyExc_ValueError, "unknown kernel argument kind %c", kind);
        return -1;
    }
}

/* launch(kernel, device, grid, block, shared_bytes, stream, kinds, *values) -> CUresult or WRONG_DEVICE
 *
 * kernel: a CUkernel (or CUfunction) handle as int; device: the tensors' device ordinal;
 * grid, block: 3-tuples; kinds: bytes, one struct letter per value (Q q i I f d, T for a
 * tensor map's address). The driver copies the arguments during the call, so the stack
 * buffer may go when it returns. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (cu_launch_kernel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch() before bind(): the driver is not loaded");
        return NULL;
    }
    if (nargs < 7) {
        PyErr_SetString(PyExc_TypeError, "launch(kernel, device, grid, block, shared_bytes, stream, kinds, *values)");
        return NULL;
    }
    void *kernel = PyLong_AsVoidPtr(args[0]);
    long device = PyLong_AsLong(args[1]);
    unsigned long shared = PyLong_AsUnsignedLong(args[4]);
    void *stream = PyLong_AsVoidPtr(args[5]);
    if (PyErr_Occurred()) return NULL;
    unsigned grid[3], block[3];
    if (dims(args[2], "grid", grid) || dims(args[3], "block", block)) return NULL;
    char *kinds;
    Py_ssize_t count;
    if (PyBytes_AsStringAndSize(args[6], &kinds, &count)) return NULL;
    if (count != nargs - 7 || count > MAX_ARGS) {
        PyErr_Format(PyExc_TypeError, "launch() got %zd kernel arguments for %zd kinds (at most %d)", nargs - 7,
                     count, MAX_ARGS);
        return NULL;
    }
    uint64_t slots[MAX_ARGS];
    void *params[MAX_ARGS];
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pack(kinds[i], args[7 + i], &slots[i], &params[i], i)) return NULL;
    }
    /* The launch goes to the calling thread's current context; a context of another device
     * (or none yet: the driver then says CUDA_ERROR_INVALID_CONTEXT) is for the caller to fix. */
    int current;
    if (cu_ctx_get_device(&current) == 0 && current != device) return PyLong_FromLong(WRONG_DEVICE);
    int result = cu_launch_kernel(kernel, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                  (unsigned)shared, stream, params, NULL);
    return PyLong_FromLong(result);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(cuLaunchKernel address, cuCtxGetDevice address): the driver entry points launch() calls."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(kernel, device, grid, block, shared_bytes, stream, kinds, *values) -> CUresult, or -1 when "
     "the current context is another device's."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", "cuLaunchKernel in one C call.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
