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
 *
 * check() is the other half of a launcher's cost: validating the tensors against the
 * contract TileLang lowered. In Python that is about fifteen torch metadata calls per launch;
 * here each tensor is read as one DLTensor (DLPack's stable C ABI: data pointer, device, dtype,
 * shape and strides in one struct) and compared with a contract that _runtime.contract()
 * packed once per variant at import. check() only ever accepts: on anything it does not like
 * it returns None and the launcher's Python checks decide, and raise errors that name the
 * argument.
 *
 * The DLTensor comes from torch's DLPack C exchange API where this torch has one
 * (Tensor.__dlpack_c_exchange_api__, DLPack 1.2 and later: a C function that fills a DLTensor
 * on our stack, no Python call, no allocation), else from torch._C._to_dlpack (a Python call
 * that allocates a managed tensor and its capsule, about 0.3 us on an H200 host).
 *
 * run() is both in one call, and what the generated launchers try first: check(), then the
 * grid, the kernel arguments and the launch as _runtime.plan() packed them once per variant.
 * Reading check()'s results back into Python, building the grid and argument tuples and
 * calling launch() cost about as much as the check itself.
 */
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
 * cooperative attribute is set here; clusters stay on _runtime.py's ctypes path. */
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

static launch_kernel_fn cu_launch_kernel;
static ctx_get_device_fn cu_ctx_get_device;
static launch_kernel_ex_fn cu_launch_kernel_ex;

/* Returned instead of a CUresult when the calling thread's current context belongs to another
 * device than the tensors: _runtime.py then makes the tensors' device current and retries. */
#define WRONG_DEVICE (-1)
#define MAX_ARGS 64

static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
static int pack_integer(char kind, int64_t v, uint64_t *slot) {
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
static int pack(char kind, PyObject *value, uint64_t *slot, void **param, Py_ssize_t index) {
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
static int launch_on(int device, void *kernel, const unsigned grid[3], const unsigned block[3], unsigned shared,
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

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return launch_with(args, nargs, 0);
}

static PyObject *launch_cooperative(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return launch_with(args, nargs, 1);
}

/* ---- check(): the tensors against the lowered contract, through DLPack ------------------ */

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

static PyObject *to_dlpack; /* torch._C._to_dlpack, set by set_dlpack() */

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

static PyObject *exchange_type;            /* the type the API was read from (torch.Tensor), or NULL */
static const DLPackExchangeAPI *exchange; /* set by set_exchange(); NULL: _to_dlpack only */

#define MAX_TENSORS 32
#define MAX_SIZES 32
#define MAX_STACK 16

/* Reads words from the packed contract; every read is bounds-checked, so a malformed contract
 * makes check() decline instead of reading past the buffer. */
typedef struct {
    const int64_t *word;
    Py_ssize_t left;
} Reader;

static int next(Reader *r, int64_t *out) {
    if (r->left <= 0) return -1;
    *out = *r->word++;
    r->left--;
    return 0;
}

/* Evaluates one expression (Python semantics for // and %) over the bound sizes. */
static int eval(Reader *r, const int64_t *sizes, int64_t n_sizes, int64_t *out) {
    int64_t count, stack[MAX_STACK];
    int depth = 0;
    if (next(r, &count) || count < 1) return -1;
    for (int64_t i = 0; i < count; i++) {
        int64_t op, arg;
        if (next(r, &op) || next(r, &arg)) return -1;
        if (op == OP_CONST || op == OP_SIZE) {
            if (depth == MAX_STACK || (op == OP_SIZE && (arg < 0 || arg >= n_sizes))) return -1;
            stack[depth++] = op == OP_CONST ? arg : sizes[arg];
            continue;
        }
        if (depth < 2) return -1;
        int64_t b = stack[--depth], a = stack[depth - 1], v;
        switch (op) {
        case OP_ADD: v = a + b; break;
        case OP_SUB: v = a - b; break;
        case OP_MUL: v = a * b; break;
        case OP_MAX: v = a > b ? a : b; break;
        case OP_MIN: v = a < b ? a : b; break;
        case OP_FLOORDIV:
        case OP_MOD: {
            if (b == 0) return -1;
            int64_t q = a / b, m = a % b;
            if (m != 0 && ((m < 0) != (b < 0))) {
                q -= 1;
                m += b;
            }
            v = op == OP_FLOORDIV ? q : m;
            break;
        }
        default: return -1;
        }
        stack[depth - 1] = v;
    }
    if (depth != 1) return -1;
    *out = stack[0];
    return 0;
}

/* The row-major test of torch's is_contiguous(): dimensions of size 1 are skipped and an
 * empty tensor passes. (DLPack exports strides of size-1 dimensions as 1 anyway.) */
static int row_major(const DLTensor *t) {
    int64_t expected = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return 1;
    }
    if (t->strides == NULL) return 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
        expected *= t->shape[d];
    }
    return 1;
}

static int64_t numel(const DLTensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* Bytes from a tensor's first element to the end of its last (0 if empty); torch's strides
 * are never negative. */
static uint64_t extent(const DLTensor *t) {
    int64_t n = numel(t);
    uint64_t item = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7) / 8, last = 0;
    if (n == 0) return 0;
    if (t->strides == NULL) return (uint64_t)n * item; /* row-major */
    for (int d = 0; d < t->ndim; d++) last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->strides[d];
    return (last + 1) * item;
}

/* 0 unless a tensor the kernel writes (a bit of written) shares a byte range with any other:
 * its threads would read or write it in no fixed order. As _runtime.check_disjoint(). */
