/* launch() and launch_cooperative(): one kernel launch from Python, its arguments packed into
 * 8-byte slots on the stack; also the packing and the driver call that run() shares. */
#include "_launch.h"

launch_kernel_fn cu_launch_kernel;
ctx_get_device_fn cu_ctx_get_device;
launch_kernel_ex_fn cu_launch_kernel_ex;

PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(cuLaunchKernel address, cuCtxGetDevice address, cuLaunchKernelEx address)");
        return NULL;
    }
    void *launch = PyLong_AsVoidPtr(args[0]);
    void *get_device = PyLong_AsVoidPtr(args[1]);
    void *launch_ex = PyLong_AsVoidPtr(args[2]);
    if (PyErr_Occurred()) return NULL;
    cu_launch_kernel = (launch_kernel_fn)launch;
    cu_ctx_get_device = (ctx_get_device_fn)get_device;
    cu_launch_kernel_ex = (launch_kernel_ex_fn)launch_ex;
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

/* Writes a signed integer into its 8-byte slot as an int64 ('q') or, within its range, an int32
 * ('i') or uint32 ('I'); -1 where it does not fit. */
int pack_integer(char kind, int64_t v, uint64_t *slot) {
    if (kind == 'q') {
        memcpy(slot, &v, 8);
        return 0;
    }
    if (kind == 'i' ? (v < INT32_MIN || v > INT32_MAX) : (v < 0 || v > UINT32_MAX)) return -1;
    uint32_t bits = (uint32_t)v;
    memcpy(slot, &bits, 4);
    return 0;
}

/* Writes one argument into its 8-byte slot; the format letters are struct's. */
int pack(char kind, PyObject *value, uint64_t *slot, void **param, Py_ssize_t index) {
    *param = slot;
    *slot = 0; /* the bytes a 4-byte value leaves are zero, not stack leftovers */
    switch (kind) {
    case 'Q': { /* a device pointer or a uint64 */
        unsigned long long v = PyLong_AsUnsignedLongLong(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *slot = v;
        return 0;
    }
    case 'q': case 'i': case 'I': {
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (pack_integer(kind, v, slot)) {
            PyErr_Format(PyExc_OverflowError, "kernel argument %zd = %lld does not fit its %s parameter", index,
                         v, kind == 'i' ? "int32" : "uint32");
            return -1;
        }
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

/* The driver call of launch() and run(): the CUresult, or WRONG_DEVICE without launching.
 * The launch goes to the calling thread's current context; a context of another device (or none
 * yet: the driver then says CUDA_ERROR_INVALID_CONTEXT) is for the caller to fix. cooperative:
 * through cuLaunchKernelEx with the cooperative attribute (a kernel with a grid-wide barrier). */
int launch_on(int device, void *kernel, const unsigned grid[3], const unsigned block[3], unsigned shared,
                     void *stream, void **params, int cooperative) {
    int current;
    if (cu_ctx_get_device(&current) == 0 && current != device) return WRONG_DEVICE;
    if (cooperative) {
        launch_attribute attribute = {CU_LAUNCH_ATTRIBUTE_COOPERATIVE, {0}, {1}};
        launch_config config = {{grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, shared, stream,
                                &attribute, 1};
        return cu_launch_kernel_ex(&config, kernel, params, NULL);
    }
    return cu_launch_kernel(kernel, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, params,
                            NULL);
}

/* launch(kernel, device, grid, block, shared_bytes, stream, kinds, *values) -> CUresult or WRONG_DEVICE
 *
 * kernel: a CUkernel (or CUfunction) handle as int; device: the tensors' device ordinal;
 * grid, block: 3-tuples; kinds: bytes, one struct letter per value (Q q i I f d, T for a
 * tensor map's address). The driver copies the arguments during the call, so the stack
 * buffer may go when it returns. cooperative: through cuLaunchKernelEx with the cooperative
 * attribute (a kernel with a grid-wide barrier), else cuLaunchKernel. */
static PyObject *launch_with(PyObject *const *args, Py_ssize_t nargs, int cooperative) {
    if (cu_launch_kernel == NULL || cu_launch_kernel_ex == NULL) {
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
    return PyLong_FromLong(launch_on((int)device, kernel, grid, block, (unsigned)shared, stream, params, cooperative));
}

PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return launch_with(args, nargs, 0);
}

PyObject *launch_cooperative(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return launch_with(args, nargs, 1);
}