static int disjoint(DLTensor *const *tensors, Py_ssize_t n_tensors, int64_t written) {
    for (Py_ssize_t i = 0; i < n_tensors; i++) {
        if (!(written >> i & 1)) continue;
        uintptr_t first = (uintptr_t)tensors[i]->data + (uintptr_t)tensors[i]->byte_offset;
        uint64_t size = extent(tensors[i]);
        if (size == 0) continue;
        for (Py_ssize_t j = 0; j < n_tensors; j++) {
            if (j == i) continue;
            uintptr_t other = (uintptr_t)tensors[j]->data + (uintptr_t)tensors[j]->byte_offset;
            uint64_t other_size = extent(tensors[j]);
            if (other_size != 0 && first < other + other_size && other < first + size) return -1;
        }
    }
    return 0;
}

/* The whole comparison; 0 when every tensor matches, -1 when any does not. */
static int matches(const int64_t *words, Py_ssize_t n_words, DLTensor *const *tensors, Py_ssize_t n_tensors,
                   int64_t *sizes, int64_t *n_sizes_out) {
    Reader r = {words, n_words};
    int64_t version, count, n_sizes, align_mask, device_type, written;
    if (next(&r, &version) || version != CONTRACT_VERSION || next(&r, &count) || count != n_tensors ||
        next(&r, &n_sizes) || n_sizes < 0 || n_sizes > MAX_SIZES || next(&r, &align_mask) ||
        next(&r, &device_type) || next(&r, &written))
        return -1;
    *n_sizes_out = n_sizes;
    /* The runtime sizes, read from the tensors' shapes and strides first (the Python launcher
     * reads them the same way), each within its kernel parameter's range. */
    for (int64_t i = 0; i < n_sizes; i++) {
        int64_t slot, kind, dim, limit;
        if (next(&r, &slot) || next(&r, &kind) || next(&r, &dim) || next(&r, &limit)) return -1;
        if (slot < 0 || slot >= n_tensors) return -1;
        const DLTensor *t = tensors[slot];
        if (dim < 0 || dim >= t->ndim || (kind == 1 && t->strides == NULL)) return -1;
        int64_t v = kind == 0 ? t->shape[dim] : t->strides[dim];
        if (v < 0 || (limit > 0 && v >= limit)) return -1;
        sizes[i] = v;
    }
    int device = tensors[0]->device.device_id;
    for (Py_ssize_t i = 0; i < n_tensors; i++) {
        const DLTensor *t = tensors[i];
        int64_t dtype, ndim, layout;
        if (next(&r, &dtype) || next(&r, &ndim) || next(&r, &layout)) return -1;
        uint32_t got = (uint32_t)t->dtype.code | ((uint32_t)t->dtype.bits << 8) | ((uint32_t)t->dtype.lanes << 16);
        if (t->device.device_type != device_type || t->device.device_id != device || (int64_t)got != dtype ||
            t->ndim != ndim)
            return -1;
        for (int d = 0; d < ndim; d++) {
            int64_t want;
            if (eval(&r, sizes, n_sizes, &want) || want != t->shape[d]) return -1;
        }
        if (layout == LAYOUT_ROW_MAJOR) {
            if (!row_major(t)) return -1;
        } else if (layout == LAYOUT_STRIDES) {
            /* As check_strides(): an empty tensor is never indexed, a dimension of size 0 or 1
             * never stepped over; the expressions are still read to stay in step. */
            int skip = numel(t) == 0;
            for (int d = 0; d < ndim; d++) {
                int64_t want;
                if (eval(&r, sizes, n_sizes, &want)) return -1;
                if (!skip && t->shape[d] > 1 && (t->strides == NULL || t->strides[d] != want)) return -1;
            }
        } else if (layout != LAYOUT_ANY) {
            return -1;
        }
        uintptr_t address = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
        if (address & (uintptr_t)align_mask) return -1;
    }
    /* The kernel's requirements on its sizes (a spec's requires: tile multiples it trusts), each two
     * expressions that must be equal. */
    int64_t n_requires;
    if (next(&r, &n_requires) || n_requires < 0) return -1;
    for (int64_t i = 0; i < n_requires; i++) {
        int64_t lhs, rhs;
        if (eval(&r, sizes, n_sizes, &lhs) || eval(&r, sizes, n_sizes, &rhs) || lhs != rhs) return -1;
    }
    if (r.left != 0) return -1;
    return disjoint(tensors, n_tensors, written);
}

/* One tensor read for check(), run() or dispatch(): a DLTensor filled in place by the exchange
 * API (capsule NULL), or one owned by the _to_dlpack capsule (dropped by release()). */
typedef struct {
    DLTensor view;
    PyObject *capsule;
} Exported;

/* Reads objects[positions[k]] (k-th object when positions is NULL) for k < n into exports and
 * tensors; how many were read: fewer than n when one is not a tensor or has a dtype DLPack
 * lacks (the error is left for the caller to clear). Only objects of exactly the exchange
 * API's type go through it (its producer must be the object's own); subclasses such as
 * nn.Parameter take _to_dlpack. */
static PyObject *is_neg_name, *is_conj_name; /* "is_neg", "is_conj", interned once */

/* 1 when a floating-point tensor is a lazily negated or conjugated view (torch._neg_view(x),
 * x.conj().imag): DLPack exports the memory without the bit, so a kernel would read the values
 * un-negated. Integer and boolean tensors never carry the bits. -1 on an error. */
static int lazy_view(PyObject *object, const DLTensor *t) {
    if (t->dtype.code == 0 || t->dtype.code == 1 || t->dtype.code == 6) return 0; /* kDLInt, kDLUInt, kDLBool */
    if (is_neg_name == NULL && (is_neg_name = PyUnicode_InternFromString("is_neg")) == NULL) return -1;
    if (is_conj_name == NULL && (is_conj_name = PyUnicode_InternFromString("is_conj")) == NULL) return -1;
    PyObject *names[2] = {is_neg_name, is_conj_name};
    for (int i = 0; i < (t->dtype.code == 5 ? 2 : 1); i++) { /* only complex tensors (kDLComplex) conjugate */
        PyObject *bit = PyObject_CallMethodObjArgs(object, names[i], NULL);
        if (bit == NULL) return -1;
        int set = bit == Py_True;
        Py_DECREF(bit);
        if (set) return 1;
    }
    return 0;
}

static Py_ssize_t export_tensors(PyObject *const *objects, const Py_ssize_t *positions, Py_ssize_t n,
                                 Exported *exports, DLTensor **tensors) {
    Py_ssize_t held = 0;
    for (; held < n; held++) {
        PyObject *object = objects[positions == NULL ? held : positions[held]];
        Exported *e = &exports[held];
        e->capsule = NULL;
        if (exchange != NULL && (PyObject *)Py_TYPE(object) == exchange_type) {
            if (exchange->dltensor_from_py_object_no_sync(object, &e->view) != 0 || lazy_view(object, &e->view))
                break;
            tensors[held] = &e->view;
            continue;
        }
        e->capsule = PyObject_CallFunctionObjArgs(to_dlpack, object, NULL);
        if (e->capsule == NULL) break;
        DLManagedTensor *managed = PyCapsule_GetPointer(e->capsule, "dltensor");
        if (managed == NULL || lazy_view(object, &managed->dl_tensor)) {
            Py_CLEAR(e->capsule);
            break;
        }
        tensors[held] = &managed->dl_tensor;
    }
    return held;
}

/* The capsules' destructor calls the DLPack deleter, which drops torch's reference; a view
 * holds nothing. */
static void release(Exported *exports, Py_ssize_t held) {
    for (Py_ssize_t i = 0; i < held; i++) Py_XDECREF(exports[i].capsule);
}

static uintptr_t address_of(const DLTensor *t) { return (uintptr_t)t->data + (uintptr_t)t->byte_offset; }

/* check(contract, *tensors) -> (device, *data_pointers, *sizes), or None
 *
 * contract: the bytes _runtime.contract() packed (None: there is none, e.g. a dtype this
 * torch cannot export through DLPack); tensors: the launcher's tensor arguments in prim_func
 * order. None means "not accepted here", never "invalid": the Python checks then decide. */
static PyObject *check(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || args[0] == Py_None || to_dlpack == NULL) Py_RETURN_NONE;
    char *buffer;
    Py_ssize_t length;
    if (PyBytes_AsStringAndSize(args[0], &buffer, &length)) return NULL;
    Py_ssize_t n_tensors = nargs - 1;
    if (n_tensors < 1 || n_tensors > MAX_TENSORS || length % 8) Py_RETURN_NONE;
    Exported exports[MAX_TENSORS];
    DLTensor *tensors[MAX_TENSORS];
    PyObject *result = NULL;
    int64_t sizes[MAX_SIZES], n_sizes = 0;
    Py_ssize_t held = export_tensors(args + 1, NULL, n_tensors, exports, tensors);
    if (held == n_tensors &&
        matches((const int64_t *)buffer, length / 8, tensors, n_tensors, sizes, &n_sizes) == 0) {
        result = PyTuple_New(1 + n_tensors + n_sizes);
        if (result != NULL) {
            PyTuple_SetItem(result, 0, PyLong_FromLong(tensors[0]->device.device_id));
            for (Py_ssize_t i = 0; i < n_tensors; i++)
                PyTuple_SetItem(result, 1 + i, PyLong_FromUnsignedLongLong(address_of(tensors[i])));
            for (int64_t i = 0; i < n_sizes; i++) PyTuple_SetItem(result, 1 + n_tensors + i, PyLong_FromLongLong(sizes[i]));
        }
    }
    release(exports, held);
    if (result == NULL) {
        PyErr_Clear(); /* declined, not failed: the Python checks will name the problem */
        Py_RETURN_NONE;
    }
    return result;
}

/* ---- run(): check, grid, stream and launch in one call ----------------------------------- */

static PyObject *stream_getter; /* torch._C._cuda_getCurrentRawStream, set by set_stream() */


/* Writes an integer run() computed (a pointer or a size) into its slot, within the range of the
 * parameter kind; -1 where it does not fit (the Python path then raises). */
static int pack_computed(char kind, int64_t v, uint64_t *slot) {
    *slot = 0;
    if (kind == 'Q') {
        if (v < 0) return -1;
        *slot = (uint64_t)v;
        return 0;
    }
    return kind == 'q' || kind == 'i' || kind == 'I' ? pack_integer(kind, v, slot) : -1;
}

/* A plan's launch configuration (the Function's block, shared memory and cooperative flag). */
typedef struct {
    int64_t cooperative, smem, block[3];
} Config;

/* The launch after check(): grid from the sizes, handle of the device, arguments, stream,
 * launch. 1: launched (or nothing to launch); 0: declined (no handle yet, a value out of range,
 * another device's context, a driver error: the Python path retries and reports). */
static int launch_planned(Reader *r, PyObject *const *arguments, Py_ssize_t n_arguments, PyObject *handles,
                          DLTensor *const *tensors, Py_ssize_t n_tensors, const int64_t *sizes, int64_t n_sizes) {
    Config c;
    if (next(r, &c.cooperative) || next(r, &c.block[0]) || next(r, &c.block[1]) || next(r, &c.block[2]) ||
        next(r, &c.smem))
        return 0;
    unsigned grid[3];
    int empty = 0;
    for (int d = 0; d < 3; d++) {
        int64_t g;
        /* CUDA's limits (2^31 - 1 blocks in x, 65535 in y and z): beyond them the Python path raises. */
        if (eval(r, sizes, n_sizes, &g) || g < 0 || g > (d == 0 ? (int64_t)INT32_MAX : 65535)) return 0;
        grid[d] = (unsigned)g;
        empty |= g == 0;
    }
    int64_t n_values;
    if (next(r, &n_values) || n_values < 0 || n_values > MAX_ARGS) return 0;
    if (empty) return r->left == 3 * n_values; /* an empty input: nothing to launch, as `if 0 in grid` */
    int device = tensors[0]->device.device_id;
    PyObject *device_object = PyLong_FromLong(device);
    if (device_object == NULL) return 0;
    PyObject *handle = PyDict_GetItem(handles, device_object); /* borrowed; NULL: first launch here */
    void *kernel = handle == NULL ? NULL : PyLong_AsVoidPtr(handle);
    uint64_t slots[MAX_ARGS];
    void *params[MAX_ARGS];
    int ok = kernel != NULL;
    for (int64_t i = 0; ok && i < n_values; i++) {
        int64_t source, index, kind;
        if (next(r, &source) || next(r, &index) || next(r, &kind)) {
            ok = 0;
        } else if (source == FROM_POINTER) {
            ok = index >= 0 && index < n_tensors &&
                 pack_computed((char)kind, (int64_t)address_of(tensors[index]), &slots[i]) == 0;
            params[i] = &slots[i];
        } else if (source == FROM_SIZE) {
            ok = index >= 0 && index < n_sizes && pack_computed((char)kind, sizes[index], &slots[i]) == 0;
            params[i] = &slots[i];
        } else if (source == FROM_ARGUMENT && index >= 0 && index < n_arguments && kind != 'T') {
            ok = pack((char)kind, arguments[index], &slots[i], &params[i], (Py_ssize_t)i) == 0;
        } else {
            ok = 0;
        }
    }
    void *stream = NULL;
    if (ok && r->left == 0 && exchange != NULL && tensors[0]->device.device_type == KDL_CUDA) {
        /* torch's own getCurrentCUDAStream(device), without the Python call and int round trip */
        ok = exchange->current_work_stream(KDL_CUDA, device, &stream) == 0;
    } else if (ok && r->left == 0) {
        PyObject *s = PyObject_CallFunctionObjArgs(stream_getter, device_object, NULL);
        stream = s == NULL ? NULL : PyLong_AsVoidPtr(s);
        ok = s != NULL && !PyErr_Occurred();
        Py_XDECREF(s);
    } else {
        ok = 0;
    }
    Py_DECREF(device_object);
    if (!ok) return 0;
    unsigned block[3] = {(unsigned)c.block[0], (unsigned)c.block[1], (unsigned)c.block[2]};
    /* Another device's context or a launch the driver refused (which never ran): the Python path
     * switches contexts, launches again or reports. */
    return launch_on(device, kernel, grid, block, (unsigned)c.smem, stream, params, (int)c.cooperative) == 0;
}

/* run(contract, plan, handles, *arguments) -> True when launched, else False
 *
 * A launcher's whole fast path in one call: check() of the tensor arguments against the
 * contract, then the grid from the runtime sizes, the kernel arguments in the cubin's order,
 * torch's current stream of the tensors' device and cuLaunchKernel (cuLaunchKernelEx for a
 * cooperative kernel), all as _runtime.plan() packed them. handles: the Function's dict of
 * device -> kernel handle. False never means "invalid", only "not here": the launcher's
 * Python path then checks (naming the argument), loads the kernel on a new device, switches
 * contexts or reports the driver's error. */
/* ---- dispatch(): an op's remembered call signatures, straight to the launch --------------- */


static int64_t item_bytes(const DLTensor *t) { return ((int64_t)t->dtype.bits * t->dtype.lanes + 7) / 8; }

/* 1 when every rule holds over the launcher's tensors (by argument position), else 0. */
static int rules_hold(Reader *r, DLTensor *const *by_argument, Py_ssize_t n_arguments) {
    int64_t n_rules;
    if (next(r, &n_rules) || n_rules < 0) return 0;
    for (int64_t n = 0; n < n_rules; n++) {
        int64_t kind, a, i, b, j, k;
        if (next(r, &kind) || next(r, &a) || next(r, &i) || next(r, &b) || next(r, &j) || next(r, &k)) return 0;
        if (a < 0 || a >= n_arguments || by_argument[a] == NULL || i < 0 || i >= by_argument[a]->ndim) return 0;
        const DLTensor *t = by_argument[a];
        int64_t size = t->shape[i];
        switch (kind) {
        case RULE_SAME_SIZE:
            if (b < 0 || b >= n_arguments || by_argument[b] == NULL || j < 0 || j >= by_argument[b]->ndim ||
                by_argument[b]->shape[j] != size * k)
                return 0;
            break;
        case RULE_SIZE_MULTIPLE:
            if (b <= 0 || size % b != 0) return 0;
            break;
        case RULE_SIZE_IS:
            if (size != b) return 0;
            break;
        case RULE_STRIDE_BYTES:
            if (b <= 0 || (size > 1 && (t->strides == NULL || (t->strides[i] * item_bytes(t)) % b != 0))) return 0;
            break;
        default:
            return 0;
        }
    }
    return r->left == 0;
}

/* run()'s body over an argument array: 1 when checked and launched, 0 when declined. known:
 * DLTensors the caller already exported, by argument position (NULL: export it here), or NULL;
 * rules: dispatch()'s checks beyond the contract, or NULL. */
static int run_arguments(PyObject *contract_bytes, PyObject *plan_bytes, PyObject *handles, PyObject *const *arguments,
                         Py_ssize_t n_arguments, DLTensor *const *known, Reader *rules) {
    char *contract, *plan;
    Py_ssize_t contract_length, plan_length;
    if (!PyDict_Check(handles) || PyBytes_AsStringAndSize(contract_bytes, &contract, &contract_length) ||
        PyBytes_AsStringAndSize(plan_bytes, &plan, &plan_length) || contract_length % 8 || plan_length % 8)
        return 0;
    Reader r = {(const int64_t *)plan, plan_length / 8};
    int64_t version, expected, n_tensors;
    if (next(&r, &version) || version != PLAN_VERSION || next(&r, &expected) || expected != n_arguments ||
        next(&r, &n_tensors) || n_tensors < 1 || n_tensors > MAX_TENSORS)
        return 0;
    Exported exports[MAX_TENSORS];
    DLTensor *tensors[MAX_TENSORS], *by_argument[MAX_ARGS] = {NULL};
    Py_ssize_t held = 0;
    int ok = n_arguments <= MAX_ARGS;
    for (int64_t i = 0; ok && i < n_tensors; i++) {
        int64_t position;
        if (next(&r, &position) || position < 0 || position >= n_arguments) {
            ok = 0;
        } else if (known != NULL && known[position] != NULL) {
            tensors[i] = known[position];
        } else {
            Py_ssize_t one = (Py_ssize_t)position;
            ok = export_tensors(arguments, &one, 1, &exports[held], &tensors[i]) == 1;
            held += ok;
        }
        if (ok) by_argument[position] = tensors[i];
    }
    int64_t sizes[MAX_SIZES], n_sizes = 0;
    int launched = ok && matches((const int64_t *)contract, contract_length / 8, tensors, n_tensors, sizes,
                                 &n_sizes) == 0 &&
                   (rules == NULL || rules_hold(rules, by_argument, n_arguments)) &&
                   launch_planned(&r, arguments, n_arguments, handles, tensors, n_tensors, sizes, n_sizes);
    release(exports, held);
    return launched;
}

/* run(contract, plan, handles, *arguments) -> True when launched, else False
 *
 * A launcher's whole fast path in one call: check() of the tensor arguments against the
 * contract, then the grid from the runtime sizes, the kernel arguments in the cubin's order,
 * torch's current stream of the tensors' device and cuLaunchKernel (cuLaunchKernelEx for a
 * cooperative kernel), all as _runtime.plan() packed them. handles: the Function's dict of
 * device -> kernel handle. False never means "invalid", only "not here": the launcher's
 * Python path then checks (naming the argument), loads the kernel on a new device, switches
 * contexts or reports the driver's error. */
static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || args[0] == Py_None || args[1] == Py_None || to_dlpack == NULL || stream_getter == NULL ||
        cu_launch_kernel == NULL || cu_launch_kernel_ex == NULL)
        Py_RETURN_FALSE;
    int launched = run_arguments(args[0], args[1], args[2], args + 3, nargs - 3, NULL, NULL);
    PyErr_Clear(); /* declined, not failed: the Python path will name the problem */
    if (launched) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* The key of a call is a bytes object of 64-bit words (not a tuple: bytes are not tracked by
 * the garbage collector, so dispatch() allocates nothing that can trigger a collection, and one
 * memcmp compares it). Per option a tag, then its value: the tag holds the exact type, because
 * 128 and 128.0, 1 and True compare equal in Python while the op's checks refuse the float and
 * the bool, so a hit must never stand in for them. */
#define KEY_WORDS 512

typedef struct {
    int64_t words[KEY_WORDS];
    Py_ssize_t n;
} Key;

static int key_put(Key *k, int64_t word) {
    if (k->n >= KEY_WORDS) return -1;
    k->words[k->n++] = word;
    return 0;
}

static int key_int(Key *k, PyObject *o) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) return -1;
    return key_put(k, v);
}

/* Writes one option; -1 for an option of any other type (not keyed: the op's Python path runs). */
static int key_option(Key *k, PyObject *o) {
    if (o == Py_None) return key_put(k, OPTION_NONE);
    if (PyBool_Check(o)) return key_put(k, o == Py_True ? OPTION_TRUE : OPTION_FALSE);
    if (PyLong_CheckExact(o)) return key_put(k, OPTION_INT) || key_int(k, o);
    if (PyFloat_CheckExact(o)) {
        double v = PyFloat_AsDouble(o);
        int64_t bits;
        memcpy(&bits, &v, sizeof bits);
        return key_put(k, OPTION_FLOAT) || key_put(k, bits);
    }
    if (PyUnicode_CheckExact(o)) {
        Py_ssize_t length;
        const char *text = PyUnicode_AsUTF8AndSize(o, &length); /* cached by the str: no copy */
        Py_ssize_t words = (length + 7) / 8;
        if (text == NULL || key_put(k, OPTION_STR) || key_put(k, length) || k->n + words > KEY_WORDS) return -1;
        if (words > 0) k->words[k->n + words - 1] = 0; /* the padding of the last word */
        memcpy(&k->words[k->n], text, (size_t)length);
        k->n += words;
        return 0;
    }
    if (PyTuple_CheckExact(o)) {
        Py_ssize_t length = PyTuple_Size(o);
        if (key_put(k, OPTION_TUPLE) || key_put(k, length)) return -1;
        for (Py_ssize_t i = 0; i < length; i++) {
            PyObject *item = PyTuple_GetItem(o, i);
            if (!PyLong_CheckExact(item) || key_int(k, item)) return -1;
        }
        return 0;
    }
    return -1;
}

/* The key of a call (inputs, out, *options) under a fast path's spec, or NULL (declined; an error
 * may be set). The inputs are read into exports / inputs (the caller releases *held of
 * them; by input position, NULL for a None input). Key: per input its DLPack dtype, ndim and the
 * dimensions its spec mask names (0 for an absent input), per option its tag and value, then
 * the first input's device and whether out is None. */
static PyObject *call_key(const int64_t *spec, Py_ssize_t n_spec, PyObject *const *call, Py_ssize_t n_call,
                          Exported *exports, Py_ssize_t *held, DLTensor **inputs) {
    Reader r = {spec, n_spec};
    int64_t version, n_inputs, arity, mask;
    *held = 0;
    if (next(&r, &version) || version != FAST_VERSION || next(&r, &n_inputs) || n_inputs < 1 ||
        n_inputs > MAX_TENSORS || next(&r, &arity) || n_call < n_inputs + 1)
        return NULL;
    Key k;
    k.n = 0;
    int device = -1;
    for (int64_t i = 0; i < n_inputs; i++) {
        inputs[i] = NULL;
        if (next(&r, &mask)) return NULL;
        if (call[i] == Py_None) {
            if (key_put(&k, 0)) return NULL; /* a dtype word is never 0: lanes >= 1 */
            continue;
        }
        if (export_tensors(call, (const Py_ssize_t[]){(Py_ssize_t)i}, 1, &exports[*held], &inputs[i]) != 1)
            return NULL;
        *held += 1;
        const DLTensor *t = inputs[i];
        if (device < 0) device = t->device.device_id;
        uint32_t dtype = (uint32_t)t->dtype.code | ((uint32_t)t->dtype.bits << 8) | ((uint32_t)t->dtype.lanes << 16);
        if (key_put(&k, dtype) || key_put(&k, t->ndim)) return NULL;
        for (int d = 0; d < t->ndim && d < 63; d++) {
            if ((mask >> d & 1) && key_put(&k, t->shape[d])) return NULL;
        }
    }
    if (device < 0 || r.left != 0) return NULL;
    for (Py_ssize_t i = n_inputs + 1; i < n_call; i++) {
        if (key_option(&k, call[i])) return NULL;
    }
    /* An allocating call (out None) is its own signature: its entry also says what to allocate. */
    if (key_put(&k, device) || key_put(&k, call[n_inputs] == Py_None)) return NULL;
    return PyBytes_FromStringAndSize((const char *)k.words, k.n * (Py_ssize_t)sizeof(int64_t));
}

/* out's tensor at index under the spec's arity: out itself (arity 1) or an item of a tuple or
 * list of exactly arity items; NULL (borrowed) otherwise. */
static PyObject *out_item(PyObject *out, int64_t arity, int64_t index) {
    if (arity == 1) return index == 0 ? out : NULL;
    if (PyTuple_CheckExact(out) && PyTuple_Size(out) == arity && index < arity) return PyTuple_GetItem(out, index);
    if (PyList_CheckExact(out) && PyList_Size(out) == arity && index < arity) return PyList_GetItem(out, index);
    return NULL;
}

static PyObject *allocator; /* torch.empty, set by set_allocator() */

/* The outputs of an allocating call: torch.empty(*dims, dtype=..., device=...) per output, the
 * dims from the inputs' shapes as the entry's words say (per output its ndim, per dimension
 * (input, dim, times, plus, per): (shape[dim] of input * times + plus) // per, or plus where
 * input is -1); kwargs: per output the dict of its dtype and device. out itself (arity 1) or a
 * tuple, as the op returns them; NULL where the words do not fit the call (an error may be set). */
static PyObject *allocate(PyObject *shape_bytes, PyObject *kwargs, DLTensor *const *inputs, Py_ssize_t n_inputs,
                          int64_t arity) {
    char *buffer;
    Py_ssize_t length;
    if (allocator == NULL || !PyTuple_Check(kwargs) || PyTuple_Size(kwargs) != arity ||
        PyBytes_AsStringAndSize(shape_bytes, &buffer, &length) || length % 8)
        return NULL;
    Reader r = {(const int64_t *)buffer, length / 8};
    PyObject *outputs = PyTuple_New(arity);
    if (outputs == NULL) return NULL;
    for (int64_t o = 0; o < arity; o++) {
        int64_t ndim;
        if (next(&r, &ndim) || ndim < 1 || ndim > 8) goto fail;
        PyObject *dims = PyTuple_New(ndim);
        if (dims == NULL) goto fail;
        for (int64_t d = 0; d < ndim; d++) {
            int64_t input, dim, times, plus, per, size;
            if (next(&r, &input) || next(&r, &dim) || next(&r, &times) || next(&r, &plus) || next(&r, &per) ||
                per < 1 || input < -1 || input >= n_inputs || (input >= 0 && inputs[input] == NULL) ||
                (input >= 0 && (dim < 0 || dim >= inputs[input]->ndim))) {
                Py_DECREF(dims);
                goto fail;
            }
            size = input < 0 ? plus : (inputs[input]->shape[dim] * times + plus) / per;
            PyObject *item = size < 0 ? NULL : PyLong_FromLongLong(size);
            if (item == NULL) {
                Py_DECREF(dims);
                goto fail;
            }
            PyTuple_SetItem(dims, d, item);
        }
        PyObject *tensor = PyObject_Call(allocator, dims, PyTuple_GetItem(kwargs, o));
        Py_DECREF(dims);
        if (tensor == NULL) goto fail;
        PyTuple_SetItem(outputs, o, tensor);
    }
    if (r.left != 0) goto fail;
    if (arity == 1) {
        PyObject *only = PyTuple_GetItem(outputs, 0);
        Py_INCREF(only);
        Py_DECREF(outputs);
        return only;
    }
    return outputs;
fail:
    Py_DECREF(outputs); /* unfilled items are NULL, which the tuple's deallocation skips */
    return NULL;
}

/* dispatch(fast, *inputs, out, *options) -> what the op returns (out, as a tuple where it holds
 * several tensors), or None
 *
 * An op's hot path for a call signature it has seen: fast is (spec, table) from
 * _runtime.fast_path(); the table maps the key of a call the op's full checks passed to what the
 * launch needs (the launcher's contract, plan and handles, the recipe of its arguments and
 * the op's rules beyond the contract, the constants). One lookup, then run()'s check and launch
 * with the rules in between. None never means "invalid", only "not here": the op's Python path
 * then runs (and names what is wrong). An allocating call (out None) is taken where the op
 * remembered one of its signature with the outputs' shapes: dispatch() allocates them with
 * torch.empty and returns them. */
static PyObject *dispatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) != 2 || to_dlpack == NULL ||
        stream_getter == NULL || cu_launch_kernel == NULL || cu_launch_kernel_ex == NULL)
        Py_RETURN_NONE;
    PyObject *spec_bytes = PyTuple_GetItem(args[0], 0), *table = PyTuple_GetItem(args[0], 1);
    char *spec;
    Py_ssize_t spec_length;
    if (!PyDict_Check(table) || PyBytes_AsStringAndSize(spec_bytes, &spec, &spec_length) || spec_length % 8 ||
        spec_length < 24) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const int64_t *words = (const int64_t *)spec;
    PyObject *const *call = args + 1;
    Py_ssize_t n_call = nargs - 1, n_inputs = (Py_ssize_t)words[1];
    int64_t arity = words[2];
    if (n_inputs < 1 || n_call <= n_inputs || arity < 1) Py_RETURN_NONE;
    PyObject *out = call[n_inputs], *result = NULL, *allocated = NULL;
    Exported exports[MAX_TENSORS];
    DLTensor *inputs[MAX_TENSORS];
    Py_ssize_t held = 0;
    PyObject *key = call_key(words, spec_length / 8, call, n_call, exports, &held, inputs);
    PyObject *entry = key == NULL ? NULL : PyDict_GetItemWithError(table, key); /* borrowed */
    Py_XDECREF(key);
    char *recipe;
    Py_ssize_t recipe_length;
    /* An entry of an out= call: (contract, plan, handles, recipe, constants); of an allocating
     * call also (output shapes, output kwargs), and out is what allocate() returns. */
    int found = entry != NULL && PyTuple_Check(entry) && PyTuple_Size(entry) == (out == Py_None ? 7 : 5);
    if (found && out == Py_None) {
        allocated = allocate(PyTuple_GetItem(entry, 5), PyTuple_GetItem(entry, 6), inputs, n_inputs, arity);
        out = allocated;
    }
    if (found && out != NULL &&
        PyBytes_AsStringAndSize(PyTuple_GetItem(entry, 3), &recipe, &recipe_length) == 0 && recipe_length % 8 == 0) {
        PyObject *constants = PyTuple_GetItem(entry, 4);
        Reader r = {(const int64_t *)recipe, recipe_length / 8};
        int64_t n_arguments = 0;
        PyObject *arguments[MAX_ARGS];
        DLTensor *known[MAX_ARGS];
        int ok = next(&r, &n_arguments) == 0 && n_arguments >= 0 && n_arguments <= MAX_ARGS &&
                 PyTuple_Check(constants);
        for (int64_t i = 0; ok && i < n_arguments; i++) {
            int64_t source, index;
            known[i] = NULL;
            if (next(&r, &source) || next(&r, &index) || index < 0) {
                ok = 0;
            } else if (source == FROM_INPUT) {
                ok = index < n_inputs && call[index] != Py_None;
                if (ok) {
                    arguments[i] = call[index];
                    known[i] = inputs[index];
                }
            } else if (source == FROM_OUT) {
                arguments[i] = out_item(out, arity, index);
                ok = arguments[i] != NULL;
            } else if (source == FROM_CONSTANT) {
                ok = index < PyTuple_Size(constants);
                if (ok) arguments[i] = PyTuple_GetItem(constants, index);
            } else {
                ok = 0;
            }
        }
        if (ok && run_arguments(PyTuple_GetItem(entry, 0), PyTuple_GetItem(entry, 1), PyTuple_GetItem(entry, 2),
                                arguments, (Py_ssize_t)n_arguments, known, &r)) {
            if (arity == 1 || PyTuple_CheckExact(out)) {
                Py_INCREF(out);
                result = out;
            } else {
                result = PyList_AsTuple(out);
            }
        }
    }
    release(exports, held);
    Py_XDECREF(allocated); /* result holds its own reference */
    if (result != NULL) return result;
    PyErr_Clear(); /* declined, not failed: the op's Python path will name the problem */
    Py_RETURN_NONE;
}

/* dispatch_key(spec, *inputs, out, *options) -> the key dispatch() looks such a call up by, or None
 * where it never would (an option of another type, an input that is not a tensor). */
static PyObject *dispatch_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    char *spec;
    Py_ssize_t spec_length;
    if (nargs < 1 || PyBytes_AsStringAndSize(args[0], &spec, &spec_length)) return NULL;
    if (to_dlpack == NULL || spec_length % 8) Py_RETURN_NONE;
    Exported exports[MAX_TENSORS];
    DLTensor *inputs[MAX_TENSORS];
    Py_ssize_t held = 0;
    PyObject *key = call_key((const int64_t *)spec, spec_length / 8, args + 1, nargs - 1, exports, &held, inputs);
    release(exports, held);
    if (key != NULL) return key;
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* Keeps the callable of a set_...() call in *slot; usage: the error's text otherwise. */
static PyObject *keep_callable(PyObject **slot, PyObject *const *args, Py_ssize_t nargs, const char *usage) {
    if (nargs != 1 || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_XDECREF(*slot);
    Py_INCREF(args[0]);
    *slot = args[0];
    Py_RETURN_NONE;
}

/* set_stream(torch._C._cuda_getCurrentRawStream): the stream getter run() calls with the device. */
static PyObject *set_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return keep_callable(&stream_getter, args, nargs, "set_stream(torch._C._cuda_getCurrentRawStream)");
}

/* set_dlpack(torch._C._to_dlpack): the export check() calls once per tensor. */
static PyObject *set_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return keep_callable(&to_dlpack, args, nargs, "set_dlpack(torch._C._to_dlpack)");
}

/* set_exchange(type, api) -> True when run(), check() and dispatch() now read objects of
 * exactly this type through api (Tensor.__dlpack_c_exchange_api__: a capsule named
 * "dlpack_exchange_api", or its address as an int), False when api is not one this module
 * can use (another DLPack major version, an entry missing: _to_dlpack stays).
 * set_exchange(None, None) goes back to _to_dlpack. */
static PyObject *set_exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_exchange(torch.Tensor, torch.Tensor.__dlpack_c_exchange_api__)");
        return NULL;
    }
    const DLPackExchangeAPI *api = NULL;
    if (args[1] != Py_None) {
        if (PyCapsule_CheckExact(args[1])) {
            api = PyCapsule_GetPointer(args[1], "dlpack_exchange_api");
        } else if (PyLong_Check(args[1])) {
            api = PyLong_AsVoidPtr(args[1]);
        }
        if (api == NULL) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        if (!PyType_Check(args[0]) || api->version.major != 1 || api->version.minor < 2 ||
            api->dltensor_from_py_object_no_sync == NULL || api->current_work_stream == NULL)
            Py_RETURN_FALSE;
    }
    exchange = NULL;
    Py_CLEAR(exchange_type);
    if (api == NULL) Py_RETURN_FALSE;
    Py_INCREF(args[0]);
    exchange_type = args[0];
    exchange = api;
    Py_RETURN_TRUE;
}

/* set_allocator(torch.empty): what dispatch() allocates the outputs of an allocating call with. */
static PyObject *set_allocator(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return keep_callable(&allocator, args, nargs, "set_allocator(torch.empty)");
}

/* dlpack_dtype(tensor) -> code | bits << 8 | lanes << 16 of the tensor's DLTensor, read as
 * check() reads tensors: how this torch spells a dtype in DLPack (float8 codes changed between
 * DLPack versions), asked once per dtype for the contracts. */
static PyObject *dlpack_dtype(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || to_dlpack == NULL) {
        PyErr_SetString(PyExc_TypeError, "dlpack_dtype(tensor), after set_dlpack()");
        return NULL;
    }
    Exported exported;
    DLTensor *t;
    if (export_tensors(args, NULL, 1, &exported, &t) != 1) return NULL;
    DLDataType d = t->dtype;
    release(&exported, 1);
    return PyLong_FromUnsignedLong((unsigned long)d.code | ((unsigned long)d.bits << 8) | ((unsigned long)d.lanes << 16));
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(cuLaunchKernel, cuCtxGetDevice, cuLaunchKernelEx addresses): the driver entry points launch() calls."},
    {"launch_cooperative", (PyCFunction)(void (*)(void))launch_cooperative, METH_FASTCALL,
     "launch_cooperative(kernel, device, grid, block, shared_bytes, stream, kinds, *values): launch() of a kernel "
     "with a grid-wide barrier (cuLaunchKernelEx, cooperative attribute)."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(kernel, device, grid, block, shared_bytes, stream, kinds, *values) -> CUresult, or -1 when "
     "the current context is another device's."},
    {"check", (PyCFunction)(void (*)(void))check, METH_FASTCALL,
     "check(contract, *tensors) -> (device, *data_pointers, *sizes), or None where the Python checks must decide."},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(contract, plan, handles, *arguments) -> True when checked and launched, False where the Python path must "
     "decide."},
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL,
     "dispatch(fast, *inputs, out, *options) -> the op's result when a remembered call signature was checked and "
     "launched, None where the op's Python path must decide."},
    {"dispatch_key", (PyCFunction)(void (*)(void))dispatch_key, METH_FASTCALL,
     "dispatch_key(spec, *inputs, out, *options) -> the key dispatch() looks the call up by, or None."},
    {"set_stream", (PyCFunction)(void (*)(void))set_stream, METH_FASTCALL,
     "set_stream(torch._C._cuda_getCurrentRawStream): the stream getter run() calls with the device index."},
    {"set_dlpack", (PyCFunction)(void (*)(void))set_dlpack, METH_FASTCALL,
     "set_dlpack(torch._C._to_dlpack): the DLPack export check() reads tensors through."},
    {"set_allocator", (PyCFunction)(void (*)(void))set_allocator, METH_FASTCALL,
     "set_allocator(torch.empty): what dispatch() allocates the outputs of an allocating call with."},
    {"set_exchange", (PyCFunction)(void (*)(void))set_exchange, METH_FASTCALL,
     "set_exchange(type, api) -> True when tensors of exactly type are read through DLPack's C exchange API "
     "(api: type.__dlpack_c_exchange_api__); set_exchange(None, None) goes back to set_dlpack()'s export."},
    {"dlpack_dtype", (PyCFunction)(void (*)(void))dlpack_dtype, METH_FASTCALL,
     "dlpack_dtype(tensor) -> the packed DLPack dtype (code | bits << 8 | lanes << 16) of the tensor, read as "
     "check() reads it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", "cuLaunchKernel in one C call, and the tensor checks before it.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
